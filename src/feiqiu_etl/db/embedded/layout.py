"""Where the embedded server of a home keeps its data folder, and the folder feiqiu-etl owns as root.

The home is ``$FEIQIU_ETL_HOME``, else ``/var/lib/feiqiu-etl`` for root, else ``<user data dir>/feiqiu-etl``.
Its data folder is ``<home>/pgdata``, except when root runs the server (as ``feiqiu_etl_pg``) and that
account cannot enter the home: a home under ``/root`` (mode 0700), one made by ``mktemp -d`` (0700), a home
under any closed folder. feiqiu-etl never opens a folder it did not create, so such a home's data folder, socket
folder, passfile and lock live in ``/var/lib/feiqiu-etl/homes/<hash of the home's real path>/`` instead (a file
``home`` there names the home). The choice is the same for every command on one home: data already in
``<home>/pgdata`` stays there, data already moved stays moved, so one home is one server and two homes are two
warehouses. Nothing here starts a server; :func:`resolve_layout` creates nothing.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from feiqiu_etl.db.embedded.account import Account, blocking_parent, can_enter
from feiqiu_etl.db.embedded.errors import EmbeddedServerError
from feiqiu_etl.db.embedded.folders import make_home

HOME_ENV = "FEIQIU_ETL_HOME"
#: The folder feiqiu-etl owns when run as root: root's default home, the private copies of the PostgreSQL
#: binaries (``pg-<version>-<digest>``) and the data of homes the server account cannot enter (``homes/``).
PRODUCT_ROOT = Path("/var/lib/feiqiu-etl")
ROOT_HOME = PRODUCT_ROOT
DATA_FOLDER = "pgdata"
MOVED_HOMES = "homes"
HOME_RECORD = "home"


def etl_home() -> Path:
    """Folder for persistent state: ``$FEIQIU_ETL_HOME``, else ``/var/lib/feiqiu-etl`` as root (root's own home
    is closed to the server account), else the user data dir."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser()
    if os.geteuid() == 0:
        return ROOT_HOME
    import platformdirs

    return Path(platformdirs.user_data_dir("feiqiu-etl", appauthor=False))


@dataclass(frozen=True)
class ServerLayout:
    """Where the server of ``home`` keeps its data: ``pgdata`` (its parent holds the passfile, the socket
    folder ``run`` and the lock) and, when that is not ``<home>/pgdata``, why (one line)."""

    home: Path
    pgdata: Path
    moved_because: str | None = None

    @property
    def moved(self) -> bool:
        return self.moved_because is not None


def moved_home(home: Path, root: Path = PRODUCT_ROOT) -> Path:
    """The folder in ``root`` for a home the server account cannot enter: ``homes/<16 hex of sha256 of the
    home's real path>`` (two spellings of one home give one folder, two homes two)."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(home))).hexdigest()[:16]
    return root / MOVED_HOMES / digest


def resolve_layout(home: Path, account: Account | None, *, as_root: bool | None = None,
                   root: Path = PRODUCT_ROOT) -> ServerLayout:
    """The data folder of ``home``'s server (see the module doc). ``as_root`` defaults to whether this process
    is root; ``account`` is the server's account (None as root: not created yet, then mode bits decide).
    Creates nothing; runs ``cd`` as ``account`` to find out whether it can enter the home."""
    home = Path(os.path.abspath(home))
    direct = home / DATA_FOLDER
    if not (os.geteuid() == 0 if as_root is None else as_root):
        return ServerLayout(home, direct)
    moved = moved_home(home, root) / DATA_FOLDER
    if os.path.lexists(direct):
        return ServerLayout(home, direct)
    entry = home
    while not os.path.lexists(entry) and entry.parent != entry:
        entry = entry.parent
    if not entry.is_dir():
        return ServerLayout(home, direct)  # not a folder: starting reports it
    blocked = blocking_parent(entry, account)
    enters = can_enter(account, entry) if account is not None else blocked is None
    if enters and not os.path.lexists(moved):
        return ServerLayout(home, direct)
    if enters:
        return ServerLayout(home, moved, "placed there when the server account could not enter the home")
    name = account.name if account is not None else "the server account"
    where = f"{blocked} (mode {stat.S_IMODE(blocked.stat().st_mode):04o})" if blocked is not None else str(entry)
    return ServerLayout(home, moved, f"{name} cannot enter {where}")


def ensure_product_root(account: Account, root: Path = PRODUCT_ROOT) -> Path:
    """``root``, created when missing (0710, group of ``account``). The server account runs programs kept in it,
    so it must be a folder of root that nobody else may write: otherwise one line, and it is left as it is."""
    make_home(root, account)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise EmbeddedServerError(
            f"{root} must be a folder of root that only root may write (it is mode "
            f"{stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}): the embedded server's binaries and data live "
            f"there; make it so (chown root {root} && chmod go-w {root}) or remove it, or use --dsn")
    return root


def record_home(layout: ServerLayout) -> None:
    """Write ``home`` (the home's real path) next to a moved data folder, for the people who find it there."""
    record = layout.pgdata.parent / HOME_RECORD
    text = os.path.realpath(layout.home) + "\n"
    try:
        if record.is_file() and record.read_text(encoding="utf-8", errors="replace") == text:
            return
        tmp = record.with_name(f".{HOME_RECORD}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        os.replace(tmp, record)
    except OSError as exc:
        raise EmbeddedServerError(f"cannot write {record}: {exc.strerror or exc}") from None


def describe_data_folder(home: Path | None = None) -> tuple[Path, str]:
    """(data folder, why it is there: ``"<home>/pgdata"`` or ``"moved: <why>"``) of the embedded server of ``home``
    (default :func:`etl_home`), for ``config show``. Creates nothing, not even the server account (without it,
    mode bits decide)."""
    from feiqiu_etl.db.embedded.account import existing_server_account

    home = etl_home() if home is None else home
    layout = resolve_layout(home, existing_server_account() if os.geteuid() == 0 else None)
    return layout.pgdata, (f"moved: {layout.moved_because}" if layout.moved else f"<home>/{DATA_FOLDER}")
