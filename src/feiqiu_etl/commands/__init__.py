"""Operations commands: run history (``runs``, ``show``), live ``status``, ``cancel`` from another process,
owed ``details``, ``config show``, ``freshness``, ``alerts test`` and ``dagster dev|instance``. They open the warehouse (embedded by default), bring ``etl_meta`` up to
date and mark vanished runs INTERRUPTED before reading, like every command that opens the database."""

from __future__ import annotations

import click


def register(main: click.Group) -> None:
    from feiqiu_etl.commands import alerts_cmd, config_cmd, dagster_cmd, freshness_cmd, ops

    for command in (ops.runs, ops.show, ops.status, ops.cancel, ops.details, config_cmd.config,
                    freshness_cmd.freshness, alerts_cmd.alerts, dagster_cmd.dagster):
        main.add_command(command)
    try:
        from feiqiu_etl.commands import web
    except ImportError:  # pragma: no cover - the web page's dependencies are missing
        return
    main.add_command(web.web)
