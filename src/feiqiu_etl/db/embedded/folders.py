"""Creating the folders the embedded server needs, under one rule: a folder feiqiu-etl did not create is never
changed (no chmod, no chown), whatever its mode.

Folders it creates are private: a data or socket folder belongs to the server's account with mode 0700; a home
it creates is 0700 for a normal user, or, as root, 0710 with the server account's group (so that account, and
nobody else, may pass through to the data folder); missing parents it creates on the way are left traversable
(0755 for a normal user, 0711 as root) so the server account can pass. Every failure is one line.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from feiqiu_etl.db.embedded.account import Account
from feiqiu_etl.db.embedded.errors import EmbeddedServerError


def make_dirs(path: Path, account: Account | None, *, private_mode: int) -> bool:
    """Create ``path`` (mode ``private_mode``) and its missing parents; return True if ``path`` was created.

    Parents this creates are left traversable (``o+x``) when a server account must pass through them; folders
    that already exist are never changed. Raises :class:`EmbeddedServerError` with one line."""
    missing: list[Path] = []
    probe = path
    while True:
        try:
            os.lstat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):
            missing.append(probe)
        except OSError as exc:
            raise EmbeddedServerError(f"cannot reach the folder {path}: {exc.strerror or exc}") from None
        if probe.parent == probe:
            break
        probe = probe.parent
    folder = path
    made = False
    try:
        for folder in reversed(missing):
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:  # another command made it at the same moment: theirs to set up
                made = False
                continue
            made = True
            if folder != path:
                os.chmod(folder, 0o755 if account is None else 0o711)
    except OSError as exc:
        raise EmbeddedServerError(f"cannot create the folder {folder}: {exc.strerror or exc}") from None
    if not path.is_dir():
        raise EmbeddedServerError(f"{path} exists and is not a folder")
    if made:
        os.chmod(path, private_mode)
    return made


def make_home(path: Path, account: Account | None) -> bool:
    """Create the folder ``path`` that holds a data folder, its passfile, socket folder and lock, when missing:
    0700 for a normal user; as root 0710 with ``account``'s group (only the server account may pass). True if
    created here; an existing folder is left as it is."""
    created = make_dirs(path, account, private_mode=0o700 if account is None else 0o710)
    if created and account is not None:
        os.chown(path, -1, account.gid)
    return created


def private_dir(path: Path, account: Account | None) -> None:
    """Make sure ``path`` (a folder this package owns) is a real folder of the server's user, mode 0700."""
    created = make_dirs(path, account, private_mode=0o700)
    st = os.lstat(path)
    owner = account.uid if account else os.geteuid()
    if created and account is not None:
        os.chown(path, account.uid, account.gid)
    elif not stat.S_ISDIR(st.st_mode) or st.st_uid != owner:
        raise EmbeddedServerError(f"{path} is not a folder of user {account.name if account else os.geteuid()}; "
                                  "remove it and start again")
    if stat.S_IMODE(os.lstat(path).st_mode) != 0o700:
        os.chmod(path, 0o700)


def remove_dir(path: Path) -> None:
    """Remove a folder this package made, quietly (it may be gone already)."""
    with contextlib.suppress(OSError):
        shutil.rmtree(path)
