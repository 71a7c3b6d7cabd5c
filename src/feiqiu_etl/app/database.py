"""The warehouse a request runs against, bounded: the DSN given, or a database on the embedded server started
here and stopped at exit; one bounded, cancellable connect before any request; connections with the run's
connect timeout and session limits (and a revived embedded server after a kill -9).

Nothing here waits unbounded: a frozen server is a :class:`~feiqiu_etl.app.errors.UsageFailure` after its
connect timeout plus :data:`PREPARE_GRACE`. The cleanups a second signal must run (stop the embedded server this
process started) are listed in :data:`HARD_ABORT` (:func:`on_hard_abort`); the signal handling itself is the
command line's (:mod:`feiqiu_etl.cli.signals`)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator

import psycopg

from feiqiu_etl.app.errors import CancelledEarly, UsageFailure
from feiqiu_etl.db.connection import DEFAULT_CONNECT_TIMEOUT
from feiqiu_etl.db.embedded import DEFAULT_DATABASE
from feiqiu_etl.errortext import one_line
from feiqiu_etl.pipeline.cancellation import CancellationToken

HARD_ABORT: list[Callable[[], None]] = []
"""Cleanups a second signal runs before exiting (e.g. stop the embedded server this process started)."""


@contextlib.contextmanager
def _listed(items: list, item: Any) -> Iterator[None]:
    """``item`` is in ``items`` while the body runs."""
    items.append(item)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            items.remove(item)


def on_hard_abort(fn: Callable[[], None]):
    """While the body runs, a second signal runs ``fn`` before exiting."""
    return _listed(HARD_ABORT, fn)


@contextlib.contextmanager
def database(dsn: str | None, name: str = DEFAULT_DATABASE, *, reader: bool = False,
             prepare: Callable[[str], None] | None = None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
             cancellation: CancellationToken | None = None) -> Iterator[str]:
    """``--dsn`` / ``ETL_DB_DSN`` if given, else database ``name`` on an embedded server started here and
    stopped at exit (also on a hard abort): as its superuser, or with ``reader`` as its read-only role
    ``feiqiu_reader``; ``prepare(superuser_dsn)`` runs first on the embedded server only. A server that
    cannot be prepared or started is a ``UsageFailure`` (one line, exit 2) — also one that is running but does
    not answer (frozen): its preparation is given ``connect_timeout`` + :data:`PREPARE_GRACE` s in all; a cancel
    of ``cancellation`` meanwhile ends it at once (:class:`CancelledEarly`, exit 5)."""
    if dsn:
        yield dsn
        return
    from feiqiu_etl.db.embedded import EmbeddedServerError, default_embedded

    try:
        server = default_embedded().start()
    except EmbeddedServerError as exc:
        raise UsageFailure(str(exc)) from None
    try:
        with on_hard_abort(server.abandon), _reviving(server):
            def prepared() -> str:
                real_dsn = server.ensure_database(name, connect_timeout=connect_timeout)
                if prepare is not None:
                    prepare(real_dsn)
                return server.reader_dsn(name, connect_timeout=connect_timeout) if reader else real_dsn

            try:
                real_dsn = bounded(prepared, connect_timeout + PREPARE_GRACE, cancellation,
                                   "cancelled while starting PostgreSQL; nothing was run")
            except TimeoutError:
                raise UsageFailure(f"embedded PostgreSQL is running but does not answer "
                                   f"(not within {connect_timeout + PREPARE_GRACE:g} s): is it stopped "
                                   f"(SIGSTOP) or overloaded?") from None
            except EmbeddedServerError as exc:
                raise UsageFailure(str(exc)) from None
            except psycopg.Error as exc:
                raise UsageFailure(f"embedded PostgreSQL: {one_line(exc, None, with_type=False)}") from None
            yield real_dsn
    finally:
        server.stop()


PREPARE_GRACE = 3.0
"""Seconds the embedded database's preparation (create the database, the reader role) may take beyond one
connect timeout before the server counts as not answering."""


def bounded(work: Callable[[], Any], limit: float, cancellation: CancellationToken | None, cancelled: str) -> Any:
    """``work()`` in a daemon thread, waited for at most ``limit`` s: its result, or its exception re-raised;
    ``TimeoutError`` when it is still busy then (a server that stopped answering: the thread is left behind,
    bounded by its own connect timeout), :class:`CancelledEarly` (``cancelled``) as soon as ``cancellation``
    is cancelled. The waiting thread (the main one) stays free for signals."""
    outcome: dict[str, Any] = {}

    def attempt() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the waiting thread
            outcome["error"] = exc

    worker = threading.Thread(target=attempt, name="db-bounded", daemon=True)
    worker.start()
    end = time.monotonic() + limit
    while worker.is_alive():
        worker.join(0.1)
        if cancellation is not None and cancellation.is_cancelled and worker.is_alive():
            raise CancelledEarly(cancelled)
        if worker.is_alive() and time.monotonic() >= end:
            raise TimeoutError(f"not done within {limit:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


_REVIVE: list[Any] = []  # embedded servers this process started, while their commands run


def _reviving(server: Any):
    return _listed(_REVIVE, server)


def connector_for(timeout: float, limits=None) -> Callable[[str], psycopg.Connection]:
    """A ``connect(dsn)`` with the configured connect timeout (s) and Asia/Shanghai sessions (with ``limits``, a
    :class:`~feiqiu_etl.db.connection.DbLimits`: the run's session limits and TCP keepalives too). When a
    connection fails and an embedded server this process started has died (kill -9), that server is started
    again first, so ``DatabaseHealth``'s reconnect finds it (the run goes on instead of waiting out
    ``db.unavailable_limit``)."""
    from feiqiu_etl.db.connection import connect

    def open_connection(dsn: str) -> psycopg.Connection:
        try:
            return connect(dsn, connect_timeout=timeout, limits=limits)
        except psycopg.OperationalError:
            revived = False
            for server in list(_REVIVE):
                with contextlib.suppress(Exception):  # a failed restart is one more failed attempt
                    revived = server.revive() or revived
            if not revived:
                raise
            return connect(dsn, connect_timeout=timeout, limits=limits)

    return open_connection


def check_database(dsn: str, cancellation: CancellationToken | None = None, timeout: float = 10.0) -> None:
    """Connect once before any request, within ``timeout`` seconds and cancellable: an unreachable or silent
    database is a one-line error (exit 2); a cancel while connecting ends the command (exit 5)."""
    from feiqiu_etl.db.connection import connect, no_answer, redact_dsn, scrub

    def attempt() -> int:
        with connect(dsn, connect_timeout=timeout) as conn:
            return conn.info.server_version

    try:
        version = bounded(attempt, timeout + PREPARE_GRACE, cancellation,
                          "cancelled while connecting to PostgreSQL; nothing was run")
    except CancelledEarly:
        raise
    except Exception as error:  # noqa: BLE001 - one line, whatever it is (a signal's KeyboardInterrupt is not:
        # it ends the command as a cancel, exit 5 — it once became "cannot connect …: KeyboardInterrupt")
        silent = no_answer(error, timeout)
        if silent:
            raise UsageFailure(f"{silent} ({redact_dsn(dsn)}): frozen or overloaded?") from None
        reason = scrub(one_line(error, None, with_type=False), dsn)
        raise UsageFailure(f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): {reason}") from None
    if version < 130000:
        raise UsageFailure(f"PostgreSQL >= 13 is required, the server is {version // 10000}")


def db_error(exc: BaseException, dsn: str) -> str:
    """The database error on one line, the DSN's password scrubbed."""
    from feiqiu_etl.db.connection import scrub

    return scrub(one_line(exc, with_type=False), dsn)
