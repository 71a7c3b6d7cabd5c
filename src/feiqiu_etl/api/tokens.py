"""The one rule for an API token (issue 28 item 7, adversarial trial): it travels in an HTTP header
(upstream-api.md §2.1), so it must be printable ASCII without whitespace inside — a CR, LF, tab, space, control
character or non-ASCII letter is refused before any request, with a message that names where the token came
from and never the token."""

from __future__ import annotations


def token_problem(token: str) -> str | None:
    """``None`` for a token that can be sent (``token`` already stripped of surrounding whitespace), else what is
    wrong with it in a few words (without the token)."""
    for ch in token:
        if ch in "\r\n":
            return "holds a line break (a quoted value over two lines?)"
        if ch.isspace():
            return "holds whitespace"
        if not (ch.isascii() and ch.isprintable()):
            return "holds a control character" if ch.isascii() else "holds a non-ASCII character"
    return None
