"""The one rule for an API token (feiqiu_etl.api.tokens): a token that cannot travel in an HTTP header is refused
as bad config, naming where it came from and never the token (adversarial trial: a quoted two-line .env value ran
and failed as "not one request succeeded", exit 4, blaming the upstream)."""

import pytest

from feiqiu_etl.api.tokens import token_problem
from feiqiu_etl.plan.fleet import FleetError, FleetModel, resolve_tokens


@pytest.mark.parametrize("token", ["fq_test_token", "abc.DEF-123_~+/=", "x" * 400])
def test_tokens_that_can_be_sent_pass(token):
    assert token_problem(token) is None


@pytest.mark.parametrize("token, words", [("fq_test\nX-Evil: 1", "line break"), ("fq\rtoken", "line break"),
                                          ("fq token", "whitespace"), ("fq\ttoken", "whitespace"),
                                          ("fq\x00token", "control character"), ("fq\x1b[2Jtoken", "control"),
                                          ("fq\x7ftoken", "control character"), ("fqｔoken", "non-ASCII")])
def test_tokens_that_cannot_be_sent_are_named_not_shown(token, words):
    problem = token_problem(token)
    assert problem and words in problem and token not in problem


def test_a_fleet_lane_whose_token_cannot_be_sent_is_a_fleet_error_naming_the_variable():
    fleet = FleetModel.model_validate({"lanes": [{"name": "north", "token_env": "FQ_NORTH",
                                                  "stores": [{"site_id": 1}]}]})
    assert resolve_tokens(fleet, {"FQ_NORTH": "  good  "}, "fleet.yaml") == {"north": "good"}
    with pytest.raises(FleetError) as info:
        resolve_tokens(fleet, {"FQ_NORTH": "secret-part\nX-Evil: 1"}, "fleet.yaml")
    message = str(info.value)
    assert "FQ_NORTH" in message and "line break" in message and "secret-part" not in message
    assert "\n" not in message
