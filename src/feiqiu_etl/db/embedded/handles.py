"""The list of processes using one embedded server, so that the last one to leave stops it.

It is a JSON list of pids in ``<pgdata>/.handle_pids.json``, changed only under the server's lock (see
``server.py``) and written whole: a temporary file renamed over it, so a reader without the lock (the watcher,
``statistics()``) never sees half a list. (A list rewritten in place once read as empty mid-write: the watcher
dropped it and stopped the server under two live commands — fresh-user trial.) A process killed hard
(``kill -9``, a second Ctrl-C) can leave its dead pid in it; every read keeps only live pids, and an unreadable
file (an older version's, cut by a kill) counts as no user and is replaced by the next write, never deleted by a
reader.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

HANDLE_LIST = ".handle_pids.json"


def repair_handle_list(pgdata: Path) -> None:
    """Keep the list of processes using the server (a JSON list of pids) sane: keep only the pids that are
    still alive; replace an unreadable file."""
    write_users(pgdata, live_users(pgdata))


def live_users(pgdata: Path) -> list[int]:
    """The pids in the list that are still alive (none for an unreadable list, which is left for the next
    write to replace)."""
    import psutil

    path = pgdata / HANDLE_LIST
    if not path.exists():
        return []
    try:
        pids = json.loads(path.read_text() or "null")
        if not isinstance(pids, list):
            raise ValueError("not a list")
    except (OSError, ValueError):
        log.warning("embedded PostgreSQL: unreadable %s (the next start or stop rewrites it)", path)
        return []
    return [p for p in pids if isinstance(p, int) and not isinstance(p, bool) and psutil.pid_exists(p)]


def write_users(pgdata: Path, pids: list[int]) -> None:
    """Store ``pids`` as the list (mode 0600), unless it already holds exactly them; no pid: remove it."""
    path = pgdata / HANDLE_LIST
    if not pids:  # no user: no list (a reader without the lock reads both alike)
        path.unlink(missing_ok=True)
        return
    try:
        old = json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        old = None
    if old != pids:
        for stale in pgdata.glob(f"{HANDLE_LIST}.*.tmp"):  # a writer killed mid-write (writes hold the lock)
            stale.unlink(missing_ok=True)
        fd, temp = tempfile.mkstemp(dir=pgdata, prefix=f"{HANDLE_LIST}.", suffix=".tmp")  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(pids))
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
