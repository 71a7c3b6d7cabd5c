"""The read-only role of the embedded database, ``feiqiu_reader``, the role ``feiqiu-etl sql`` logs in as.

It may read the database's own schemas and nothing else: no superuser, no role membership, no
``pg_read_all_data`` (that covers the system catalogs and so the password verifiers in ``pg_authid``),
``default_transaction_read_only`` on, and in this database only superusers may take advisory locks or NOTIFY,
so a reader can neither hold a token's lane nor fake a cancel. Identifiers go through ``psycopg.sql``.
"""

from __future__ import annotations

import contextlib

import psycopg
from psycopg import sql

from feiqiu_etl.db.embedded.passwords import scram_verifier


def ensure_reader_role(conn: psycopg.Connection, role: str, password: str, *, lock_down: bool = True) -> None:
    """Create (or reset) login role ``role``: no superuser, no CREATEDB/CREATEROLE/REPLICATION/BYPASSRLS, no
    membership of any role, ``default_transaction_read_only`` on, password ``password`` (sent as a SCRAM
    verifier). It may read the database's own schemas: USAGE on each schema and SELECT on its tables and
    sequences, now and (default privileges of the role of ``conn``) for those created later. Not
    ``pg_read_all_data``: that covers the system catalogs too, so the role could read the server's password
    verifiers in ``pg_authid``. Nobody but superusers may take advisory locks or NOTIFY in this database.
    ``conn`` must be a superuser's, in autocommit mode, on the database the role
    reads. Idempotent. ``lock_down`` False leaves advisory locks and NOTIFY as they are (a database whose loading
    role may be no superuser: the web page's role, :func:`feiqiu_etl.web.reader.web_reader`)."""
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
    if not lock_down:
        return
    for (proc,) in conn.execute("SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname = 'pg_notify' "
                                "OR (p.proname LIKE 'pg%advisory%lock%' AND p.proname NOT LIKE '%unlock%')").fetchall():
        conn.execute(sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM PUBLIC").format(sql.SQL(proc)))
