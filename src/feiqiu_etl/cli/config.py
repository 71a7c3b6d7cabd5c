"""``feiqiu-etl config show``: every effective setting with its source — default, connector, fleet file, ``.env``,
environment, ``--set``, flag, or a fleet lane — as the settings model has them, and the secrets only as
"set"/"not set" (a DSN without its password)."""

from __future__ import annotations

import click

from feiqiu_etl.cli.groups import SuggestingGroup
from feiqiu_etl.cli.options import common_options, setup_logging, to_run_options, with_run_options


@click.group(cls=SuggestingGroup)
def config() -> None:
    """Inspect the configuration."""


@config.command("show")
@with_run_options
@click.option("--json", "as_json", is_flag=True, help="print JSON on stdout")
@common_options
def config_show(as_json, verbose, log_format, **p) -> None:
    """Every effective setting (global, and per task where a layer set it) and where it came from. Accepts the
    options of ``run`` so that flags, ``--set`` and a ``--fleet`` file's lanes show up as they would apply."""
    setup_logging(verbose, log_format)
    from feiqiu_etl.config import ConfigError
    from feiqiu_etl.connector import ConnectorError, load_connector
    from feiqiu_etl.app.errors import UsageFailure
    from feiqiu_etl.plan.fleet import FleetError, load_fleet

    options = to_run_options(p)
    try:
        connector = load_connector(options.connector_path)
        fleet = load_fleet(options.fleet_path) if options.fleet_path else None
        settings = options.settings(connector, fleet)
        rows = _settings(settings, connector)  # a bad value (workers=abc) is the one line run/plan give, exit 2
        notes = _unsafe_gaps(settings, connector, rows) if not options.unsafe_gaps else []
        if fleet is not None:
            rows += _lanes(settings, connector, fleet)
    except (ConfigError, ConnectorError, FleetError) as exc:
        raise UsageFailure(str(exc)) from None
    rows += _named(settings)
    rows = [{**r, "value": _text(r["value"])} for r in rows]  # as it could be written in .env or --set
    if as_json:
        from feiqiu_etl.textsafe import terminal_json

        click.echo(terminal_json(rows))
        return
    from feiqiu_etl.cli.views.console import compact_table, stdout_console

    console = stdout_console()
    table = compact_table()
    # keys whole (people copy them into --set); values and sources fold into what is left
    table.add_column("key", no_wrap=True, min_width=max(len(r["key"]) for r in rows))
    table.add_column("value", overflow="fold")
    table.add_column("source", overflow="fold")
    for r in rows:
        table.add_row(r["key"], f"{r['value']} (!)" if r.get("warning") else r["value"], r["source"])
    console.print(table)
    for note in notes:
        console.print(f"(!) {note}", style="yellow", overflow="fold", markup=False)


def _unsafe_gaps(settings, connector, rows: list[dict]) -> list[str]:
    """Mark the rows whose ``rate_min`` is below the upstream's minimum gap (``warning``: what ``run`` and
    ``plan`` would say) and return one note per such key."""
    from feiqiu_etl.plan.inputs import gap_below_minimum

    notes: dict[str, str] = {}
    for spec in connector.tasks:
        found = gap_below_minimum(settings, spec, connector)
        if found and found[0] not in notes:
            notes[found[0]] = f"{found[1]}: run and plan refuse it without --unsafe-gaps"
    for r in rows:
        key = r["key"]
        if r["source"] == "connector" and key.endswith(".rate_min"):  # set by the connector file
            code = key.split(".")[1].upper()
            key = f"connector {code}.pipeline.rate_min"
        if key in notes:
            r["warning"] = notes[key]
    return list(notes.values())


def _settings(settings, connector) -> list[dict]:
    """The rows of the settings keys (every global key; a task's where a task-level value is set) and of the
    connector's gap classes. Raises ``ConfigError`` when a task's merged values do not fit together."""
    for spec in connector.tasks:
        settings.pipeline_config(spec.code)
    rows = [{"key": key, "value": value, "source": source}
            for key, (value, source) in settings.effective(t.code for t in connector.tasks).items()]
    for spec in connector.tasks:
        if spec.gap_class != connector.api.default_gap_class:
            rows.append({"key": f"{spec.code} gap class", "value": spec.gap_class, "source": "connector"})
    for name, gap in connector.api.gap_classes.items():
        rows.append({"key": f"minimum gap, {name} endpoints", "value": f"{gap.min_gap:g} s", "source": "connector"})
    return rows


def _lanes(settings, connector, fleet) -> list[dict]:
    """Per fleet lane: its API base and each task setting that differs from the settings without the lane."""
    from feiqiu_etl.pipeline.config import PipelineConfig

    rows = []
    for lane in fleet.lanes:
        mine = settings.for_lane(lane.name, {k if k.startswith("pipeline.") else f"pipeline.{k}": v
                                             for k, v in lane.pipeline.items()}, lane.api_base)
        if mine.api_base is not None:
            rows.append({"key": f"{lane.name}:FEIQIU_API_BASE", "value": _url(mine.api_base),
                         "source": mine.source("api_base")})
        for spec in connector.tasks:
            for name in PipelineConfig.keys():
                found = mine.resolve(spec.code, name)
                if found.source.startswith("fleet lane"):
                    rows.append({"key": f"{lane.name}:pipeline.{spec.code.lower()}.{name}", "value": found.value,
                                 "source": found.source})
    return rows


def _named(settings) -> list[dict]:
    """The named settings: secrets as set/not set (the token by its fingerprint), the DSN without its password."""
    from feiqiu_etl.common.lanes import fingerprint
    from feiqiu_etl.config.settings import reveal
    from feiqiu_etl.db.connection import redact_dsn
    from feiqiu_etl.db.embedded import describe_data_folder, etl_home

    def source(field: str, unset: str) -> str:
        found = settings.source(field)
        return unset if found == "default" else found

    token, web_token, dsn = reveal(settings.api_token), reveal(settings.web_token), reveal(settings.db_dsn)
    pgdata, where = describe_data_folder(etl_home())
    return [
        {"key": "FEIQIU_API_TOKEN", "value": f"set (fingerprint {fingerprint(token)})" if token else "not set",
         "source": source("api_token", "-")},
        {"key": "FEIQIU_API_BASE", "value": _url(settings.api_base) if settings.api_base else "not set",
         "source": source("api_base", "-")},
        {"key": "ETL_DB_DSN", "value": redact_dsn(dsn) if dsn else "embedded server", "source": source("db_dsn",
                                                                                                      "default")},
        {"key": "FEIQIU_WEB_TOKEN", "value": "set" if web_token else "not set", "source": source("web_token", "-")},
        {"key": "FEIQIU_ETL_HOME", "value": str(etl_home()), "source": settings.source("home")},
        # as root, a home the server account cannot enter keeps its data in /var/lib/feiqiu-etl/homes/
        {"key": "embedded data folder", "value": str(pgdata), "source": where},
    ]


def _text(value) -> str:
    return f"{value:g}" if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else str(value)


def _url(url: str) -> str:
    from feiqiu_etl.textsafe import redact_url

    return redact_url(url)
