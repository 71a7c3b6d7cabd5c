"""The postmaster of a data folder, as a process: find it (``postmaster.pid``), tell whether it is frozen, stop it,
and start the watcher that stops it once no user lives (:mod:`.watcher`). Nothing here opens a connection.

:func:`server_lock` is the lock every start, join, stop and watcher of one server takes
(``<home>/.<pgdata>.lock``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from feiqiu_etl.db.embedded.locks import flocked

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
#: Longest wait for another command's start or stop of the same server (an initdb plus a start, with margin).
LOCK_TIMEOUT = 3 * START_TIMEOUT


def server_lock(pgdata: Path, timeout: float = LOCK_TIMEOUT):
    """The ``flock`` of the server of ``pgdata`` (``<home>/.<pgdata>.lock``), waited for ``timeout`` s at most (a
    context manager; raises :class:`~feiqiu_etl.db.embedded.errors.EmbeddedServerError` when it stays busy)."""
    return flocked(pgdata.parent / f".{pgdata.name}.lock", timeout, f"the embedded server of {pgdata}")


def postmaster(pgdata: Path) -> tuple[int, Path | None, str] | None:
    """(pid, socket folder, status) of a live postmaster of ``pgdata``, from ``postmaster.pid``; else None."""
    import psutil

    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    if pid <= 0:  # a single-user backend (-pid) setting the password: no server to join
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or "postgres" not in proc.name():
            return None  # a killed postmaster not yet reaped by the process that started it, or a reused pid
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:
        pass
    socket_folder = Path(lines[4].split(",")[0].strip()) if len(lines) > 4 and lines[4].strip() else None
    status = lines[7].strip() if len(lines) > 7 else ""
    return pid, socket_folder, status


def start_watcher(pgdata: Path, postmaster_pid: int) -> None:
    """Start the watcher (:mod:`.watcher`, run as a process) of the server ``postmaster_pid`` on ``pgdata``
    (detached; never raises: a server without a watcher is stopped by its last user, or by the next command, as
    before)."""
    env = {name: value for name, value in os.environ.items()
           if name in ("PATH", "LANG", "TZ", "PYTHONPATH", "HOME") or name.startswith("LC_")}
    try:
        subprocess.Popen([sys.executable, "-m", "feiqiu_etl.db.embedded.watcher", str(pgdata), str(postmaster_pid)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                         cwd="/", start_new_session=True, close_fds=True)
    except OSError as exc:
        log.warning("embedded PostgreSQL: no watcher (%s); the last command using the server stops it", exc)


def is_frozen(pid: int) -> bool:
    """True when process ``pid`` is stopped (``SIGSTOP``): waiting for it to act would wait until it continues."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def shutdown_postmaster(pgdata: Path, *, wait: bool = True) -> None:
    """Fast shutdown of the postmaster of ``pgdata`` (SIGINT), then immediate (SIGQUIT) after
    :data:`STOP_TIMEOUT` s. Without ``wait``, or when the server is stopped (``SIGSTOP``: it would take the
    signal only when it continues), the signal is sent and nothing waits for it."""
    import psutil

    running = postmaster(pgdata)
    pid = running[0] if running else None
    if pid is None:
        return
    try:
        proc = psutil.Process(pid)
        os.kill(pid, signal.SIGINT)
        if not wait:
            return
        if is_frozen(pid):
            log.warning("embedded PostgreSQL (pid %d) is stopped (SIGSTOP): it shuts down when it continues", pid)
            return
        try:
            proc.wait(STOP_TIMEOUT)
        except psutil.TimeoutExpired:
            log.warning("embedded PostgreSQL did not stop in %.0f s; stopping it immediately", STOP_TIMEOUT)
            os.kill(pid, signal.SIGQUIT)
            proc.wait(STOP_TIMEOUT)
    except (psutil.Error, ProcessLookupError):
        pass
