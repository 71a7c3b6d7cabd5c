"""``simulate``: serve the simulated Feiqiu API (:mod:`feiqiu_etl.simulator`) until Ctrl-C."""

from __future__ import annotations

import click

from feiqiu_etl.cli.numeric import FloatRange, INT, IntRange
from feiqiu_etl.cli.options import common_options, setup_logging
from feiqiu_etl.app.errors import UsageFailure


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (loopback by default)")
@click.option("--port", type=IntRange(0, 65535), default=8765, show_default=True, help="0 = any free port")
@click.option("--seed", type=INT, default=7, show_default=True)
@click.option("--scale", type=click.Choice(["small", "medium", "large"]), default="small", show_default=True)
@click.option("--days", type=IntRange(1, 366), default=3, show_default=True, help="days of history")
@click.option("--gap-standard", type=FloatRange(0, 3600), default=3.0, show_default=True,
              help="risk-control gap G, standard class (s)")
@click.option("--gap-groupbuy", type=FloatRange(0, 3600), default=8.0, show_default=True,
              help="risk-control gap G, groupbuy class (s)")
@click.option("--ban-seconds", type=FloatRange(0, 86400), default=300.0, show_default=True,
              help="ban length after 3 violations within the violation window (s)")
@click.option("--violation-window", type=FloatRange(0, 86400), default=60.0, show_default=True,
              help="rolling window in which 3 violations ban the token (s)")
@click.option("--no-risk-control", is_flag=True, help="accept every request (no gaps, no bans)")
@click.option("--anchor", metavar='"YYYY-MM-DD HH:MM:SS"',
              help="where the history ends and the clock starts (Asia/Shanghai; default: now); POST /__sim/advance "
                   "moves it forward")
@click.option("--fleet", "fleet_path", type=click.Path(dir_okay=False),
              help="serve a fleet file's lanes: each token (read from its token_env, or generated and printed) "
                   "may read its lane's stores")
@click.option("--fault", "faults", multiple=True, metavar="KIND[:PATH[:COUNT[:DAY]]]",
              help="inject a fault at start (repeatable), e.g. short_page:/api/member/list:1 or "
                   "total_zero:/api/goods/list:1000 (issue 25 data faults: short_page, total_zero, empty_page, "
                   "total_moves, zero_day); later ones: POST /__sim/faults")
@common_options
def simulate(host, port, seed, scale, days, gap_standard, gap_groupbuy, ban_seconds, violation_window, no_risk_control,
             anchor, fleet_path, faults, verbose, log_format) -> None:
    """Serve the simulated Feiqiu API (docs/upstream-api.md) until Ctrl-C."""
    setup_logging(verbose, log_format)
    from feiqiu_etl.connector.windows import parse_local
    from feiqiu_etl.simulator import RiskControlConfig, SimulatorConfig, serve_forever

    try:
        anchor_at = parse_local(anchor) if anchor else None
    except ValueError as exc:
        raise UsageFailure(f"--anchor: {exc}") from None
    tokens, site_ids = None, (8640015201004417,)
    if fleet_path:
        tokens, site_ids = _fleet_tokens(fleet_path)
    try:
        risk = RiskControlConfig(gap_standard=gap_standard, gap_groupbuy=gap_groupbuy, ban_seconds=ban_seconds,
                                 violation_window=violation_window, enabled=not no_risk_control)
        cfg = SimulatorConfig(seed=seed, scale=scale, days=days, host=host, port=port, risk=risk,
                              site_ids=site_ids, tokens=tokens, anchor=anchor_at,
                              faults=tuple(_fault(text) for text in faults))
    except ValueError as exc:
        raise UsageFailure(str(exc)) from None
    try:
        serve_forever(cfg)
    except OSError as exc:
        raise UsageFailure(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _fault(text: str) -> dict:
    """``KIND[:PATH[:COUNT[:DAY]]]`` as a ``SimulatorConfig.faults`` entry (``ValueError`` for a bad count)."""
    kind, path, count, day = (text.split(":", 3) + [""] * 3)[:4]
    try:
        number = int(count) if count else 1
    except ValueError:
        raise ValueError(f"--fault {text!r}: COUNT must be an integer") from None
    return {"kind": kind, "path": path or None, "count": number, "day": day or None}


def _fleet_tokens(path: str) -> tuple[dict, tuple]:
    import os
    import secrets

    from feiqiu_etl.plan.fleet import FleetError, load_fleet

    try:
        fleet = load_fleet(path)
    except FleetError as exc:
        raise UsageFailure(str(exc)) from None
    tokens = {}
    for lane in fleet.lanes:
        token = os.environ.get(lane.token_env) or f"fq_{lane.name}_{secrets.token_urlsafe(9)}"
        if lane.token_env not in os.environ:
            click.echo(f"export {lane.token_env}={token}")
        tokens[token] = tuple(s.site_id for s in lane.stores)
    sites = tuple(s for sites in tokens.values() for s in sites)
    return tokens, sites

