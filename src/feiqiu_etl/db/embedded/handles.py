"""The list of processes using one embedded server, so that the last one to leave stops it.

It is a JSON list of pids in ``<pgdata>/.handle_pids.json``, read and changed only under the server's lock
(see ``server.py``). A process killed hard (``kill -9``, a second Ctrl-C) can leave the file truncated or its
dead pid in it; every read keeps only live pids and drops an unreadable file, so a hard kill never makes a later
start fail or keeps the last live user from stopping the server.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

HANDLE_LIST = ".handle_pids.json"


def repair_handle_list(pgdata: Path) -> None:
    """Keep the list of processes using the server (a JSON list of pids) sane: keep only the pids that are
    still alive; drop an unreadable file."""
    write_users(pgdata, live_users(pgdata))


def live_users(pgdata: Path) -> list[int]:
    """The pids in the list that are still alive (an unreadable list is removed: none)."""
    import psutil

    path = pgdata / HANDLE_LIST
    if not path.exists():
        return []
    try:
        pids = json.loads(path.read_text() or "null")
        if not isinstance(pids, list):
            raise ValueError("not a list")
    except (OSError, ValueError):
        log.warning("embedded PostgreSQL: discarding unreadable %s", path)
        path.unlink(missing_ok=True)
        return []
    return [p for p in pids if isinstance(p, int) and not isinstance(p, bool) and psutil.pid_exists(p)]


def write_users(pgdata: Path, pids: list[int]) -> None:
    """Store ``pids`` as the list (mode 0600), unless it already holds exactly them."""
    path = pgdata / HANDLE_LIST
    if not path.exists() and not pids:
        return
    try:
        old = json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        old = None
    if old != pids:
        path.write_text(json.dumps(pids))
        os.chmod(path, 0o600)
