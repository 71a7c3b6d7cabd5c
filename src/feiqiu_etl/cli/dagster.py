"""``feiqiu-etl dagster dev`` and ``feiqiu-etl dagster instance``: Dagster on one machine without building a
DSN by hand, and the instance file of a deployment (docs/scale-out.md).

``dagster dev`` holds the embedded PostgreSQL server for its whole life (like ``web``), gives Dagster its own
database on it (``dagster``: runs, event log, pool slots) and the warehouse (``feiqiu_etl``, the database every
other command opens by default; ``--dsn``/``ETL_DB_DSN`` for another one), writes ``$DAGSTER_HOME/dagster.yaml``
(:func:`feiqiu_etl.dagster.instance.instance_yaml`: PostgreSQL storage, the queued run coordinator, pools of one
slot, run monitoring) and runs what a deployment runs — ``dagster-daemon run`` and ``dagster-webserver`` (on
127.0.0.1) with ``-m feiqiu_etl.dagster`` — with ``ETL_DB_DSN``, ``FEIQIU_FLEET`` and ``DAGSTER_HOME`` in their
environment (not ``dagster dev``: Dagster 1.13 marks it superseded), in ``$DAGSTER_HOME`` — this command already
read ``./.env`` as every command does (the real environment wins), and a Dagster command started where a
``.env`` is would load it again *over* the environment. The DSNs name the server's passfile; no
password is written or shown. The first Ctrl-C (or SIGTERM) asks Dagster to stop and waits up to
:data:`STOP_WAIT` seconds, a second one kills it; then the embedded server stops (if no other command uses it).

``dagster instance`` prints the ``dagster.yaml`` of a deployment on several machines (its storage URL from
``$FEIQIU_DAGSTER_PG_URL``, or ``--dsn`` made into one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import click

from feiqiu_etl.cli.groups import SuggestingGroup
from feiqiu_etl.cli.numeric import IntRange
from feiqiu_etl.cli.options import common_options, listen, settings, setup_logging
from feiqiu_etl.app.database import check_database, database
from feiqiu_etl.app.errors import UsageFailure

DAGSTER_DATABASE = "dagster"
"""The embedded server's database for Dagster's own storage."""
HEADER = "# Dagster instance for feiqiu-etl"
LOCATION = "feiqiu_etl.dagster"
STOP_WAIT = 60.0
"""Seconds ``dagster dev`` gets to stop after the first signal before it is killed."""


def _need_dagster() -> None:
    import importlib.util

    missing = [m for m in ("dagster", "dagster_postgres", "dagster_webserver") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageFailure(f"feiqiu-etl dagster needs {missing[0]}: pip install '.[dagster]' in the clone of feiqiu-etl")


def dagster_home(given: str | None) -> Path:
    """``--dagster-home``, else ``$DAGSTER_HOME``, else ``<feiqiu-etl home>/dagster``."""
    if given or os.environ.get("DAGSTER_HOME"):
        return Path(given or os.environ["DAGSTER_HOME"]).expanduser().resolve()
    from feiqiu_etl.db.embedded import etl_home

    return etl_home() / "dagster"


def write_instance(home: Path, text: str) -> bool:
    """Write ``home/dagster.yaml`` unless a file someone else wrote is there (ours start with :data:`HEADER`
    and are rewritten: the server's socket may have moved). Returns whether it was written."""
    path = home / "dagster.yaml"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if path.exists() and not path.read_text(encoding="utf-8", errors="replace").startswith(HEADER):
            return False
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageFailure(f"cannot write {path}: {exc.strerror or exc}") from None
    return True


@click.group(cls=SuggestingGroup)
def dagster() -> None:
    """Dagster on the fleet: try it on one machine (dev), or print a deployment's instance file (instance)."""


@dagster.command()
@click.option("--fleet", "fleet_path", envvar="FEIQIU_FLEET", type=click.Path(dir_okay=False), required=True,
              help="the fleet file (env FEIQIU_FLEET)")
@click.option("--port", type=IntRange(1, 65535), default=3000, show_default=True, help="the Dagster UI's port")
@click.option("--dagster-home", "home", type=click.Path(file_okay=False),
              help="Dagster's folder (env DAGSTER_HOME; default: <feiqiu-etl home>/dagster)")
@click.option("--dsn", help="the warehouse (env ETL_DB_DSN); default: the embedded server's feiqiu_etl")
@common_options
def dev(fleet_path, port, home, dsn, verbose, log_format) -> None:
    """Run Dagster on this machine over the embedded PostgreSQL: the UI on 127.0.0.1, the daemon, the fleet's
    assets, pools of one slot per token (docs/scale-out.md). Ctrl-C stops."""
    setup_logging(verbose, log_format)
    _need_dagster()
    from psycopg.conninfo import make_conninfo

    from feiqiu_etl.config.settings import reveal
    from feiqiu_etl.dagster import FleetDefinitionsError, build_definitions
    from feiqiu_etl.dagster.instance import InstanceSettings, instance_yaml, storage_url
    from feiqiu_etl.db.connection import redact_dsn
    from feiqiu_etl.db.embedded import DEFAULT_DATABASE, create_database

    fleet = str(Path(fleet_path).resolve())
    try:
        build_definitions(fleet)  # the fleet and connector files, checked before anything starts
    except FleetDefinitionsError as exc:
        raise UsageFailure(str(exc)) from None
    listen("127.0.0.1", port).close()  # a port in use is one line now, not a Dagster traceback later
    config = settings({"db_dsn": dsn})
    warehouse = reveal(config.db_dsn)
    folder = dagster_home(home)

    def prepare(superuser_dsn: str) -> None:
        create_database(superuser_dsn, DAGSTER_DATABASE, connect_timeout=config.db.connect_timeout)

    with database(None, DAGSTER_DATABASE if warehouse else DEFAULT_DATABASE, prepare=prepare,
                  connect_timeout=config.db.connect_timeout) as embedded:
        warehouse = warehouse or embedded
        check_database(warehouse, None, config.db.connect_timeout)
        text = instance_yaml(InstanceSettings(storage_url=storage_url(make_conninfo(embedded,
                                                                                    dbname=DAGSTER_DATABASE))))
        if not write_instance(folder, text):
            click.echo(f"feiqiu-etl dagster dev: {folder / 'dagster.yaml'} is not ours: left as it is", err=True)
        env = {**os.environ, "ETL_DB_DSN": warehouse, "FEIQIU_FLEET": fleet, "DAGSTER_HOME": str(folder)}
        if env.get("FEIQIU_CONNECTOR"):
            env["FEIQIU_CONNECTOR"] = str(Path(env["FEIQIU_CONNECTOR"]).resolve())
        shown = f"database {DEFAULT_DATABASE} on it" if warehouse == embedded else redact_dsn(warehouse)
        click.echo(f"feiqiu-etl dagster dev: the Dagster UI on http://127.0.0.1:{port}/ (DAGSTER_HOME={folder}; "
                   f"Dagster's storage: database {DAGSTER_DATABASE} on the embedded server; warehouse: {shown}); "
                   "Ctrl-C stops", err=True)
        bin_dir = Path(sys.executable).parent
        code = _supervise([[str(bin_dir / "dagster-daemon"), "run", "-m", LOCATION],
                           [str(bin_dir / "dagster-webserver"), "-m", LOCATION, "-h", "127.0.0.1", "-p", str(port)]],
                          env, folder)
    sys.exit(code)


def _supervise(commands: list[list[str]], env: dict, cwd: Path) -> int:
    """Run ``commands`` at once in ``cwd``, each in a session of its own (a terminal's Ctrl-C reaches only us, and we pass
    it on once). The first SIGINT/SIGTERM is forwarded to all and waited for up to :data:`STOP_WAIT` s; a second
    one (or the time running out) kills their process groups. When one ends by itself, the others are stopped
    the same way. Returns 0 after a stop we asked for, 130 if they had to be killed, else the exit code of the
    one that ended first."""
    import time

    from feiqiu_etl.common import exitcodes

    children = [subprocess.Popen(args, env=env, cwd=cwd, start_new_session=True) for args in commands]
    asked: list[float] = []

    def forward(signum, frame) -> None:
        asked.append(time.monotonic())
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL if len(asked) > 1 else signal.SIGINT)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    first_code = None
    try:
        while any(child.poll() is None for child in children):
            ended = [child.returncode for child in children if child.returncode is not None]
            if ended and not asked:
                first_code = ended[0]
                forward(signal.SIGTERM, None)  # one of them stopped: stop the rest
            if asked and time.monotonic() - asked[0] > STOP_WAIT and len(asked) == 1:
                forward(signal.SIGTERM, None)  # they did not stop in time: the second signal
            time.sleep(0.25)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if first_code is not None:
        return first_code or 1
    return exitcodes.HARD_ABORT if len(asked) > 1 else 0


@dagster.command()
@click.option("--dsn", help="Dagster's own database (no password: use ~/.pgpass or passfile=); default: the "
                            "file reads the URL from $FEIQIU_DAGSTER_PG_URL on each machine")
def instance(dsn) -> None:
    """Print the dagster.yaml of a deployment: PostgreSQL storage, the queued run coordinator, pools of one
    slot per token, run monitoring that frees a dead run's slot (docs/scale-out.md)."""
    from feiqiu_etl.dagster.instance import InstanceSettings, instance_yaml, storage_url

    try:
        url = storage_url(dsn) if dsn else None
    except ValueError as exc:
        raise UsageFailure(f"--dsn: {exc}") from None
    click.echo(instance_yaml(InstanceSettings(storage_url=url)), nl=False)
