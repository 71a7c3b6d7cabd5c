"""The typed errors of the application layer: each a one-line message (``str()``) and the exit code of the
command that met it (:mod:`feiqiu_etl.common.exitcodes`). No click here: the command line turns them into its
own one-line errors (:mod:`feiqiu_etl.cli.app`), a Dagster step into a ``Failure``."""

from __future__ import annotations

from feiqiu_etl.common import exitcodes


class AppError(Exception):
    """A request to the application that could not be done; ``message`` is one line (never a secret)."""

    exit_code = exitcodes.FAILED

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageFailure(AppError):
    """A configuration or usage error, reported before any request (exit 2)."""

    exit_code = exitcodes.USAGE


class DatabaseLost(AppError):
    """The database went away and did not come back in time (exit 7)."""

    exit_code = exitcodes.DATABASE_LOST


class CancelledEarly(AppError):
    """Cancelled before the run started (e.g. Ctrl-C while connecting; exit 5)."""

    exit_code = exitcodes.CANCELLED
