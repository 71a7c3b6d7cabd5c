"""The embedded server's two roles and their passwords: SCRAM-SHA-256 verifiers for the server, a passfile
for the clients.

The roles are ``postgres`` (superuser, for the ETL) and ``feiqiu_reader`` (read-only, for ``feiqiu-etl sql``).
Their passwords are random, generated here on first use and kept in ``<home>/pgpass`` (mode 0600, libpq's
passfile format ``*:*:*:role:password``); the server only ever sees a verifier (:func:`scram_verifier`), and
DSNs name the passfile instead of carrying a password. Nothing here may log a password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from feiqiu_etl.db.embedded.errors import EmbeddedServerError

log = logging.getLogger(__name__)

SUPERUSER = "postgres"
READER = "feiqiu_reader"
SECRET_FILE = "pgpass"


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


def read_secrets(path: Path) -> dict[str, str]:
    """``{role: password}`` from a passfile written by :func:`write_secrets` (``*:*:*:role:password``)."""
    out: dict[str, str] = {}
    for line in path.read_text(encoding="ascii").splitlines():
        parts = line.split(":")
        if len(parts) == 5 and parts[:3] == ["*", "*", "*"] and parts[4]:
            out[parts[3]] = parts[4]
    return out


def write_secrets(path: Path, values: dict[str, str]) -> None:
    """Write the passfile atomically with mode 0600 (created that way: never readable by others)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write("# feiqiu-etl: passwords of the embedded server's roles (libpq passfile format). Keep it 0600.\n")
        f.writelines(f"*:*:*:{role}:{password}\n" for role, password in values.items())
    os.replace(tmp, path)


def secret_file(home: Path) -> tuple[Path, dict[str, str], bool]:
    """The passfile of ``home``, its passwords (one per role, generated when missing) and whether the
    superuser's was generated now. Refuses a passfile owned by someone else; tightens one whose mode drifted."""
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
            values = read_secrets(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise EmbeddedServerError(f"cannot read {path}: {exc}") from None
    created = SUPERUSER not in values
    missing = [role for role in (SUPERUSER, READER) if role not in values]
    if missing:
        for role in missing:
            values[role] = secrets.token_urlsafe(32)
        try:
            write_secrets(path, values)
        except OSError as exc:
            raise EmbeddedServerError(f"cannot write {path}: {exc.strerror}") from None
    return path, values, created
