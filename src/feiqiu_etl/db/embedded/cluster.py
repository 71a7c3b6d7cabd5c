"""A data folder made ready and its ``postgres`` launched: ``initdb`` on first use, ``pg_hba.conf`` (Unix socket,
SCRAM for every role), the superuser's password (single-user mode: no socket, no login), the server's command
line and the wait until it says it is ready.

Every program runs as the server's account (:func:`~feiqiu_etl.db.embedded.account.run_as`; ``account`` None: as
this process's user) with the server's environment only, never the caller's (tokens). Every failure is an
:class:`~feiqiu_etl.db.embedded.errors.EmbeddedServerError` with one line, except :func:`spawn_postgres`'s
``OSError`` (its caller cleans up first).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from feiqiu_etl.db.embedded.account import Account, as_account, first_problem, run_as, server_env
from feiqiu_etl.db.embedded.errors import EmbeddedServerError
from feiqiu_etl.db.embedded.folders import private_dir
from feiqiu_etl.db.embedded.passwords import SUPERUSER, scram_verifier
from feiqiu_etl.db.embedded.postmaster import START_TIMEOUT, postmaster
from feiqiu_etl.db.embedded.socket_dir import PORT, remove_stale_socket_dir

SHARED_BUFFERS_MAX_MB = 1024
HBA = ("# Written by feiqiu-etl at every start: Unix socket only, every role logs in with a password.\n"
       "local all all scram-sha-256\n")


def hba_is_ours(pgdata: Path) -> bool:
    """True when ``<pgdata>/pg_hba.conf`` is exactly :data:`HBA` (password authentication on the socket only)."""
    return _read_text(pgdata / "pg_hba.conf") == HBA


def prepare_cluster(pgdata: Path, binaries: Path, account: Account | None, superuser_password: str,
                    new_secret: bool) -> None:
    """Make ``pgdata`` ready to start: ``initdb`` when it has no cluster yet, a stale socket folder removed,
    ``pg_hba.conf`` written, and the superuser's password stored when the cluster is new, the secret is new
    (``new_secret``) or ``pg_hba.conf`` was not ours."""
    fresh = not (pgdata / "PG_VERSION").exists()
    if fresh:
        _initdb(pgdata, binaries, account)
    remove_stale_socket_dir(pgdata, account)
    needs_password = fresh or new_secret or not hba_is_ours(pgdata)
    _write_server_file(pgdata / "pg_hba.conf", HBA, account)
    if needs_password:
        _set_superuser_password(pgdata, binaries, superuser_password, account)


def spawn_postgres(binaries: Path, pgdata: Path, folder: Path, account: Account | None) -> subprocess.Popen:
    """Launch ``postgres`` on ``pgdata``: no TCP port, its socket in ``folder`` (0700), SCRAM passwords,
    :func:`shared_buffers_mb`; its output appended to ``<pgdata>/log`` (0600), in a session of its own. Does not
    wait for it (:func:`wait_ready`). Raises ``OSError``."""
    log_path = pgdata / "log"
    args = [str(binaries / "postgres"), "-D", str(pgdata), "-c", "listen_addresses=", "-c", f"port={PORT}",
            "-c", f"unix_socket_directories={folder}", "-c", "unix_socket_permissions=0700",
            "-c", "unix_socket_group=", "-c", "password_encryption=scram-sha-256",
            "-c", f"shared_buffers={shared_buffers_mb()}MB"]
    logfile = open(log_path, "a", encoding="utf-8")
    if account is not None:
        os.chown(log_path, account.uid, account.gid)
    os.chmod(log_path, 0o600)
    with logfile:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=logfile, stderr=logfile, env=server_env(),
                                umask=0o077, cwd="/", start_new_session=True, **as_account(account))


def wait_ready(process: subprocess.Popen, pgdata: Path) -> None:
    """Wait (at most :data:`~feiqiu_etl.db.embedded.postmaster.START_TIMEOUT` s) until the postmaster
    ``process`` just launched on ``pgdata`` says it is ready; if it exits or the time is up, it is killed and
    :class:`EmbeddedServerError` raised with the first problem of its log."""
    log_path = pgdata / "log"
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        running = postmaster(pgdata)
        if running is not None and running[0] == process.pid and running[2] == "ready":
            return
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
                process.wait()
            raise EmbeddedServerError(f"embedded PostgreSQL failed to start ({first_problem(_tail(log_path))}; "
                                      f"see {log_path})")
        time.sleep(0.05)


def shared_buffers_mb() -> int:
    """The embedded server's ``shared_buffers`` in MiB: an eighth of the machine's memory, between PostgreSQL's
    default 128 and :data:`SHARED_BUFFERS_MAX_MB`. A 1 M-row dimension and its indexes do not fit in the default
    128 MiB; measured one after the other (incremental SCD2 merges of the bench's 1 M-row dim_member), 1 GiB
    took 5.0 s instead of 7.5 s for 10 % changed keys and 0.96 s instead of 1.04 s for 1 %."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):
        return 128
    return max(128, min(SHARED_BUFFERS_MAX_MB, total // 8))


def _initdb(pgdata: Path, binaries: Path, account: Account | None) -> None:
    if account is not None:
        private_dir(pgdata, account)  # initdb as the account cannot create it in a root-owned home
    proc = run_as([str(binaries / "initdb"), "-D", str(pgdata), "-U", SUPERUSER, "--encoding=UTF8",
                   "--auth-local=peer", "--auth-host=reject"], account)
    if proc.returncode != 0:
        raise EmbeddedServerError(f"cannot initialise the embedded PostgreSQL data folder {pgdata}: "
                                  f"{first_problem(proc.stdout)}")


def _write_server_file(path: Path, text: str, account: Account | None) -> None:
    """Write a configuration file of the server (owned by its account, mode 0600)."""
    try:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if account is not None:
            os.chown(tmp, account.uid, account.gid)
        os.replace(tmp, path)
    except OSError as exc:
        raise EmbeddedServerError(f"cannot write {path}: {exc.strerror}") from None


def _set_superuser_password(pgdata: Path, binaries: Path, password: str, account: Account | None) -> None:
    """Store the superuser's password (as a SCRAM verifier) in single-user mode: no socket, no login."""
    statement = f"ALTER ROLE {SUPERUSER} WITH PASSWORD '{scram_verifier(password)}'\n"
    proc = run_as([str(binaries / "postgres"), "--single", "-D", str(pgdata), "-c", "listen_addresses=",
                   "-c", "log_statement=none", "postgres"], account, input=statement)
    problem = [line for line in proc.stdout.splitlines() if "ERROR:" in line or "FATAL:" in line]
    if proc.returncode != 0 or problem:
        raise EmbeddedServerError(f"cannot set the embedded server's password: {first_problem(proc.stdout)}")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _tail(path: Path, size: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
