"""The console script's first code: a signal while the interpreter imports the CLI ends it quietly.

Importing the CLI takes a moment (click, rich, psycopg, httpx). A Ctrl-C or SIGTERM in that moment used to end
in a ``KeyboardInterrupt`` traceback or a bare kill (exit -15); nothing has started then, so the process says
so in one line and exits 5 (CANCELLED, docs/reference/exit-codes.md). Once the CLI is imported, SIGINT and SIGTERM
raise ``KeyboardInterrupt`` (cleanups run; ``cli.entry`` says so in one line, exit 5) until a run installs its
own handlers (``cli.signals.signals_cancel``: a graceful cancel).
"""

from __future__ import annotations

import os
import signal


def _early(signum: int, frame: object) -> None:
    os.write(2, b"interrupted while starting: nothing was done\n")
    os._exit(5)


def main() -> None:
    """Entry point of ``feiqiu-etl`` and ``python -m feiqiu_etl``."""
    previous = {s: signal.signal(s, _early) for s in (signal.SIGINT, signal.SIGTERM)}
    from feiqiu_etl.cli import entry

    del previous
    # From here a signal is a KeyboardInterrupt, SIGTERM too: the command's cleanups run (the embedded server
    # it started stops) and entry() ends it in one line, exit 5. A run installs its own handlers (cancel).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    entry()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
