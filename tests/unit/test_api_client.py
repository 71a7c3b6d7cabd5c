"""APIClient unit tests over httpx.MockTransport (the HTTP library's own test transport) and a fake clock."""

from __future__ import annotations

import json

import httpx
import pytest

from feiqiu_etl.api import (
    APIClient, AuthError, BusinessError, ConfigurationError, NotFoundError, RateLimitedError, RetryPolicy,
    ServerError,
)
from feiqiu_etl.api.errors import MalformedResponse
from feiqiu_etl.api.client import parse_retry_after
from feiqiu_etl.connector import load_connector
from feiqiu_etl.pipeline import FakeClock, PipelineRequest, RateLimiter, RequestScheduler
from feiqiu_etl.runner.flow_runner import envelope_rules

TOKEN = "fq_secret_token_value"
RULES = envelope_rules(load_connector())


def envelope(code=0, data=None, msg="ok"):
    return httpx.Response(200, json={"code": code, "msg": msg, "data": data})


def client_for(responses, attempts=3, base=1.0):
    seen = []

    def handler(request: httpx.Request):
        seen.append(request)
        r = responses.pop(0)
        return r() if callable(r) else r

    client = APIClient("http://upstream.test", TOKEN, retry=RetryPolicy(attempts=attempts, base=base, jitter=0),
                       rules=RULES, transport=httpx.MockTransport(handler))
    return client, seen


def fetch(client, clock=None, limiter=None):
    clock = clock or FakeClock()
    lane = RequestScheduler(clock)
    limiter = limiter or RateLimiter(0, 0)
    req = PipelineRequest("/api/x/list", {"siteId": 1, "page": 1})
    return client.fetch(req, lambda fn, min_wait=0.0: lane.send(fn, limiter, None, min_wait=min_wait)), clock


def test_big_ids_survive_exactly_and_token_is_sent_as_bearer():
    raw = b'{"code":0,"msg":"ok","data":{"total":1,"list":[{"settleId":1872950412356812801}]}}'
    client, seen = client_for([httpx.Response(200, content=raw)])
    out, _ = fetch(client)
    assert out["data"]["list"][0]["settleId"] == 1872950412356812801
    assert seen[0].headers["authorization"] == f"Bearer {TOKEN}"
    assert json.loads(seen[0].content) == {"siteId": 1, "page": 1}
    assert TOKEN not in repr(client)


def test_retry_after_is_a_minimum_and_waited_in_the_lane():
    client, seen = client_for([
        envelope(42901, {"retryAfter": 7}, "请求过于频繁"),
        httpx.Response(429, headers={"Retry-After": "3"}),
        envelope(0, {"list": []}),
    ], base=0.5)
    out, clock = fetch(client)
    assert out["code"] == 0 and len(seen) == 3
    # first attempt immediate; then >= 7 s (hint beats the 0.5 s backoff); then >= 3 s
    assert clock.waits[0] >= 7 and clock.waits[1] >= 3


def test_server_errors_retry_with_backoff_then_raise():
    client, seen = client_for([httpx.Response(502, text="<html>bad gateway</html>")] * 3, base=2)
    with pytest.raises(ServerError) as info:
        fetch(client)
    assert len(seen) == 3 and info.value.http_status == 502
    assert TOKEN not in str(info.value)


def test_business_codes_map_to_typed_errors_without_retry():
    for code, exc in [(40101, AuthError), (40401, NotFoundError), (40002, BusinessError)]:
        client, seen = client_for([envelope(code, None, "x")])
        with pytest.raises(exc):
            fetch(client)
        assert len(seen) == 1


def test_404_is_a_configuration_error_and_50001_retries():
    client, _ = client_for([httpx.Response(404, text="<html>nope</html>")])
    with pytest.raises(ConfigurationError):
        fetch(client)
    client, seen = client_for([envelope(50001, None, "系统繁忙"), envelope(0, {})])
    out, _ = fetch(client)
    assert out["code"] == 0 and len(seen) == 2


def test_boolean_code_is_not_an_envelope():
    client, seen = client_for([httpx.Response(200, json={"code": False, "data": {}}), envelope(0, {})])
    fetch(client)
    assert len(seen) == 2


def test_non_envelope_200_is_retried_as_malformed():
    client, seen = client_for([httpx.Response(200, text="<html>gateway</html>"), envelope(0, {})])
    fetch(client)
    assert len(seen) == 2


def test_too_deeply_nested_body_is_retried_as_malformed():
    deep = b'{"code":0,"msg":"ok","data":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    client, seen = client_for([httpx.Response(200, content=deep), envelope(0, {"list": []})])
    out, _ = fetch(client)
    assert len(seen) == 2 and out["data"] == {"list": []}
    client, seen = client_for([httpx.Response(200, content=deep)] * 2, attempts=2)
    with pytest.raises(MalformedResponse, match="nested too deeply"):
        fetch(client)


def test_rate_limited_after_all_attempts_raises():
    client, seen = client_for([envelope(42902, {"retryAfter": 1})] * 2, attempts=2)
    with pytest.raises(RateLimitedError):
        fetch(client)


@pytest.mark.parametrize("value,expected", [("5", 5.0), ("0", None), ("", None), ("soon", None),
                                            ("Wed, 21 Oct 2015 07:28:00 GMT", None)])
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value) == expected


def test_retry_after_http_date_in_future():
    assert 9 < parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) <= 10


def test_absurd_retry_hints_are_capped():
    from feiqiu_etl.api.client import MAX_HINT

    assert parse_retry_after("99999999999999999999") == MAX_HINT
    client, seen = client_for([envelope(42901, {"retryAfter": 1e308}), envelope(0, {})])
    _, clock = fetch(client)
    assert MAX_HINT <= clock.waits[0] <= MAX_HINT * 1.1
