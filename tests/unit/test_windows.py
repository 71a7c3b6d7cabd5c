from datetime import datetime, timedelta

import pytest
from hypothesis import given, strategies as st

from feiqiu_etl.connector.windows import Window, merge, parse_local, plan_incremental, split, subtract

T0 = datetime(2024, 3, 1)


def test_split_is_contiguous_half_open_and_bounded():
    w = Window(T0, T0 + timedelta(days=70, hours=5))
    parts = split(w, timedelta(days=31))
    assert parts[0].start == w.start and parts[-1].end == w.end
    assert all(a.end == b.start for a, b in zip(parts, parts[1:]))
    assert all(p.length <= timedelta(days=31) for p in parts)
    assert parts[0].length == timedelta(days=31)  # exactly 31 days is allowed (upstream-api §1.2)


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50)), max_size=8), st.integers(0, 100), st.integers(1, 150))
def test_subtract_leaves_exactly_the_uncovered_hours(done_raw, start, length):
    target = Window(T0 + timedelta(hours=start), T0 + timedelta(hours=start + length))
    done = [Window(T0 + timedelta(hours=a), T0 + timedelta(hours=a + b)) for a, b in done_raw]
    gaps = subtract(target, done)
    for h in range(start, start + length):
        t = T0 + timedelta(hours=h)
        covered = any(d.start <= t < d.end for d in done)
        in_gap = any(g.start <= t < g.end for g in gaps)
        assert covered != in_gap
    assert merge(gaps) == gaps


def test_incremental_plan_resumes_gaps_and_looks_back():
    now = T0 + timedelta(days=10)
    done = [Window(T0, T0 + timedelta(days=2)), Window(T0 + timedelta(days=3), T0 + timedelta(days=5))]
    plan = plan_incremental(now, done, lookback=timedelta(hours=24), initial=timedelta(days=7), horizon=T0)
    assert plan == [Window(T0 + timedelta(days=2), T0 + timedelta(days=3)),
                    Window(T0 + timedelta(days=4), now)]
    assert plan_incremental(now, [], lookback=timedelta(0), initial=timedelta(days=7)) == [
        Window(now - timedelta(days=7), now)]


def test_explicit_backfills_do_not_move_the_incremental_horizon():
    now = T0 + timedelta(days=400)
    backfill = [Window(T0, T0 + timedelta(days=1))]  # an explicit run a year ago
    assert plan_incremental(now, backfill, lookback=timedelta(0), initial=timedelta(days=7)) == [
        Window(now - timedelta(days=7), now)]
    horizon = now - timedelta(days=7)
    assert plan_incremental(now, backfill + [Window(horizon, now - timedelta(days=1))], lookback=timedelta(0),
                            initial=timedelta(days=7), horizon=horizon) == [Window(now - timedelta(days=1), now)]


def test_completed_windows_beyond_now_do_not_hide_the_future():
    now = T0 + timedelta(days=10)
    future = [Window(T0, T0 + timedelta(days=30))]  # recorded by an explicit run that reached past "now"
    assert plan_incremental(now, future, lookback=timedelta(hours=2), initial=timedelta(days=7), horizon=T0) == [
        Window(now - timedelta(hours=2), now)]


def test_bad_windows_are_rejected():
    with pytest.raises(ValueError):
        Window(T0, T0)
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        parse_local("2024/03/01")


def test_a_failed_first_segment_stays_a_gap():
    now = T0 + timedelta(days=8)
    done = [Window(T0 + timedelta(days=1), T0 + timedelta(days=8))]  # day 0 failed in an earlier run
    plan = plan_incremental(now, done, lookback=timedelta(0), initial=timedelta(days=8), horizon=T0)
    assert plan == [Window(T0, T0 + timedelta(days=1))]
    # everything failed so far: the whole horizon is fetched again
    assert plan_incremental(now, [], lookback=timedelta(0), initial=timedelta(days=1), horizon=T0) == [
        Window(T0, now)]
