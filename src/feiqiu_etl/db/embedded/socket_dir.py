"""The folder of the embedded server's Unix socket: private (0700, the server's account), with a short path.

The server listens on a Unix socket only (no TCP port). Its folder is ``<home>/run`` when the socket's path fits
(the kernel allows 107 bytes; we keep to :data:`SOCKET_PATH_MAX`), else ``/tmp/feiqiu-pg-<hash of the home>``
(``$XDG_RUNTIME_DIR`` instead of ``/tmp`` for a normal user when it is private and short), the same at every
start so a restarted server keeps its DSN, removed at stop; a name another user took is never used. This module
never changes a folder it did not create.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path

from feiqiu_etl.db.embedded.account import Account
from feiqiu_etl.db.embedded.errors import EmbeddedServerError
from feiqiu_etl.db.embedded.folders import private_dir, remove_dir

PORT = 5432
SOCKET_NAME = f".s.PGSQL.{PORT}"
#: Longest socket path we use, bytes (the kernel's sun_path holds 107 plus the NUL).
SOCKET_PATH_MAX = 100
TMP_SOCKET_PREFIX = "feiqiu-pg-"
# A socket folder path goes into the list setting unix_socket_directories: no spaces or commas there.
SAFE_SOCKET_PATH = re.compile(r"^[A-Za-z0-9_.+@%=:/~-]+$")


def socket_dir(home: Path, account: Account | None) -> tuple[Path, bool]:
    """A private (0700) folder with a short path for the server's socket, and whether it is a temporary
    one (removed at stop); see the module doc. Raises :class:`EmbeddedServerError` (one line)."""
    candidate = home / "run"
    if len(os.fsencode(candidate / SOCKET_NAME)) <= SOCKET_PATH_MAX and SAFE_SOCKET_PATH.match(str(candidate)):
        private_dir(candidate, account)
        return candidate, False
    base = Path("/tmp")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if account is None and runtime and len(os.fsencode(runtime)) <= 40 and SAFE_SOCKET_PATH.match(runtime):
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


def is_temporary(folder: Path) -> bool:
    """Whether ``folder`` is a temporary socket folder (removed when its server stops)."""
    return folder.name.startswith(TMP_SOCKET_PREFIX)


def remove_stale_socket_dir(pgdata: Path, account: Account | None) -> None:
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
            if is_temporary(old) and stat.S_ISDIR(st.st_mode) and st.st_uid == owner:
                remove_dir(old)
