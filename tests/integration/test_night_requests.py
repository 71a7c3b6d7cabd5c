"""Issue 20.2 end to end: a first load sends exactly the minimum the data needs, and the next night — after 24 h
of the simulator's trading, with members changed only in their points (Q11), reopened settlements and Q13
changes — sends at most 1.05× it, with the default re-check share; every task's details are exactly the new or
non-volatile-changed parents. (The `medium` store's figures are benchmarks/results/night.txt.)"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from feiqiu_etl.simulator import Simulator
from feiqiu_etl.simulator.catalog import DETAIL_BY_PATH, LIST_BY_PATH
from flowkit import ANCHOR, options, run_opts, sim_config

DAY = timedelta(days=1)
DAYS = 3


def _sent(sim: Simulator) -> tuple[Counter, Counter]:
    """(list pages, details) per task, accepted requests of the simulator's log."""
    pages, details = Counter(), Counter()
    for e in sim.request_log():
        if e.outcome != "accepted":
            continue
        if e.path in LIST_BY_PATH:
            pages[LIST_BY_PATH[e.path].task_code] += 1
        else:
            details[DETAIL_BY_PATH[e.path].parent_task] += 1
    return pages, details


def _night(sim: Simulator, dsn: str, now):
    opts = options(sim, window=False, now=now, overrides={"window.initial_days": DAYS, "detail.recheck_share": 0.02})
    result = run_opts(opts, dsn)
    assert result.status == "SUCCESS", result.to_dict()
    return result


def test_the_next_night_sends_at_most_1_05_times_what_the_data_needs(pg_dsn):
    with Simulator(sim_config(seed=47, days=DAYS)) as sim:
        site = sim.config.site_ids[0]
        _night(sim, pg_dsn, ANCHOR)
        first = sim.minimum_requests(site, ANCHOR - timedelta(days=DAYS), ANCHOR)
        pages, details = _sent(sim)
        assert sum(pages.values()) + sum(details.values()) == first.requests  # a first load: exactly the minimum
        sim.clear_log()
        changes = sim.advance(hours=24).changes[site]
        assert changes["ODS_MEMBER"]["volatile_only"] > 0  # members whose points alone changed
        second = _night(sim, pg_dsn, ANCHOR + DAY)
        minimum = sim.minimum_requests(site, ANCHOR, ANCHOR + DAY)
        pages, details = _sent(sim)
        sent = sum(pages.values()) + sum(details.values())
        rechecks = sum(t.recheck["used"] for t in second.tasks if t.recheck)
        assert minimum.requests <= sent <= 1.05 * minimum.requests, (sent, minimum.requests, pages, details)
        for task in minimum.tasks:  # one detail per new or changed parent, none for points only (+ re-checks)
            used = next((t.recheck["used"] for t in second.tasks if t.task_code == task.task_code and t.recheck), 0)
            assert details[task.task_code] == task.details + used, task.task_code
        assert rechecks <= 0.02 * sent
