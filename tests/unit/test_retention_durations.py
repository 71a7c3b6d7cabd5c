"""``runs prune --older-than``: what a duration is (registry.retention.parse_duration)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from feiqiu_etl.registry.retention import parse_duration


@pytest.mark.parametrize("text, expected", [
    ("90d", timedelta(days=90)), ("12h", timedelta(hours=12)), ("30m", timedelta(minutes=30)),
    ("45s", timedelta(seconds=45)), ("2w", timedelta(days=14)), (" 1.5D ", timedelta(hours=36)),
])
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["90", "ninety days", "0d", "-5d", "12x", "", "d", "1d2h", "1e3d", "9999999d",
                                  "\uff19\uff10d", "\u0669\u0660d"])  # full-width 90d, Arabic-Indic 90d: ASCII only
def test_bad_durations_say_why_in_one_line(text):
    with pytest.raises(ValueError) as err:
        parse_duration(text)
    message = str(err.value)
    assert "\n" not in message and ("duration" in message)
