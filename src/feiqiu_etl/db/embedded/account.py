"""The OS account the embedded server runs as, and running PostgreSQL's programs as that account.

PostgreSQL refuses to run as root, so a root process runs its server as the system account ``feiqiu_etl_pg``
(created with ``useradd`` when missing), in its own group only: no supplementary groups, so never in root's
group. A normal user's server runs as that user (``None`` stands for "this process's user" everywhere in
this package). Programs run with a clean environment (locale and time zone only, never the caller's tokens),
umask 077 and cwd ``/``. Whether the account can enter a folder is found out by trying (``cd`` as the
account) or by reading mode bits, never by changing a mode.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from feiqiu_etl.db.embedded.errors import EmbeddedServerError
from feiqiu_etl.db.embedded.locks import flocked

SERVER_ACCOUNT = "feiqiu_etl_pg"
#: Serialises the creation of the account: two concurrent ``useradd`` of one name can both "succeed" (each
#: writes its own uid, the last write wins), and the loser then runs the server as a uid that no longer exists
#: (seen with two pytest workers on a fresh machine). A root-only folder, so nobody else can hold the lock.
ACCOUNT_LOCK = Path("/var/lib/.feiqiu-etl-account.lock")
ACCOUNT_LOCK_TIMEOUT = 60.0  # seconds another process may spend creating the account (useradd takes ~0.1 s)
#: Accounts that may own an existing data folder when running as root (older versions used the second).
ACCEPTED_ACCOUNTS = (SERVER_ACCOUNT, "embedded_postgres")


@dataclass(frozen=True)
class Account:
    """An OS account: its name, uid and primary gid."""

    name: str
    uid: int
    gid: int


def account_by_uid(uid: int) -> Account | None:
    """The account of ``uid``, or None when the system does not know it."""
    import pwd

    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return None
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid)


def existing_server_account() -> Account | None:
    """``feiqiu_etl_pg`` if it exists (nothing is created: for ``config show``)."""
    import pwd

    try:
        entry = pwd.getpwnam(SERVER_ACCOUNT)
    except KeyError:
        return None
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid)


def ensure_server_account() -> Account:
    """``feiqiu_etl_pg``, created as a system account (no login shell, no home) when missing. Raises
    :class:`EmbeddedServerError` when it cannot be created."""
    existing = existing_server_account()
    if existing is not None:
        return existing
    useradd = shutil.which("useradd")
    if useradd is None:
        raise EmbeddedServerError(
            f"running as root, the embedded server needs the system account {SERVER_ACCOUNT} and useradd is "
            "not available: create the account, run as a normal user, or use --dsn")
    with flocked(ACCOUNT_LOCK, ACCOUNT_LOCK_TIMEOUT, f"the creation of the system account {SERVER_ACCOUNT}"):
        existing = existing_server_account()  # made by another process while this one waited
        if existing is not None:
            return existing
        try:
            proc = subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir",
                                   "/nonexistent", "--shell", "/usr/sbin/nologin", SERVER_ACCOUNT],
                                  capture_output=True, text=True, timeout=ACCOUNT_LOCK_TIMEOUT)
        except (OSError, subprocess.SubprocessError) as exc:
            raise EmbeddedServerError(f"cannot create the system account {SERVER_ACCOUNT}: {exc}") from None
        created = existing_server_account()
    if created is None:
        reason = " ".join(proc.stderr.split()) or f"exit {proc.returncode}"
        raise EmbeddedServerError(f"cannot create the system account {SERVER_ACCOUNT}: {reason}")
    return created


def server_env() -> dict[str, str]:
    """The environment of the server's processes: locale and time zone only (never the caller's tokens)."""
    env = {"PATH": "/usr/bin:/bin"}
    for name, value in os.environ.items():
        if (name in ("LANG", "TZ") or name.startswith("LC_")) and len(value) <= 256 and "\0" not in value:
            env[name] = value
    return env


def as_account(account: Account | None) -> dict:
    """``subprocess`` keyword arguments that run a program as ``account``, with its group only."""
    if account is None:
        return {}
    return {"user": account.uid, "group": account.gid, "extra_groups": []}


def run_as(args: list[str], account: Account | None, *, input: str | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a program as ``account`` (umask 077, clean environment, cwd ``/``), at most ``timeout`` seconds;
    output captured through a file (PostgreSQL's tools can hold pipes open). Raises
    :class:`EmbeddedServerError` when it cannot be run or times out."""
    with tempfile.TemporaryFile("w+") as out:
        try:
            stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
            proc = subprocess.run(args, **stdin, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                                  env=server_env(), umask=0o077, cwd="/", **as_account(account))
        except (OSError, subprocess.SubprocessError) as exc:
            raise EmbeddedServerError(f"cannot run {Path(args[0]).name}: {exc}") from None
        out.seek(0)
        return subprocess.CompletedProcess(args, proc.returncode, out.read(), "")


def first_problem(output: str) -> str:
    """The most telling line of a PostgreSQL tool's output (FATAL/ERROR/error first)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for marker in ("FATAL:", "PANIC:", "ERROR:", "error:"):
        for line in lines:
            if marker in line:
                return line
    return lines[-1] if lines else "no output"


def can_enter(account: Account | None, folder: Path) -> bool:
    """Whether ``account`` can enter ``folder``, found out by trying (``cd`` as the account, at most 30 s)."""
    if account is None:
        return os.access(folder, os.X_OK)
    return run_as(["/bin/sh", "-c", 'cd -- "$1"', "sh", str(folder)], account, timeout=30).returncode == 0


def blocking_parent(path: Path, account: Account | None) -> Path | None:
    """The first folder on the way to ``path`` that ``account`` cannot enter by its mode bits, if any (None for
    ``account``: an account that owns none of them and is in none of their groups)."""
    for folder in [*reversed(path.parents), path]:
        try:
            st = folder.stat()
        except OSError:
            return folder
        if account is not None and st.st_uid == account.uid:
            ok = st.st_mode & stat.S_IXUSR
        elif account is not None and st.st_gid == account.gid:
            ok = st.st_mode & stat.S_IXGRP
        else:
            ok = st.st_mode & stat.S_IXOTH
        if not ok:
            return folder
    return None


def closed_to_others(folder: Path) -> str:
    """`` (/x is closed to other users, mode 0700)`` for a folder that exists, else ``""``."""
    try:
        return f" ({folder} is closed to other users, mode {stat.S_IMODE(folder.stat().st_mode):04o})"
    except OSError:
        return ""


def check_reachable(account: Account, folder: Path, binaries: Path) -> None:
    """Refuse (one line) when ``account`` cannot enter ``folder`` or run the PostgreSQL in ``binaries``."""
    probe = run_as(["/bin/sh", "-c", 'cd -- "$1" && test -x "$2"', "sh", str(folder), str(binaries / "postgres")],
                   account, timeout=30)
    if probe.returncode == 0:
        return
    blocked = blocking_parent(folder, account) or blocking_parent(binaries / "postgres", account)
    where = closed_to_others(blocked) if blocked is not None else ""
    let_pass = f"let other users pass through {blocked} (chmod o+x {blocked}), " if blocked is not None else ""
    raise EmbeddedServerError(
        f"running as root, the embedded server runs as {account.name}, which cannot reach {folder} or the "
        f"PostgreSQL binaries{where}; feiqiu-etl changes no permission of folders it did not create: "
        f"{let_pass}choose a data folder under open folders, or use --dsn")
