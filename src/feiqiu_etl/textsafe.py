"""Text from outside made safe to show, and secrets taken out of URLs (issue 21, findings 4 and 5).

Text that comes from the upstream (a ``msg``, field names, ids), the database (``sql`` rows, a stored log) or a
file (a fleet file's store names) is *data*. Printed raw, an ``ESC [2J`` clears the screen, an ``ESC ]0;…BEL``
sets the terminal's title and a line break forges a log line. So before such text reaches a terminal or a
log line:

* :func:`escape` writes every control character as a visible escape: C0 except tab (``\\n``, ``\\r``, ``\\x1b``
  …), DEL and C1 (``\\x9b`` is an 8-bit CSI), the Unicode line and paragraph separators and the bidirectional
  overrides and isolates (which reorder what a terminal shows). An ANSI escape sequence becomes harmless
  text (``\\x1b[2J``) and one log record stays one line. Everything else, tab and CJK included, is kept.
* :func:`escape_tree` does that to every string (and key) of a JSON-like value, for renderers that print
  parts of a record;
* :func:`terminal_json` is ``json.dumps`` for a terminal: valid JSON whose parsed value is unchanged, with the
  characters JSON leaves raw (DEL, C1, U+2028/2029, bidi controls) written as ``\\uXXXX``.

Stored data is kept as it came (it is evidence); it is escaped where it is shown.

:func:`redact_url` is the one function that takes secrets out of a URL before it is stored or shown (a run's
arguments, ``plan``, ``config show``, logs, errors): the password of the user info and the value of every
query parameter whose name looks like a secret (:data:`SECRET_PARAM`). ``redact_dsn`` uses it for DSN URIs, the
alerts for Apprise URLs (whose path, and often host, is the secret: ``secret_path``, ``secret_host``);
:func:`url_secrets` lists the same secrets for scrubbing them from an error text.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping
from urllib.parse import unquote

_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r"}
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What ``json.dumps(..., ensure_ascii=False)`` leaves unescaped among :data:`_CONTROL` (C0 it escapes)."""


def _visible(match: re.Match) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: Any) -> str:
    """``text`` (``str()`` of it) with every control character written as a visible escape (module
    docstring); one line, whatever it held. Tab is kept."""
    text = text if isinstance(text, str) else str(text)
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_visible, text)


def escape_tree(value: Any) -> Any:
    """``value`` with :func:`escape` applied to every string, dictionary keys included, in dicts, lists and
    tuples (a tuple stays a tuple); other values unchanged."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {escape(k) if isinstance(k, str) else k: escape_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(escape_tree(v) for v in value)
    return value


def terminal_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, default=str, **kwargs)`` with the control characters JSON
    leaves raw written as ``\\uXXXX`` escapes: a reader parses the same value; a terminal shows no control."""
    text = json.dumps(value, ensure_ascii=False, default=str, **kwargs)
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# ------------------------------------------------------------------------------------------------- secrets
SECRET_PARAM = re.compile(
    r"(?i)(token|key|secret|passw|pwd|sig|auth|credential|session|cookie|ticket|private|jwt|bearer|hmac|"
    r"nonce|otp|code_verifier)")
"""A query parameter (or a mapping's key) whose name contains one of these words holds a secret (``token``,
``access_token``, ``refresh_token``, ``api_key``, ``apikey``, ``key``, ``secret``, ``client_secret``,
``password``, ``passwd``, ``sslpassword``, ``pwd``, ``sig``, ``sign``, ``signature``, ``X-Amz-Signature``,
``auth``, ``authorization``, ``sessionid``, ``hmac`` …; issue 28 item 5 added ``sig``). Better a masked harmless
value than a shown secret. :func:`is_secret_name` is the one test of it."""


def is_secret_name(name: str) -> bool:
    """True when a parameter or key called ``name`` holds a secret (:data:`SECRET_PARAM`, percent-decoded): the
    one rule for URL query strings, request parameters and stored arguments."""
    return SECRET_PARAM.search(unquote(str(name))) is not None


def redact_mapping(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``params`` with the value of every secret-named key (:func:`is_secret_name`) replaced by ``***``."""
    return {k: (MASK if is_secret_name(k) and v not in (None, "") else v) for k, v in (params or {}).items()}

MASK = "***"


def _parts(url: str) -> tuple[str, str | None, str, str, str | None, str | None]:
    """``scheme://user:pw@host:port/path?query#fragment`` → (scheme, user info or None, ``host:port``,
    ``/path``, query or None, fragment or None); see :func:`_split_userinfo` for where the user info ends."""
    scheme, _, rest = url.partition("://")
    userinfo, rest = _split_userinfo(rest)
    ends = [i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0]
    end = min(ends) if ends else len(rest)
    authority, tail = rest[:end], rest[end:]
    tail, hash_mark, fragment = tail.partition("#")
    path, question, query = tail.partition("?")
    return scheme, userinfo, authority, path, query if question else None, fragment if hash_mark else None


def _split_userinfo(rest: str) -> tuple[str | None, str]:
    """``user:pw@host/path?q`` → (``user:pw``, ``host/path?q``); no user info → (None, rest).

    The credentials end at the *last* ``@``, so a password may hold ``@``, ``/``, ``?``, ``:`` or ``#`` even when
    it is not percent-encoded (libpq accepts such DSNs). A ``@`` after the path begins is taken for part of the
    path or query (``host/?mail=a@b``) only when no ``:`` or ``@`` precedes that ``/``, ``?`` or ``#``: with one,
    it could be a password's, and masking too much is the safe mistake."""
    at = rest.rfind("@")
    if at < 0:
        return None, rest
    ends = [i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0]
    first = min(ends) if ends else -1
    if 0 <= first < at and ":" not in rest[:first] and "@" not in rest[:first]:
        return None, rest
    return rest[:at], rest[at + 1:]


def _query_pairs(query: str) -> list[tuple[str, str, str]]:
    """``a=1&token=x;b`` → [(``a``, ``=``, ``1``), (``&``, "", ""), …]: names, ``=`` and values, and the
    separators ``&``/``;`` as pairs of their own."""
    pairs = []
    for part in re.split(r"([&;])", query):
        if part in ("&", ";"):
            pairs.append((part, "", ""))
        elif part:
            pairs.append(part.partition("="))
    return pairs


def _is_secret_param(name: str, value: str) -> bool:
    return bool(value) and name not in ("&", ";") and is_secret_name(name)


def redact_url(url: str, *, secret_path: bool = False, secret_host: bool = False) -> str:
    """``url`` with its secrets masked, safe to store and show. Never raises.

    By default (an API base, a DSN): the password of the user info (``scheme://user:***@host``) and the value of
    each query parameter whose name matches :data:`SECRET_PARAM` (``?token=***``) become ``***``; a fragment that
    holds ``=`` (``#access_token=…``, OAuth's implicit flow) is dropped; the rest is kept.
    ``secret_path``: the URL keeps secrets in its user, path or query (a webhook, an Apprise URL): none of them
    is shown, only ``scheme://host:port`` and ``/…`` when more followed. ``secret_host``: the host is a key too
    (``feishu://KEY``, ``tgram://BOT_TOKEN/CHAT``): none of it is shown (``***``; issue 28 item 5 — its first and
    last character were shown before).
    Text that is no ``scheme://`` URL is returned as it is when it holds no ``@`` and no ``=`` (a host name) and
    the path is not secret, else not shown at all."""
    url = url if isinstance(url, str) else str(url)
    if "://" not in url:
        plain = "@" not in url and "=" not in url and not secret_path
        return url if plain else "<not shown: it may hold a secret>"
    scheme, userinfo, authority, path, query, fragment = _parts(url)
    if secret_host:
        host, port = _host_port(authority)
        authority = MASK + port
    if secret_path:
        more = "/…" if path.strip("/") or query or fragment else ""
        return f"{scheme}://{authority}{more}"
    shown = f"{scheme}://"
    if userinfo is not None:
        user, colon, password = userinfo.partition(":")
        shown += f"{user}{':' + MASK if colon and password else ''}@"
    shown += authority + path
    if query is not None:
        shown += "?" + "".join(f"{n}{eq}{MASK if _is_secret_param(n, v) else v}" for n, eq, v in _query_pairs(query))
    if fragment is not None and "=" not in fragment:
        shown += "#" + fragment
    return shown


def _host_port(authority: str) -> tuple[str, str]:
    """``host:8080`` → (``host``, ``:8080``); ``[::1]:80`` → (``[::1]``, ``:80``); no port → (authority, "")."""
    host, colon, port = authority.rpartition(":")
    if colon and port.isdigit() and (not host.startswith("[") or host.endswith("]")) and host:
        return host, colon + port
    return authority, ""


def url_secrets(url: str, *, secret_path: bool = False, secret_host: bool = False) -> set[str]:
    """The secrets :func:`redact_url` (with the same options) masks in ``url``, as written and percent-decoded:
    what must be scrubbed from a message that may quote them (e.g. a driver's or a server's error). By default
    the password and the secret query values; ``secret_path`` adds the user, every path segment and every query
    value; ``secret_host`` the host."""
    if "://" not in url:
        return {url} if secret_path else set()
    _, userinfo, authority, path, query, fragment = _parts(url)
    found = set()
    if userinfo is not None and ":" in userinfo:
        # the user info may end at an earlier '@' than the one taken (``u:pw@host?to=a@b``): each candidate
        found.update(userinfo[:i].partition(":")[2] for i, c in enumerate(userinfo + "@") if c == "@")
    for name, _, value in _query_pairs(query or ""):
        if secret_path or _is_secret_param(name, value):
            found.add(value)
    if fragment and ("=" in fragment or secret_path):
        found.add(fragment)
    if secret_path:
        found.add((userinfo or "").partition(":")[0])
        found.update(path.split("/"))
    if secret_host:
        found.add(_host_port(authority)[0])
    return {s for secret in found if secret for s in (secret, unquote(secret))}
