"""Test helpers: run the real flow against the real simulator and compare ODS with the simulator's data."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import psycopg

from feiqiu_etl.connector import load_connector
from feiqiu_etl.app.run import RunRequest, run
from feiqiu_etl.plan import RunOptions
from feiqiu_etl.pipeline import CancellationToken
from feiqiu_etl.simulator import RiskControlConfig, Simulator, SimulatorConfig
from feiqiu_etl.connector.windows import fmt

CONNECTOR = load_connector()
ANCHOR = datetime(2024, 3, 4, 0, 0, 0)
FAST = {
    # 10 ms above the simulator's gaps (SIM_RISK): room for scheduling delays on a loaded CI machine
    "pipeline.rate_min": 0.02, "pipeline.rate_max": 0.028,
    "pipeline.ods_group_package.rate_min": 0.03, "pipeline.ods_group_package.rate_max": 0.038,
    "pipeline.batch_timeout": 0.2, "api.retry_backoff": 0.02, "api.timeout": 5,
    "detail.recheck_share": 0,  # exact request counts; the re-check has tests of its own
}
SIM_RISK = RiskControlConfig(gap_standard=0.01, gap_groupbuy=0.02)


def sim_config(**kw) -> SimulatorConfig:
    base = dict(seed=11, scale="small", days=2, anchor=ANCHOR, risk=SIM_RISK)
    base.update(kw)
    return SimulatorConfig(**base)


def options(sim: Simulator, *, tasks=None, window=True, overrides=None, **kw) -> RunOptions:
    """Run options against ``sim`` with FAST gaps (below the upstream's minimum on purpose: unsafe_gaps)."""
    cfg = sim.config
    if window:
        kw.setdefault("window_start", fmt(ANCHOR - timedelta(days=cfg.days)))
        kw.setdefault("window_end", fmt(ANCHOR))
    kw.setdefault("load_dwd", False)
    kw.setdefault("unsafe_gaps", True)
    kw.setdefault("token", cfg.token)
    kw.setdefault("site_ids", list(cfg.site_ids))
    kw.setdefault("environ", {})
    return RunOptions(api_base=sim.base_url, task_codes=tasks or [], overrides={**FAST, **(overrides or {})}, **kw)


def run_opts(opts: RunOptions, dsn: str, token: CancellationToken | None = None, **kw):
    """Run ``opts`` in this process (heartbeat every 0.2 s so status tests need not wait)."""
    return run(RunRequest(opts, dsn=dsn, cancellation=token or CancellationToken(), heartbeat=0.2, **kw))


def run_flow(sim: Simulator, dsn: str, token: CancellationToken | None = None, **kw):
    return run_opts(options(sim, **kw), dsn, token)


def ods_rows(dsn: str, table: str, live_only: bool = True) -> dict:
    """{key tuple (site_id + key values): payload} of an ODS table."""
    schema, name = table.split(".")
    with psycopg.connect(dsn) as conn:
        cols = [r[0] for r in conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
            (table,))]
        where = "WHERE NOT is_deleted" if live_only else ""
        rows = conn.execute(f"SELECT {', '.join(cols)}, payload::text FROM {schema}.{name} {where}").fetchall()
    return {tuple(r[:-1]): json.loads(r[-1]) for r in rows}


def expected_rows(sim: Simulator, spec, site_id: int, window: tuple[str, str] | None = None) -> dict:
    """What the simulator says the list table should hold for ``window`` (default: the configured history)."""
    cfg = sim.config
    if spec.kind == "snapshot":
        records = sim.dataset.records(spec.code, site_id)
    else:
        start, end = window or (fmt(ANCHOR - timedelta(days=cfg.days)), fmt(ANCHOR))
        records = sim.dataset.window(spec.code, site_id, start, end)
    return {(site_id, *(k.convert(r[k.field]) for k in spec.keys)): r for r in records}


def expected_detail_rows(sim: Simulator, spec, site_id: int, window: tuple[str, str] | None = None) -> dict:
    d = spec.detail
    out = {}
    for key, record in expected_rows(sim, spec, site_id, window).items():
        for row in sim.dataset.detail_rows(spec.code, site_id, record[d.id_column]):
            row = {d.parent.field: record[d.id_column], **row}
            out[(site_id, *(k.convert(row[k.field]) for k in d.keys))] = row
    return out


SERVER_CLOCK_SLACK = 0.002
"""The simulator stamps ``ended`` as it hands the body to the kernel (before the write, so a busy machine that
gives its thread the CPU back late no longer shortens the gap it measures); the slack covers the clock reads
around the write and the loopback delivery."""


def lane_violations(log, min_gap: float) -> list[str]:
    """Rejections, overlaps and gaps shorter than ``min_gap`` (less the server-side clock slack)."""
    min_gap -= SERVER_CLOCK_SLACK
    entries = sorted(log, key=lambda e: e.started)
    problems = [f"rejected: {e.path} {e.code}" for e in entries if e.outcome == "rejected"]
    for a, b in zip(entries, entries[1:]):
        if b.started < a.ended - SERVER_CLOCK_SLACK:
            problems.append(f"overlap: {a.path} then {b.path}")
        elif b.started - a.ended < min_gap:
            problems.append(f"gap {b.started - a.ended:.4f} s < {min_gap} before {b.path}")
    return problems


def fleet_file(path, lanes: dict[str, tuple[str, tuple[int, ...]]]) -> str:
    """Write a fleet file ``{lane: (token_env, site ids)}`` to ``path``; returns the path as text."""
    lines = ["lanes:"]
    for name, (env, stores) in lanes.items():
        lines += [f"  - name: {name}", f"    token_env: {env}", "    stores:"]
        lines += [f"      - {{site_id: {s}, name: store-{str(s)[-2:]}}}" for s in stores]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def store_exact(dsn: str, sim: Simulator, site: int, tasks, window: tuple[str, str] | None = None) -> None:
    """Assert that ODS holds exactly what the simulator has for ``site`` and ``tasks`` (list and details) in
    ``window`` (default: the history of a simulator anchored at :data:`ANCHOR`)."""
    for spec in (CONNECTOR.task(c) for c in tasks):
        got = {k: v for k, v in ods_rows(dsn, spec.table).items() if k[0] == site}
        assert got == expected_rows(sim, spec, site, window), (spec.code, site)
        if spec.detail:
            got = {k: v for k, v in ods_rows(dsn, spec.detail.target_table).items() if k[0] == site}
            assert got == expected_detail_rows(sim, spec, site, window), (spec.detail.target_table, site)


def history(sim: Simulator) -> tuple[str, str]:
    """The window of ``sim``'s whole generated history, ``[anchor - days, anchor)`` (any anchor)."""
    anchor = sim.dataset.anchor
    return fmt(anchor - timedelta(days=sim.config.days)), fmt(anchor)


def as_environment(settings: dict) -> dict[str, str]:
    """``--set`` keys as the environment variables that set them (``pipeline.ods_x.rate_min`` →
    ``PIPELINE_ODS_X__RATE_MIN``)."""
    out = {}
    for key, value in settings.items():
        parts = key.upper().split(".")
        out["_".join(parts[:2]) + ("__" + parts[2] if len(parts) == 3 else "")] = str(value)
    return out


def dwd_exact(dsn: str, site: int, tasks) -> None:
    """Assert that every DWD table fed by ``tasks`` holds one (current) row per live ODS row of ``site``."""
    from feiqiu_etl.tasks.dwd import load_dwd_mapping

    sources = {CONNECTOR.task(c).table for c in tasks} | {"ods.settlement_item", "ods.member_detail_card"}
    with psycopg.connect(dsn) as conn:
        for t in load_dwd_mapping().tables:
            if t.source not in sources:
                continue
            live = "AND NOT is_deleted" if t.is_dimension else ""
            source = conn.execute(f"SELECT count(*) FROM {t.source} WHERE site_id = %s {live}", (site,)).fetchone()[0]
            where = "AND is_current" if t.is_dimension else ""
            target = conn.execute(f"SELECT count(*) FROM {t.target} WHERE site_id = %s {where}", (site,)).fetchone()[0]
            assert target == source > 0, (t.target, site)


def scaled_connector(path, standard: float, groupbuy: float) -> str:
    """Write a copy of the Feiqiu connector to ``path`` whose documented minimum gaps (``api.gap_classes``) are
    ``standard`` and ``groupbuy`` seconds — the simulator's G when its time is scaled down — so that a deadline
    narrows gaps toward floors that match it. Returns the path as text."""
    import yaml

    from feiqiu_etl.connector.model import default_connector_path

    source = default_connector_path()
    doc = yaml.safe_load(source.read_text(encoding="utf-8"))
    doc["api"]["gap_classes"]["standard"]["min_gap"] = standard
    doc["api"]["gap_classes"]["groupbuy"]["min_gap"] = groupbuy
    doc["dwd_mapping"] = str(source.parent / doc["dwd_mapping"])
    path.write_text(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return str(path)
