"""``feiqiu-etl demo``: embedded PostgreSQL + the local simulator + the full flow, with demo-sized gaps.

The simulated history is fixed (``DEMO_ANCHOR``) and goes into its own database (``feiqiu_demo``), so
reruns change nothing and real runs are never mixed with it. The simulator's risk control stays ON with gaps
just below the pipeline's minimum gap, so the demo proves the lane is strictly serial and paced: any overlap
or early request would be rejected (42901). Those gaps are far below the real upstream's minimum (3 s / 8 s),
so the demo runs with ``unsafe_gaps`` on purpose, and says so. The token is generated per demo and never
printed.
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timedelta
from typing import Any

from feiqiu_etl.app.run import RunRequest
from feiqiu_etl.cli.signals import run_with_signals
from feiqiu_etl.cli.views.console import say
from feiqiu_etl.connector.windows import fmt
from feiqiu_etl.plan import RunOptions
from feiqiu_etl.registry import Invocation

DEMO_SETTINGS = {
    "pipeline.rate_min": 0.05,
    "pipeline.rate_max": 0.2,
    "pipeline.ods_group_package.rate_min": 0.1,
    "pipeline.ods_group_package.rate_max": 0.25,
    "pipeline.batch_timeout": 0.5,
    "api.retry_backoff": 0.1,
    "api.timeout": 10,
}
SIM_GAP_STANDARD = 0.04
SIM_GAP_GROUPBUY = 0.08
DEMO_ANCHOR = datetime(2024, 3, 4)  # fixed, so that a rerun sees the same simulated history
from feiqiu_etl.db.embedded import DEMO_DATABASE  # noqa: E402 - its own database, never mixed with real runs


def run_demo(*, dsn: str | None, seed: int, scale: str, days: int, overrides: dict[str, Any],
             load_dwd: bool, quiet: bool, flags: dict[str, Any] | None = None):
    """Run the demo flow and return its ``RunResult``; prints a short lane report to stderr. ``overrides`` are
    ``--set`` keys (on top of :data:`DEMO_SETTINGS`), ``flags`` the dedicated flags' values; ``$ETL_DB_DSN`` is
    never read (the demo never writes into the warehouse by accident): ``dsn`` or the embedded server."""
    from feiqiu_etl.simulator import RiskControlConfig, Simulator, SimulatorConfig

    anchor = DEMO_ANCHOR
    token = "fq_demo_" + secrets.token_urlsafe(12)
    cfg = SimulatorConfig(
        seed=seed, scale=scale, days=days, anchor=anchor, token=token,
        risk=RiskControlConfig(gap_standard=SIM_GAP_STANDARD, gap_groupbuy=SIM_GAP_GROUPBUY),
    )
    with Simulator(cfg) as sim:
        options = RunOptions(
            api_base=sim.base_url, token=token, site_ids=list(cfg.site_ids),
            overrides={**DEMO_SETTINGS, **overrides}, flags=dict(flags or {}), dsn=dsn,
            environ={k: v for k, v in os.environ.items() if k != "ETL_DB_DSN"},
            window_start=fmt(anchor - timedelta(days=days)), window_end=fmt(anchor), load_dwd=load_dwd,
            unsafe_gaps=True,
        )
        if not quiet:
            say(f"demo: simulator at {sim.base_url} with risk control on and tiny gaps "
                  f"({SIM_GAP_STANDARD} s / {SIM_GAP_GROUPBUY} s); the run uses {DEMO_SETTINGS['pipeline.rate_min']}-"
                  f"{DEMO_SETTINGS['pipeline.rate_max']} s gaps (--unsafe-gaps on purpose: never against the real API)", err=True)
        args = {"seed": seed, "scale": scale, "days": days, "load_dwd": load_dwd, "simulator": sim.base_url}
        result = run_with_signals(RunRequest(options, Invocation(command="demo", args=args), embedded=DEMO_DATABASE))
        say(lane_report(sim.request_log()), err=True)
    if not quiet and not dsn:
        say(f"data: embedded database {DEMO_DATABASE}; look with feiqiu-etl sql --demo "
            "\"SELECT count(*) FROM ods.settlement\"", err=True)
    return result


def lane_report(log: list) -> str:
    """One line about the simulator's request log: count, rejections, overlaps, minimum gap (s)."""
    if not log:
        return "simulator: no requests"
    entries = sorted(log, key=lambda e: e.started)
    gaps = [b.started - a.ended for a, b in zip(entries, entries[1:])]
    rejected = sum(1 for e in entries if e.outcome == "rejected")
    overlaps = sum(1 for g in gaps if g < 0)
    return (f"simulator: {len(entries)} requests, {rejected} rejected by risk control, {overlaps} overlapping, "
            f"minimum gap {min(gaps) if gaps else 0:.3f} s")
