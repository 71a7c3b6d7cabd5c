"""The one error of the embedded server: any failure to prepare, start or reach it, as one line for the user.

Every module of this package raises :class:`EmbeddedServerError` with a message that names the real cause
(a folder, a file, an account, a program's first error line) and, where there is one, advice that works.
A message must never carry a password or the caller's environment.
"""

from __future__ import annotations


class EmbeddedServerError(RuntimeError):
    """The embedded server cannot be prepared, started or reached; ``str()`` is one line for the user."""
