"""Issue 25 part 7: whatever glitches the upstream throws at the pages of a run — a page one record short, a page
that answers empty (total 0, no rows) after a full first page, a total that moves — the run either loads the data
exactly or says which listings are short and does not end SUCCESS; and the next clean run is exact.

Each example is a store of its own (so examples share one database) served by the real simulator over HTTP at ten
times the small scale (a snapshot of two pages, windowed lists of two and three pages), loaded by the real flow
into real PostgreSQL. The glitches strike chosen pages of chosen lists, once or several times (a glitch that
repeats exhausts the refetch budget). An empty *first* page is left out: a snapshot that answers empty is the
deletion guard's (part 4) and a window that answers zero is ``unexpected_zero``'s (part 5), which needs history.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from feiqiu_etl.simulator import Simulator
from flowkit import CONNECTOR, ods_rows, expected_rows, run_flow, sim_config

TASKS = ("ODS_GOODS", "ODS_GOODS_SALE", "ODS_TABLE_USE")
PAGES = {"ODS_GOODS": 2, "ODS_GOODS_SALE": 3, "ODS_TABLE_USE": 2}
_sites = itertools.count(8_640_015_201_200_000)

glitch = st.tuples(st.sampled_from(TASKS), st.sampled_from(("short_page", "empty_page", "total_moves")),
                   st.integers(1, 3), st.integers(1, 3)).filter(
    lambda g: g[2] <= PAGES[g[0]] and not (g[1] == "empty_page" and g[2] == 1))
"""(task, kind, page, times): the ``kind`` glitch strikes that page of the task's list ``times`` times."""


def exact(dsn: str, sim: Simulator, site: int) -> dict[str, bool]:
    out = {}
    for code in TASKS:
        spec = CONNECTOR.task(code)
        got = {k: v for k, v in ods_rows(dsn, spec.table).items() if k[0] == site}
        out[code] = got == expected_rows(sim, spec, site)
    return out


@settings(max_examples=6, deadline=None)
@given(glitches=st.lists(glitch, min_size=1, max_size=3))
def test_after_any_glitch_the_data_is_exact_or_the_run_names_its_short_listings(pg_dsn, glitches):
    site = next(_sites)
    with Simulator(sim_config(seed=site % 97, days=2, site_ids=(site,), site_factors={site: 10})) as sim:
        for code, kind, page, times in glitches:
            sim.inject(CONNECTOR.task(code).endpoint, kind, count=times, page=page)
        result = run_flow(sim, pg_dsn, tasks=list(TASKS))
        loaded = exact(pg_dsn, sim, site)
        short = {t.task_code for t in result.tasks
                 if any(e["error"].startswith("listing short") for e in t.result.errors)}
        for code, ok in loaded.items():
            assert ok or code in short, (code, glitches, result.to_dict()["status"])
        if short:
            assert result.status != "SUCCESS", glitches
        assert result.status in ("SUCCESS", "PARTIAL"), result.to_dict()
        sim.clear_faults()
        again = run_flow(sim, pg_dsn, tasks=list(TASKS))
        assert again.status == "SUCCESS", glitches
        assert all(exact(pg_dsn, sim, site).values()), glitches
