"""Issue 18 item 7: the days of ``state reset --from/--to`` and ``run --backfill`` as a half-open window, and
what ``run --backfill`` accepts (pure: no database, no request)."""

from __future__ import annotations

from datetime import datetime

import pytest

from feiqiu_etl.config import ConfigError
from feiqiu_etl.connector.windows import day_range
from feiqiu_etl.plan import RunOptions
from feiqiu_etl.plan.inputs import backfill_window, prepare


def test_days_are_whole_and_the_last_is_included():
    assert day_range("2024-03-01", "2024-03-01") == (datetime(2024, 3, 1), datetime(2024, 3, 2))
    assert day_range("2024-02-28", "2024-02-29") == (datetime(2024, 2, 28), datetime(2024, 3, 1))
    assert day_range(None, "2024-03-01") == (None, datetime(2024, 3, 2))
    assert day_range("2024-03-01", None) == (datetime(2024, 3, 1), None)
    assert day_range(None, None) == (None, None)


@pytest.mark.parametrize("first, last, message", [
    ("2024-03-02", "2024-03-01", "--from 2024-03-02 is after --to 2024-03-01"),
    ("2023-02-29", None, "--from: day 29 is not in 2023-02 (01..28), in '2023-02-29'"),
    (None, "2024-03-01 12:00:00", "--to: expected a date"),
    ("1999-12-31", None, "--from: 1999-12-31 is before 2000-01-01"),
    ("2024-03-01", "9999-12-31", "--to: 9999-12-31 is after 2099-12-31"),  # + 1 day overflowed (OverflowError)
    ("9999-12-31", None, "--from: 9999-12-31 is after 2099-12-31"),
])
def test_bad_days_are_one_line_naming_the_flag(first, last, message):
    with pytest.raises(ValueError) as caught:
        day_range(first, last)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_last_day_allowed_is_a_window_and_a_far_future_backfill_is_a_config_error():
    assert day_range("2099-12-31", "2099-12-31") == (datetime(2099, 12, 31), datetime(2100, 1, 1))
    options = RunOptions(token="t", api_base="http://127.0.0.1:1", site_ids=[1], backfill=True,
                         backfill_from="2024-03-01", backfill_to="9999-12-31", load_dwd=False, environ={})
    with pytest.raises(ConfigError, match="--to: 9999-12-31 is after 2099-12-31"):
        prepare(options)


def test_backfill_is_an_explicit_window_of_the_windowed_tasks_only():
    options = RunOptions(token="t", api_base="http://127.0.0.1:1", site_ids=[1], backfill=True,
                         backfill_from="2024-03-01", backfill_to="2024-03-02", load_dwd=False, environ={})
    assert backfill_window(options) == ("2024-03-01 00:00:00", "2024-03-03 00:00:00")
    inputs = prepare(options)
    assert inputs.windows.explicit is not None
    assert (inputs.windows.explicit.start, inputs.windows.explicit.end) == (datetime(2024, 3, 1), datetime(2024, 3, 3))
    codes = {s.code for s in inputs.lanes[0].specs}
    assert "ODS_PAYMENT" in codes and "ODS_MEMBER" not in codes
    assert all(s.kind == "windowed" for s in inputs.lanes[0].specs)


@pytest.mark.parametrize("extra, message", [
    ({"backfill": False}, "--from/--to go with --backfill"),
    ({"window_start": "2024-03-01 00:00:00", "window_end": "2024-03-02 00:00:00"}, "not --window-start"),
    ({"backfill_to": None}, "needs --from DATE and --to DATE"),
    ({"dwd_only": True, "load_dwd": True}, "--dwd-only sends no request"),
    ({"task_codes": ["ODS_MEMBER"]}, "none of the selected tasks has windows"),
])
def test_backfill_refuses_what_does_not_fit(extra, message):
    fields = dict(token="t", api_base="http://127.0.0.1:1", site_ids=[1], backfill=True,
                  backfill_from="2024-03-01", backfill_to="2024-03-02", load_dwd=False, environ={})
    with pytest.raises(ConfigError) as caught:
        prepare(RunOptions(**{**fields, **extra}))
    assert message in str(caught.value)
