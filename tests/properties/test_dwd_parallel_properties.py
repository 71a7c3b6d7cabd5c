# Feature: etl-unified-pipeline, Property 16: DWD 并行与串行结果一致
"""Property 16 (spec §3.7): for any set of DWD tables and any ODS data, a parallel ``DwdLoadTask.load()`` and a
serial one (``serial=True``) produce identical DWD tables, watermarks and per-table counts — including which
tables fail. Two databases on the session's PostgreSQL are reused; each example truncates what it touched.
Every example runs two loads (a first load, then changes, soft deletes and a second load), so inserted,
updated and closed counts are all compared.
"""

from __future__ import annotations

import re
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dwd_support import DwdEnv, at, ods_layouts, payload
from feiqiu_etl.tasks.dwd import DwdLoadTask, load_dwd_mapping

MAPPING = load_dwd_mapping()
LAYOUTS = ods_layouts()
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
_TIME = re.compile(r"^\d{4}-\d\d-\d\d")


def _variants(value):
    """Plausible replacement values of one payload field (same JSON type as upstream-api.md §3.1)."""
    if isinstance(value, (bool, dict)) or value == "":
        return []
    if isinstance(value, (int, float)):
        return [0, 1, 3]
    if isinstance(value, list):
        return [[]]
    if value.isdigit():
        return ["", str(int(value) + 1)]
    if _NUMBER.match(value):
        return ["", "1.5", "99"]
    if _TIME.match(value):
        return [""]
    return ["", value + "改"]


def _mutable_fields(source: str) -> list[str]:
    keys = {k.field for k in LAYOUTS[source].pk} | {k.field for k in LAYOUTS[source].extra} | {"siteId"}
    return sorted(f for f, v in payload(source).items() if f not in keys and _variants(v))


@st.composite
def row_changes(draw, source: str):
    """One ODS write: record n with one field changed (or none), maybe corrupt, maybe soft-deleted."""
    record = payload(source, draw(st.integers(1, 2)))
    field = draw(st.sampled_from([None, *_mutable_fields(source)]))
    if field:
        record[field] = draw(st.sampled_from(_variants(record[field])))
    if draw(st.integers(0, 30)) == 0:  # rarely, a value that does not cast: quarantined the same both ways
        money = next((f for f, v in record.items() if isinstance(v, str) and _NUMBER.match(v) and "." in v), None)
        if money:
            record[money] = "十二块"
    return record, draw(st.booleans()) and draw(st.booleans())  # deleted about 1 in 4


@st.composite
def scenarios(draw):
    names = draw(st.lists(st.sampled_from(MAPPING.names), min_size=1, max_size=5, unique=True))
    rounds = []
    for _ in range(2):
        rounds.append({name: draw(st.lists(row_changes(MAPPING.table(name).source), max_size=3)) for name in names})
    return names, rounds, draw(st.integers(2, 4))


def _apply(env: DwdEnv, round_no: int, changes: dict) -> None:
    for i, (name, rows) in enumerate(sorted(changes.items())):
        source = MAPPING.table(name).source
        for j, (record, deleted) in enumerate(rows):
            fetched = at(100 * round_no + 10 * i + j)
            env.ods.put(source, record, fetched_at=fetched, is_deleted=deleted, deleted_at=fetched if deleted else None)


def _snapshot(env: DwdEnv, names: list[str]) -> dict:
    out = {}
    for name in names:  # every column but the wall-clock loaded_at (surrogate keys included)
        out[name] = [{k: v for k, v in row.items() if k != "loaded_at"} for row in env.rows(name)]
    out["watermarks"] = env.conn.execute(
        "SELECT table_name, watermark, run_id FROM etl_meta.dwd_watermark ORDER BY table_name").fetchall()
    out["quarantine"] = env.conn.execute(
        "SELECT table_name, source_key, column_name, value, reason FROM etl_meta.dwd_quarantine"
        " ORDER BY table_name, source_key").fetchall()
    return out


@pytest.fixture
def two_envs(pg_dsn, pg_server_dsn):
    from psycopg import conninfo, sql

    from feiqiu_etl.db.embedded import create_database

    name = f"t_{uuid.uuid4().hex[:12]}"
    create_database(pg_server_dsn, name)
    second = conninfo.make_conninfo(pg_server_dsn, dbname=name)
    envs = (DwdEnv(pg_dsn), DwdEnv(second))
    yield envs
    for e in envs:
        e.close()
    import psycopg

    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _counts(summary):
    return [(t.table, t.kind, t.inserted, t.updated, t.closed, t.error, t.quarantined) for t in summary.tables]


def test_parallel_and_serial_loads_agree(two_envs):
    parallel_env, serial_env = two_envs
    touched: set[str] = set()

    @settings(settings.default)
    @given(scenarios())
    def check(scenario):
        names, rounds, workers = scenario
        for env in two_envs:
            if touched:
                env.truncate(*sorted(touched))
        touched.update({"etl_meta.dwd_watermark", "etl_meta.dwd_quarantine"} | {MAPPING.table(n).target for n in names}
                       | {MAPPING.table(n).source for n in names})
        for round_no, changes in enumerate(rounds, start=1):
            summaries = []
            for env, serial in ((parallel_env, False), (serial_env, True)):
                _apply(env, round_no, changes)
                task = DwdLoadTask(env.dsn, MAPPING, parallel_workers=workers, run_id=f"run-{round_no}",
                                   now=at(10_000 * round_no))
                summaries.append(task.load(only_tables=names, serial=serial))
            assert _counts(summaries[0]) == _counts(summaries[1])
            assert summaries[0].succeeded + summaries[0].failed == len(names)  # Property 14
            assert _snapshot(parallel_env, names) == _snapshot(serial_env, names)

    check()
