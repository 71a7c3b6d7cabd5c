"""``tasks``: the connector's tasks (kind, endpoint, target tables, gap class, pipeline defaults)."""

from __future__ import annotations

import click

from feiqiu_etl.app.errors import UsageFailure
from feiqiu_etl.textsafe import terminal_json


@click.command("tasks")
@click.option("--connector", "connector_path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def tasks_cmd(connector_path, as_json) -> None:
    """List the connector's tasks: kind, endpoint, target tables."""
    from feiqiu_etl.connector import ConnectorError, load_connector

    try:
        connector = load_connector(connector_path)
    except ConnectorError as exc:
        raise UsageFailure(str(exc)) from None
    rows = [{
        "task": t.code, "kind": t.kind, "endpoint": t.endpoint, "table": t.table,
        "window_field": t.window_field, "detail_endpoint": t.detail_endpoint,
        "detail_table": t.detail_target_table, "gap_class": t.gap_class,
        "min_gap": connector.min_gap(t.gap_class), "pipeline_defaults": dict(t.pipeline),
        "volatile_fields": list(t.volatile_fields),
        "lookback_minutes": None if t.lookback is None else t.lookback.total_seconds() / 60,
        "expected_rows": list(t.expected_rows) if t.expected_rows else None,
        "expected_daily_rows": list(t.expected_daily_rows) if t.expected_daily_rows else None,
    } for t in connector.tasks]
    if as_json:
        click.echo(terminal_json({"connector": connector.name, "tasks": rows}))
        return
    from feiqiu_etl.cli.views.tables import render_tasks

    render_tasks(connector.name, rows)

