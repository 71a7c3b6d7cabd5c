"""Secrets in an API base URL are never stored or shown (issue 21, finding 5): ``--api-base`` with a password
and a ``token`` query parameter, through a real (failing) run, its record and log, ``show`` (text and JSON), the
web API and page, ``config show``, ``plan --json`` and a fleet file's ``api_base``."""

from __future__ import annotations

import httpx
import psycopg

from clikit import cli, env_for
from webkit import WebServer

BASE = "http://u:pw-s3cret@127.0.0.1:9/?token=qsecret&region=cn&api_key=k3y-value"
SECRETS = ("pw-s3cret", "qsecret", "k3y-value")
SHOWN = "http://u:***@127.0.0.1:9/?token=***&region=cn&api_key=***"


def _clean(text: str) -> None:
    assert not [s for s in SECRETS if s in text], text[-1500:]


def test_secrets_in_the_api_base_are_masked_wherever_it_is_kept_or_shown(pg_dsn, tmp_path):
    run = cli("run", "--api-base", BASE, "--site-id", "1", "--dsn", pg_dsn, "--no-dwd", "--no-progress", "--json",
              "-vv", "--tasks", "ODS_PAYMENT", "--set", "api.retry_backoff=0.01", env=env_for("t"), timeout=120)
    assert run.returncode == 4, run.stderr[-1500:]  # nothing listens on port 9: upstream unreachable
    _clean(run.stdout + run.stderr)
    with psycopg.connect(pg_dsn) as conn:
        stored = [conn.execute(f"SELECT coalesce(json_agg(t)::text, '') FROM etl_meta.{table} t").fetchone()[0]
                  for table in ("run", "run_log", "run_request")]
    _clean(" ".join(stored))
    assert SHOWN in stored[0]  # the record keeps the URL, masked

    for args in (("show", "last"), ("show", "last", "--json"), ("runs", "--json")):
        shown = cli(*args, "--dsn", pg_dsn)
        assert shown.returncode == 0, shown.stderr
        _clean(shown.stdout + shown.stderr)
    assert SHOWN in cli("show", "last", "--dsn", pg_dsn).stdout.replace("\n", "")

    config = cli("config", "show", "--api-base", BASE, env=env_for("t"))
    plan = cli("plan", "--api-base", BASE, "--site-id", "1", "--dsn", pg_dsn, "--json", env=env_for("t"))
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"api_base: '{BASE}'\nlanes:\n  - name: north\n    token_env: FQ_TOKEN_NORTH\n"
                     "    stores: [{site_id: 1}]\n")
    fleet_plan = cli("plan", "--fleet", str(fleet), "--dsn", pg_dsn, "--json", env=env_for("t", FQ_TOKEN_NORTH="x"))
    bad_scheme = cli("plan", "--api-base", BASE.replace("http", "ftp"), "--site-id", "1", "--dsn", pg_dsn,
                     env=env_for("t"))
    for proc in (config, plan, fleet_plan):
        assert proc.returncode == 0, proc.stderr
        _clean(proc.stdout + proc.stderr)
    assert SHOWN in plan.stdout and SHOWN in fleet_plan.stdout
    assert bad_scheme.returncode == 2 and "ftp://u:***@" in bad_scheme.stderr
    _clean(bad_scheme.stderr)

    with WebServer(pg_dsn) as server:
        run_id = httpx.get(server.url + "/api/runs").json()["runs"][0]["run_id"]
        api = httpx.get(f"{server.url}/api/runs/{run_id}")
        page = httpx.get(f"{server.url}/runs/{run_id}")
        assert api.status_code == 200 and page.status_code == 200
        _clean(api.text + page.text)
        assert api.json()["args"]["api_base"] == SHOWN


def test_a_record_written_before_the_fix_is_shown_masked(pg_dsn):
    """Older versions kept ``?token=…`` in the record: ``show`` and the web API mask it when they read it."""
    from feiqiu_etl.db.schema import ensure_schemas
    from feiqiu_etl import registry

    with psycopg.connect(pg_dsn) as conn:
        ensure_schemas(conn)
        registry.start_run(conn, registry.Invocation("old-run-1", "run", {"api_base": BASE, "token": "***"}),
                           config={})
        registry.finish_run(conn, "old-run-1", status="FAILED", exit_code=4, summary=None, error="x")
    shown = cli("show", "old-run-1", "--json", "--dsn", pg_dsn)
    assert shown.returncode == 0 and SHOWN in shown.stdout, shown.stderr
    _clean(shown.stdout + cli("show", "old-run-1", "--dsn", pg_dsn).stdout)
    with WebServer(pg_dsn) as server:
        api = httpx.get(f"{server.url}/api/runs/old-run-1")
        page = httpx.get(f"{server.url}/runs/old-run-1")
        assert api.json()["args"]["api_base"] == SHOWN
        _clean(api.text + page.text)
