"""Connection helpers: one psycopg connection per thread, sessions in Asia/Shanghai (warehouse-model §1)."""

from __future__ import annotations

import re

import psycopg

SESSION_TIME_ZONE = "Asia/Shanghai"


def connect(dsn: str, *, autocommit: bool = False) -> psycopg.Connection:
    """Open a connection with ``TIME ZONE 'Asia/Shanghai'``. Raises ``psycopg.OperationalError``."""
    conn = psycopg.connect(dsn, autocommit=autocommit, options=f"-c TimeZone={SESSION_TIME_ZONE}")
    return conn


_PASSWORD_IN_URI = re.compile(r"(://[^:/@]*:)[^@]*(@)")
_PASSWORD_KV = re.compile(r"(password\s*=\s*)(\S+)", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***`` (safe for logs and error messages)."""
    return _PASSWORD_KV.sub(r"\1***", _PASSWORD_IN_URI.sub(r"\1***\2", dsn))
