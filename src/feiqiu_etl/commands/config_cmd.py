"""``feiqiu-etl config show``: every effective setting with its source — default, connector, ``.env``,
environment, ``--set``/flag, or a fleet lane — and the secrets only as "set"/"not set"."""

from __future__ import annotations

import os

import click

from feiqiu_etl.cli import _dotenv_names, _overrides, _setup_logging, common_options, with_run_options


@click.group()
def config() -> None:
    """Inspect the configuration."""


@config.command("show")
@with_run_options
@click.option("--json", "as_json", is_flag=True, help="print JSON on stdout")
@common_options
def config_show(as_json, verbose, log_format, **p) -> None:
    """Every effective setting (global, and per task where it differs from the default) and where it came
    from. Accepts the options of ``run`` so that flags and ``--set`` show up as they would apply."""
    _setup_logging(verbose, log_format)
    from feiqiu_etl.config.app_config import AppConfig, ConfigError
    from feiqiu_etl.connector import ConnectorError, load_connector
    from feiqiu_etl.db.connection import redact_dsn
    from feiqiu_etl.flowcli import UsageFailure
    from feiqiu_etl.plan.model import Secret

    overrides, sources = _overrides(p)
    try:
        connector = load_connector(p.get("connector_path"))
        cfg = AppConfig.load(task_codes=[t.code for t in connector.tasks], overrides=overrides, environ=None,
                             strict_names=_dotenv_names(), override_sources=sources)
        rows = _settings(cfg, connector)  # a bad value (workers=abc) is the one line run/plan give, exit 2
        notes = _unsafe_gaps(cfg, connector, rows) if not p.get("unsafe_gaps") else []
    except (ConfigError, ConnectorError) as exc:
        raise UsageFailure(str(exc)) from None
    def source(param: str, env: str, default: str) -> str:
        """Where a flag's value came from: the command line, the environment (or .env), or nowhere."""
        from click.core import ParameterSource

        given = click.get_current_context().get_parameter_source(param)
        if given == ParameterSource.COMMANDLINE:
            return "flag"
        if env in os.environ:
            return ".env" if env in _dotenv_names() else "environment"
        return default

    token = p.get("token")
    rows.append({"key": "FEIQIU_API_TOKEN", "value": f"set (fingerprint {Secret(token).fingerprint()})" if token
                 else "not set", "source": source("token", "FEIQIU_API_TOKEN", "-")})
    from feiqiu_etl.textsafe import redact_url

    rows.append({"key": "FEIQIU_API_BASE", "value": redact_url(p["api_base"]) if p.get("api_base") else "not set",
                 "source": source("api_base", "FEIQIU_API_BASE", "-")})
    dsn = p.get("dsn")
    rows.append({"key": "ETL_DB_DSN", "value": redact_dsn(dsn) if dsn else "embedded server",
                 "source": source("dsn", "ETL_DB_DSN", "default")})
    from feiqiu_etl.db.embedded import etl_home

    rows.append({"key": "FEIQIU_ETL_HOME", "value": str(etl_home()),
                 "source": (".env" if "FEIQIU_ETL_HOME" in _dotenv_names() else "environment")
                 if "FEIQIU_ETL_HOME" in os.environ else "default"})
    if as_json:
        from feiqiu_etl.textsafe import terminal_json

        click.echo(terminal_json(rows))
        return
    from feiqiu_etl.report import _compact, _console

    table = _compact()
    for col in ("key", "value", "source"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["key"], f"{r['value']} (!)" if r.get("warning") else str(r["value"]), r["source"])
    console = _console()
    console.print(table)
    for note in notes:
        console.print(f"(!) {note}", style="yellow", overflow="fold", markup=False)


def _unsafe_gaps(cfg, connector, rows: list[dict]) -> list[str]:
    """Mark the rows whose ``rate_min`` is below the upstream's minimum gap (``warning``: what ``run`` and
    ``plan`` would say) and return one note per such key."""
    from feiqiu_etl.plan.inputs import gap_below_minimum

    notes: dict[str, str] = {}
    for spec in connector.tasks:
        found = gap_below_minimum(cfg, spec, connector)
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


def _settings(cfg, connector) -> list[dict]:
    from feiqiu_etl.config.app_config import DEFAULTS, GLOBAL_KEYS
    from feiqiu_etl.pipeline.config import PipelineConfig

    rows = []
    defaults = PipelineConfig()
    for key in sorted(GLOBAL_KEYS):
        value = cfg.get(key)
        if value is None and key.startswith("pipeline."):
            value = getattr(defaults, key.split(".", 1)[1])
        if value is None and key == "api.timeout":
            value, source = connector.api.timeout_seconds, "connector"
        else:
            source = cfg.source(key) if cfg.explicit(key) else "default"
        rows.append({"key": key, "value": value if value is not None else DEFAULTS.get(key), "source": source})
    for spec in connector.tasks:
        effective = cfg.pipeline_config(spec.code, spec.pipeline)
        for name in PipelineConfig.keys():
            key = f"pipeline.{spec.code.lower()}.{name}"
            if cfg.explicit(key):
                source = cfg.source(key)
            elif name in spec.pipeline:
                source = "connector"
            else:
                continue
            rows.append({"key": key, "value": getattr(effective, name), "source": source})
        if spec.gap_class != connector.api.default_gap_class:
            rows.append({"key": f"{spec.code} gap class", "value": spec.gap_class, "source": "connector"})
    for name, gap in connector.api.gap_classes.items():
        rows.append({"key": f"minimum gap, {name} endpoints", "value": f"{gap.min_gap:g} s", "source": "connector"})
    return rows
