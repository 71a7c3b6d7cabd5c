"""The two kinds of database failure a run tells apart: a connection error, which a fresh connection may cure
(the server restarted, a backend was terminated, the network broke, the server froze, the disk is full for a
moment), and everything else (bad data, bad SQL), which a retry would only repeat — and
:class:`DatabaseUnavailable`, raised once the database stayed away past the run's limit.
"""

from __future__ import annotations

import psycopg

_RETRY_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53100", "53200", "53300", "40001", "40P01", "25P03")
"""Connection exceptions, admin/crash shutdown, cannot connect now, disk full, out of memory, too many
connections, serialization failure, deadlock, idle-in-transaction timeout: worth a reconnect and a retry."""


class DatabaseUnavailable(Exception):
    """The database stayed unreachable past the run's limit (or the run was cancelled while waiting)."""


def is_connection_error(exc: BaseException) -> bool:
    """True for errors that a fresh connection may cure (not for bad data or SQL). A pool checkout that timed
    out (``psycopg_pool.PoolTimeout``) is one."""
    if isinstance(exc, DatabaseUnavailable):
        return False
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate:
        return sqlstate.startswith(_RETRY_SQLSTATES)
    if isinstance(exc, psycopg.OperationalError):
        return True
    if isinstance(exc, psycopg.InterfaceError):
        return "connection" in str(exc).lower()
    return False
