"""``flocked``: an exclusive ``flock`` on a file, waited for within a bound (the copy of the binaries, the
server's start, the creation of the server account)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Iterator

from feiqiu_etl.db.embedded.errors import EmbeddedServerError


@contextlib.contextmanager
def flocked(path: Path, timeout: float, what: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the file ``path`` (created 0600), waiting at most ``timeout`` seconds for
    another process to release it; ``what`` names the lock's purpose in the one-line error."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise EmbeddedServerError(f"cannot write in {path.parent}: {exc.strerror or exc}") from None
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EmbeddedServerError(f"another process has held {what} ({path}) for over {timeout:.0f} s: "
                                              "try again when it is done") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock
