"""``feiqiu-etl alerts test [TARGET]``: send a sample message to every configured target (or one), to check
a URL, a bot key or a mail server before a night depends on it. Needs no database; records nothing.
Exit 0 when every target accepted it, 4 when one did not, 2 for a bad configuration or no target."""

from __future__ import annotations

import sys

import click

from feiqiu_etl.cli.groups import SuggestingGroup
from feiqiu_etl.common import exitcodes
from feiqiu_etl.cli.options import common_options, setup_logging
from feiqiu_etl.app.errors import UsageFailure
from feiqiu_etl.textsafe import escape, terminal_json


@click.group(cls=SuggestingGroup)
def alerts() -> None:
    """Alerts: check where they go (docs/guides/alerts.md)."""


@alerts.command("test")
@click.argument("target", required=False)
@click.option("--alerts", "alerts_path", envvar="FEIQIU_ALERTS", type=click.Path(dir_okay=False), metavar="FILE",
              help="alerts file (env FEIQIU_ALERTS); FEIQIU_ALERT_URLS (URLs separated by spaces, newlines or ;) adds targets url1, url2, …")
@click.option("--json", "as_json", is_flag=True, help="print the outcome per target as JSON")
@common_options
def alerts_test(target, alerts_path, as_json, verbose, log_format) -> None:
    """Send a sample alert to TARGET (a target name of the file, or url1, url2 … for FEIQIU_ALERT_URLS), or to
    every target. Prints per target: sent or failed, why, and how long it took."""
    setup_logging(verbose, log_format)
    from feiqiu_etl.alerts import AlertsConfigError, load_alerts, send_test

    try:
        cfg = load_alerts(alerts_path)
    except AlertsConfigError as exc:
        raise UsageFailure(str(exc)) from None
    if cfg is None:
        raise UsageFailure("no alert target: give --alerts FILE (or FEIQIU_ALERTS) or set FEIQIU_ALERT_URLS")
    if target is not None and cfg.target(target) is None:
        names = ", ".join(t.name for t in cfg.targets)
        raise UsageFailure(f"no target {target!r}; the targets are {names}")
    deliveries = send_test(cfg, target)
    if as_json:
        click.echo(terminal_json([d.to_dict() for d in deliveries]))
    else:
        for d in deliveries:
            state = "sent" if d.ok else f"FAILED: {d.error}"
            click.echo(escape(f"{d.target}: {state} ({d.latency_s:.2f} s, {d.attempts} attempt(s))"))
    if not all(d.ok for d in deliveries):
        sys.exit(exitcodes.FAILED)
