"""A PostgreSQL server that stops answering, for tests: ``SIGSTOP`` of its postmaster and every child."""

from __future__ import annotations

import signal
import time

import psutil


class Freezer:
    """SIGSTOP/SIGCONT of a server's postmaster and all its children (thawed on exit, whatever happens)."""

    def __init__(self, server):
        self.postmaster = psutil.Process(server.statistics().pid)
        self.frozen: list[psutil.Process] = []
        self.at: float | None = None

    def freeze(self) -> None:
        self.frozen = [self.postmaster, *self.postmaster.children(recursive=True)]
        for proc in self.frozen:
            proc.send_signal(signal.SIGSTOP)
        self.at = time.monotonic()

    def thaw(self) -> None:
        for proc in self.frozen:
            try:
                proc.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass
        self.frozen = []

    def __enter__(self) -> "Freezer":
        return self

    def __exit__(self, *exc) -> None:
        self.thaw()
