"""The watcher of an embedded server: it stops the server once no process that uses it is alive any more.

The last command to leave stops the server (``EmbeddedPostgres.stop``). A command killed hard (``kill -9``, an
OOM kill, a second signal that exits at once) cannot, and PostgreSQL has no idle shutdown of its own, so without
help the server would run on until the next command happens to stop it. So the process that *starts* a server
also starts this watcher (:func:`feiqiu_etl.db.embedded.postmaster.start_watcher`, which imports nothing of this
module: it names it only): a small detached process (its own session; it outlives its parent) that looks at the
server's list of users (:mod:`.handles`: pids, only live ones count) every :data:`INTERVAL` seconds. When no user
lives, it takes the server's lock, looks again (a command may be joining right now) and stops the server with a
fast shutdown; it ends when the server it watches is gone (stopped by its last user, or replaced by a restart).
A server that is itself stopped (``SIGSTOP``) is left alone until it continues. The watcher holds no secret: its
environment is the locale, ``PATH`` and ``PYTHONPATH`` only, and it opens no database connection.

    python -m feiqiu_etl.db.embedded.watcher PGDATA POSTMASTER_PID
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

INTERVAL = 1.0
"""Seconds between two looks at the server's users."""


def watch(pgdata: Path, pid: int, interval: float = INTERVAL) -> str:
    """Watch the server ``pid`` of ``pgdata`` until it is gone or stopped here; returns what happened."""
    from feiqiu_etl.db.embedded.errors import EmbeddedServerError
    from feiqiu_etl.db.embedded.handles import live_users
    from feiqiu_etl.db.embedded.postmaster import is_frozen, postmaster, server_lock, shutdown_postmaster

    def ours() -> bool:
        running = postmaster(pgdata)
        return running is not None and running[0] == pid

    while True:
        time.sleep(interval)
        if not ours():
            return "gone"
        if live_users(pgdata) or is_frozen(pid):
            continue
        try:
            with server_lock(pgdata):
                if not ours():
                    return "gone"
                if live_users(pgdata):
                    continue
                shutdown_postmaster(pgdata)
                return "stopped"
        except EmbeddedServerError:  # the lock stayed busy (a long start): look again
            continue


def main(argv: list[str]) -> int:
    try:
        pgdata, pid = Path(argv[0]), int(argv[1])
    except (IndexError, ValueError):
        print("usage: python -m feiqiu_etl.db.embedded.watcher PGDATA POSTMASTER_PID", file=sys.stderr)
        return 2
    try:
        watch(pgdata, pid)
    except Exception:  # noqa: BLE001 - a watcher that fails leaves things as they were without it
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a process
    sys.exit(main(sys.argv[1:]))
