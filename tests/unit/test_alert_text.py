"""The text of a STALE alert: times in the display zone without microseconds (formats.when), ages in minutes
under an hour (a fresh-user trial saw ``2026-12-02T06:46:51.641598+08:00 (0.0 h ago)`` whatever
display.timezone said)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from feiqiu_etl.alerts import rules
from feiqiu_etl.alerts.messages import run_message
from feiqiu_etl.formats import use_display_zone


@pytest.fixture
def utc_display():
    use_display_zone("UTC")
    yield
    use_display_zone("local")


def _message(until, age_seconds, language="en"):
    found = rules.stale_findings("feiqiu", [{"site_id": 1, "task": "ODS_PAYMENT", "stale": True,
                                              "fresh_until": until, "age_seconds": age_seconds}], 0.1)
    return run_message(found, None, language=language).body


def test_a_stale_row_shows_the_display_zone_without_microseconds_and_minutes_under_an_hour(utc_display):
    until = datetime.fromisoformat("2026-12-02T06:46:51.641598+08:00")
    body = _message(until, 12 * 60 + 5)
    assert "1 ODS_PAYMENT: loaded up to 2026-12-01 22:46:51 +00:00 (12 min ago)" in body, body
    assert ".641598" not in body and "+08:00" not in body
    assert "(26.5 h ago)" in _message(until, 26.5 * 3600)
    assert "（12 分钟前）" in _message(until, 12 * 60, language="zh")


def test_a_stale_row_read_back_as_text_is_shown_the_same(utc_display):
    body = _message(datetime(2026, 12, 1, 22, 46, 51, 641598, tzinfo=timezone.utc).isoformat(), 30)
    assert "loaded up to 2026-12-01 22:46:51 +00:00 (0 min ago)" in body, body
