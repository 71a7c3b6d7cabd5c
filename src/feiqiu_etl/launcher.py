"""The console script's first code: a signal while the interpreter imports the CLI ends it quietly.

Importing the CLI takes a moment (click, rich, psycopg, httpx). A Ctrl-C or SIGTERM in that moment used to end
in a ``KeyboardInterrupt`` traceback or a bare kill (exit -15); nothing has started then, so the process says
so in one line and exits 5 (CANCELLED, README "exit codes"). Once the CLI is imported the usual handlers apply
(``flowcli.signals_cancel`` during a run).
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

    for s, handler in previous.items():
        signal.signal(s, handler)
    entry()
