"""The embedded PostgreSQL server of one data folder: start or join it, hand out DSNs, stop it when the last
user leaves, start it again when it died under a running command.

:class:`EmbeddedPostgres` puts the other modules of this package together: the account the server runs as,
the binaries it runs, the passfile, the socket folder and the list of processes using it. The first process
initialises the data folder (``initdb``), writes ``pg_hba.conf`` (Unix socket, SCRAM for every role) and
starts ``postgres`` with no TCP port (:mod:`.cluster`); later processes join it, and the last one stops it
(:mod:`.postmaster`). All of this happens under an ``flock`` on ``<home>/.<pgdata>.lock``. Every failure is an
:class:`EmbeddedServerError` with one line. This module never logs a password and never passes the caller's environment (tokens) to the server.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from feiqiu_etl.db.connection import DEFAULT_CONNECT_TIMEOUT as CONNECT_TIMEOUT
from feiqiu_etl.db.embedded.account import (
    ACCEPTED_ACCOUNTS, SERVER_ACCOUNT, Account, account_by_uid, check_reachable, ensure_server_account,
)
from feiqiu_etl.db.embedded.binaries import server_bin_dir
from feiqiu_etl.db.embedded.cluster import hba_is_ours, prepare_cluster, spawn_postgres, wait_ready
from feiqiu_etl.db.embedded.errors import EmbeddedServerError
from feiqiu_etl.db.embedded.folders import make_home, remove_dir
from feiqiu_etl.db.embedded.handles import live_users, write_users
from feiqiu_etl.db.embedded.layout import HOME_ENV, ServerLayout, etl_home, record_home, resolve_layout
from feiqiu_etl.db.embedded.passwords import READER, SUPERUSER, read_secrets, secret_file
from feiqiu_etl.db.embedded.postmaster import (
    is_frozen, postmaster, server_lock, shutdown_postmaster, start_watcher,
)
from feiqiu_etl.db.embedded.reader import ensure_reader_role
from feiqiu_etl.db.embedded.socket_dir import PORT, SOCKET_NAME, is_temporary, socket_dir
from feiqiu_etl.errortext import one_line

log = logging.getLogger(__name__)

DEFAULT_DATABASE = "feiqiu_etl"
DEMO_DATABASE = "feiqiu_demo"
"""``feiqiu-etl demo``'s own database on the embedded server: never mixed with real runs."""
# Characters a data folder path may hold: PostgreSQL's tools paste paths into shell commands.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_.,+@%=:/~ -]+$")

_KEEP: list[subprocess.Popen] = []
_REVIVE_LOCK = threading.Lock()


@dataclass(frozen=True)
class ServerStatistics:
    """Snapshot of an :class:`EmbeddedPostgres`: the postmaster's pid (None when not started), its socket
    folder, the OS account it runs as, how many processes use it, and its data folder."""

    pid: int | None
    socket_dir: str | None
    account: str | None
    users: int
    pgdata: str | None = None


@dataclass(eq=False)
class EmbeddedPostgres:
    """A running embedded PostgreSQL server; use as a context manager, it stops at exit.

    ``pgdata`` is the data folder; its parent is the server's *home* (passfile, socket folder, lock).
    :meth:`start` initialises the cluster on first use, or joins a server another process already runs on
    ``pgdata``; :meth:`stop` stops it when no other live process uses it. ``dsn(database)`` is a libpq
    connection string for the superuser (``reader_dsn`` for the read-only role); neither carries a password
    (``passfile=``). ``layout`` says which user's home it serves when the data folder was moved out of it
    (:func:`default_embedded`). Raises :class:`EmbeddedServerError` (one line) when the server cannot be
    prepared or started; as root, also when its account cannot reach ``pgdata`` (no folder's mode is changed).
    """

    pgdata: Path
    layout: ServerLayout | None = field(default=None, repr=False)
    _socket_dir: Path | None = field(default=None, repr=False)
    _pid: int | None = field(default=None, repr=False)
    _account: Account | None = field(default=None, repr=False)
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
        account = ensure_server_account() if os.geteuid() == 0 else None
        if self.layout is not None and self.layout.moved:
            make_home(self.layout.home, account)  # the user's home exists as it would with its data in it
        make_home(self.home, account)  # the server account may enter a home made here, nobody else
        if self.layout is not None and self.layout.moved:
            record_home(self.layout)
        account = self._owner_account(account)  # before the lock file: it would belong to the other user
        with self._locked():
            self._account = account
            self._passfile, passwords, new_secret = secret_file(self.home)
            for child in list(_KEEP):  # reap servers this process started that have died since
                if child.poll() is not None:
                    _KEEP.remove(child)
            running = postmaster(self.pgdata)
            if running is not None and running[2] == "ready":
                self._join(running)  # its binaries were checked when it was launched: no walk over them now
            else:  # (as root that walk over the private copy is a tenth of a second of every command)
                binaries = server_bin_dir(account)
                if account is not None:
                    check_reachable(account, self.pgdata if self.pgdata.exists() else self.home, binaries)
                self._launch(binaries, passwords, new_secret)
            write_users(self.pgdata, [*(u for u in live_users(self.pgdata) if u != os.getpid()), os.getpid()])
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
            users = [u for u in live_users(self.pgdata) if u != os.getpid()]  # once, even if listed twice
            write_users(self.pgdata, users)
            if not users:
                self._shutdown()
        self._pid = None
        self._reader_ready = False

    def __enter__(self) -> "EmbeddedPostgres":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def statistics(self) -> ServerStatistics:
        users = len(live_users(self.pgdata)) if self._pid is not None else 0
        return ServerStatistics(self._pid, str(self._socket_dir) if self._socket_dir else None,
                                self._account.name if self._account else None, users, str(self.pgdata))

    # -------------------------------------------------------------------------------------- DSNs
    def dsn(self, database: str = DEFAULT_DATABASE, *, user: str = SUPERUSER) -> str:
        """libpq keyword DSN for ``database`` as ``user``; the password comes from the passfile (the empty
        ``password=''`` only keeps libpq from sending ``$PGPASSWORD`` instead)."""
        if self._pid is None or self._socket_dir is None:
            raise EmbeddedServerError("the embedded server is not started")
        return make_conninfo(host=str(self._socket_dir), port=PORT, dbname=database, user=user,
                             passfile=str(self._passfile), password="")

    def ensure_database(self, database: str = DEFAULT_DATABASE, *, connect_timeout: float = CONNECT_TIMEOUT) -> str:
        """Create ``database`` if missing (connecting within ``connect_timeout`` s); return its superuser DSN."""
        try:
            create_database(self.dsn("postgres"), database, connect_timeout=connect_timeout)
        except psycopg.Error as exc:
            from feiqiu_etl.db.connection import no_answer

            silent = no_answer(exc, connect_timeout)
            if silent:  # it runs (its pid answers) but says nothing: frozen or overloaded, not a missing database
                raise EmbeddedServerError(f"embedded {silent} (its server runs but is frozen or overloaded)") \
                    from None
            raise EmbeddedServerError(f"embedded PostgreSQL: cannot create database {database}: "
                                      f"{one_line(exc, None, with_type=False)}") from None
        return self.dsn(database)

    def reader_dsn(self, database: str = DEFAULT_DATABASE, *, connect_timeout: float = CONNECT_TIMEOUT) -> str:
        """DSN of the read-only role ``feiqiu_reader`` for ``database`` (created, or reset, and granted
        SELECT on the database's schemas with ``default_transaction_read_only`` once per start, idempotently,
        one command at a time: :func:`ensure_reader_role`; connecting within ``connect_timeout`` s). The role is
        no superuser and has none of ``pg_execute_server_program``/``pg_write_server_files``, so it can
        neither run programs nor write files on the server (``COPY … TO PROGRAM`` / ``TO 'file'``)."""
        if not self._reader_ready:
            passwords = read_secrets(self._passfile)  # type: ignore[arg-type]
            try:  # under the home's lock: two commands changing the role at once fail ("tuple concurrently updated")
                with self._locked(), psycopg.connect(self.dsn(database), autocommit=True,
                                                    connect_timeout=_whole(connect_timeout)) as conn:
                    ensure_reader_role(conn, READER, passwords[READER])
            except psycopg.Error as exc:
                raise EmbeddedServerError(f"embedded PostgreSQL: cannot prepare the read-only role: "
                                          f"{one_line(exc, None, with_type=False)}") from None
            self._reader_ready = True
        return self.dsn(database, user=READER)

    # -------------------------------------------------------------------------------------- internals
    def _locked(self):
        return server_lock(self.pgdata)

    def _owner_account(self, account: Account | None) -> Account | None:
        """The account the server of an existing ``pgdata`` runs as; refuses a folder of another user."""
        try:
            st = os.lstat(self.pgdata)
        except FileNotFoundError:
            return account
        except OSError as exc:
            raise EmbeddedServerError(f"cannot read {self.pgdata}: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise EmbeddedServerError(f"{self.pgdata} exists and is not a folder")
        owner = account_by_uid(st.st_uid)
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
        pid, folder, _ = running
        owner = self._account.uid if self._account else os.geteuid()
        try:
            st = os.lstat(folder) if folder else None
        except OSError:
            st = None
        try:
            sock_mode = os.stat(folder / SOCKET_NAME).st_mode if folder else 0o777
        except OSError:
            sock_mode = 0o777
        private = (st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == owner and not st.st_mode & 0o077
                   and not sock_mode & 0o077 and hba_is_ours(self.pgdata))
        if not private:
            raise EmbeddedServerError(
                f"a PostgreSQL server (pid {pid}) runs on {self.pgdata} without a private socket or password "
                f"authentication (socket folder {folder}); an older version probably started it: stop it "
                f"(kill -INT {pid}) and start again")
        self._pid, self._socket_dir = pid, folder

    def _launch(self, binaries: Path, passwords: dict[str, str], new_secret: bool) -> None:
        """Prepare the data folder (:func:`~feiqiu_etl.db.embedded.cluster.prepare_cluster`), launch its
        postmaster, wait until it is ready and start its watcher."""
        account = self._account
        prepare_cluster(self.pgdata, binaries, account, passwords[SUPERUSER], new_secret)
        folder, temporary = socket_dir(self.home, account)
        try:
            self._process = spawn_postgres(binaries, self.pgdata, folder, account)
        except OSError as exc:
            remove_dir(folder) if temporary else None
            raise EmbeddedServerError(f"cannot start the embedded PostgreSQL server: {exc}") from None
        _KEEP.append(self._process)  # never collected while it runs (no ResourceWarning)
        # Reap it the moment it exits (e.g. kill -9): a zombie keeps its pid alive, and PostgreSQL then refuses
        # every restart ("lock file postmaster.pid already exists") while this process lives.
        threading.Thread(target=self._process.wait, name="embedded-pg-reaper", daemon=True).start()
        try:
            wait_ready(self._process, self.pgdata)
        except EmbeddedServerError:
            if temporary:
                remove_dir(folder)
            raise
        self._pid, self._socket_dir = self._process.pid, folder
        start_watcher(self.pgdata, self._process.pid)  # stops it once no user lives (a user killed with -9 too)

    def _shutdown(self) -> None:
        """Stop the postmaster (:func:`shutdown_postmaster`) and reap it if this process started it."""
        shutdown_postmaster(self.pgdata)
        if self._process is not None:
            if self._process.poll() is None and not is_frozen(self._process.pid):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(5)  # reap our child
            if self._process.poll() is not None:
                with contextlib.suppress(ValueError):
                    _KEEP.remove(self._process)
            self._process = None
        if self._socket_dir is not None and is_temporary(self._socket_dir):
            remove_dir(self._socket_dir)

    def abandon(self) -> None:
        """Leave at once, waiting for nothing (a second signal): drop this process from the users if the lock is
        free within 0.2 s and, when it was the last user, ask the postmaster for a fast shutdown (SIGINT) without
        waiting for it. Whatever this cannot do, the server's watcher does once this process is gone
        (:mod:`.watcher`)."""
        if self._pid is None:
            return
        atexit.unregister(self.stop)
        with contextlib.suppress(EmbeddedServerError):
            with server_lock(self.pgdata, 0.2):
                users = [u for u in live_users(self.pgdata) if u != os.getpid()]
                write_users(self.pgdata, users)
                if not users:
                    shutdown_postmaster(self.pgdata, wait=False)
        self._pid = None


def create_database(admin_dsn: str, database: str, *, drop_first: bool = False,
                    connect_timeout: float = CONNECT_TIMEOUT) -> None:
    """CREATE DATABASE ``database`` on the server of ``admin_dsn`` unless it exists; a server that does not answer
    within ``connect_timeout`` s is a ``psycopg.OperationalError`` (a frozen server is never waited for)."""
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=_whole(connect_timeout)) as conn:
        if drop_first:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def _whole(seconds: float) -> int:
    """libpq's ``connect_timeout`` is whole seconds, at least 1 (0 would mean: wait forever)."""
    return max(1, round(seconds))


def home_layout(home: Path | None = None) -> ServerLayout:
    """Where the server of ``home`` (default :func:`etl_home`) keeps its data (:func:`resolve_layout`); as root
    this creates the server account when missing. Raises :class:`EmbeddedServerError`."""
    account = ensure_server_account() if os.geteuid() == 0 else None
    return resolve_layout(etl_home() if home is None else home, account)


def default_embedded() -> EmbeddedPostgres:
    """The (not yet started) server of this user's home, at the data folder :func:`home_layout` picks."""
    layout = home_layout()
    return EmbeddedPostgres(layout.pgdata, layout)


@contextlib.contextmanager
def temporary_server(prefix: str = "feiqiu-pg-home-") -> Iterator[EmbeddedPostgres]:
    """A started server whose home is a new folder in the temp dir, stopped and removed afterwards (tests,
    benchmarks). The home is created here, so it is made enterable for the server account when run as root;
    if the temp dir itself is closed to that account, the data goes where :func:`resolve_layout` moves it."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    layout = None
    try:
        if os.geteuid() == 0:
            os.chown(home, -1, ensure_server_account().gid)
            os.chmod(home, 0o710)
        layout = home_layout(home)
        server = EmbeddedPostgres(layout.pgdata, layout).start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(home, ignore_errors=True)
        if layout is not None and layout.moved:
            shutil.rmtree(layout.pgdata.parent, ignore_errors=True)
