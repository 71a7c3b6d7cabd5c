"""Who may use the web page, and how a cancel proves that it came from our own page.

* **Bind rule** (:func:`needs_token`): 127.0.0.1, ``::1`` and ``localhost`` may be served without a token;
  any other address (127.0.0.2 and 0.0.0.0 included) needs one, or the command refuses to start.
* **With a token** every request carries ``Authorization: Bearer <token>`` (API clients) or the session
  cookie that ``POST /login`` sets after the token was typed into the login form (browsers); anything else
  gets 401 (a browser asking for a page gets the login form with that status). Only ``/login``, our own
  ``/static/`` files and the language switch ``/lang/<code>`` (no data in them) are served without it.
* **Without a token** (loopback only) the ``Host`` header must name a loopback address, so that a page of
  another site cannot reach the server through DNS rebinding.
* **CSRF**: a POST from a browser must carry ``X-CSRF-Token`` (or the form field ``csrf_token``) equal to
  HMAC(secret of this server process, session id or ``"anonymous"``), which only our own pages know; a
  request authenticated by its Bearer header needs none (browsers never add that header by themselves). A
  POST whose ``Origin`` names another host is refused (403). The session cookie is ``HttpOnly`` and
  ``SameSite=Strict``.

* **Token strength** (:func:`token_problem`): at least :data:`MIN_TOKEN_CHARACTERS` characters that are not
  whitespace, not all the same character, no control character and no whitespace at either end (a Bearer
  header could never carry it); the command refuses anything else at start.
* **Guessing** (:class:`LoginThrottle`): every failed token check — the login form or a wrong Bearer header —
  counts against the client's address (the TCP peer; proxy headers are not trusted). The first
  ``free_failures`` cost nothing but the login form's half-second answer; from then on the address must wait
  1 s, 2 s, 4 s … (at most 60 s) before its next check, and after ``lockout_after`` failures it is locked out
  for 15 minutes, again after every further failure, until 15 minutes pass without one. A check that comes
  too early is not made: it gets 429 with ``Retry-After`` (so concurrent guesses gain nothing: the check and the
  bookkeeping happen in one step of the event loop). A correct token clears the address's failures; other
  addresses are not affected. Requests that carry no token (an open page, a session cookie) are not counted.
* **Global cap** (issue 28 item 4): at most ``global_per_minute`` (30) wrong tokens are checked per minute in
  total, over all addresses: many addresses with a few guesses each (200 loopback addresses x 3 guesses once
  had 600 tokens checked in 0.4 s) get 429 once the minute's budget is spent.
* **The right token is never locked out** by anyone's failures: every candidate is compared first, in constant
  time, whatever the throttle says; a correct one logs in (and clears its address), only a wrong one meets the
  per-address wait and the global cap. So an address shared with an attacker (NAT, a proxy) cannot lock the
  admin out. The trade-off: a throttled guess still learns "wrong" (429) from "right" (a session); what stops
  guessing is the token's strength (at least 16 characters, :func:`token_problem`), the throttle bounds the
  rate, the noise and the work (docs/hardening.md has the figures).

The token is compared in constant time (HMAC digests of equal length) and never stored, logged or echoed;
sessions live in this process only (a restart logs everyone out).
"""

from __future__ import annotations

import hashlib
import collections
import hmac
import ipaddress
import math
import secrets
import threading
import time
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

SESSION_COOKIE = "feiqiu_session"
CSRF_HEADER = "x-csrf-token"
LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
PUBLIC_PATHS = ("/login", "/static/", "/lang/")  # /lang/<code>: the language switch (a cookie, no data)
SESSION_TTL = 12 * 3600.0
"""Seconds a login lasts."""
MAX_SESSIONS = 1000
MIN_TOKEN_CHARACTERS = 16
"""Fewest characters that are not whitespace an auth token must have."""


def token_problem(token: str) -> str | None:
    """None when ``token`` is strong enough for the web page (module docstring), else a one-line reason that
    never quotes it."""
    if any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 for c in token):
        return "the auth token must not contain control characters"
    visible = [c for c in token if not c.isspace()]
    if len(visible) < MIN_TOKEN_CHARACTERS:
        return f"the auth token must have at least {MIN_TOKEN_CHARACTERS} characters that are not whitespace"
    if token != token.strip():
        return "the auth token must not begin or end with whitespace"
    if len(set(visible)) < 2:
        return "the auth token must not be one character repeated"
    return None


@dataclass(frozen=True)
class ThrottleRules:
    """How failed token checks of one client address are throttled (module docstring). Seconds."""

    free_failures: int = 3
    first_delay: float = 1.0
    max_delay: float = 60.0
    lockout_after: int = 10
    lockout: float = 900.0
    forget_after: float = 900.0
    max_addresses: int = 10_000
    global_per_minute: int = 30
    """Most wrong tokens checked per minute over all addresses (a sliding minute)."""

    def delay(self, failures: int) -> float:
        """Seconds the address must wait after its ``failures``-th failure in a row."""
        if failures >= self.lockout_after:
            return self.lockout
        if failures < self.free_failures:
            return 0.0
        return min(self.first_delay * 2 ** (failures - self.free_failures), self.max_delay)


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    next_allowed: float = 0.0


@dataclass(frozen=True)
class ThrottleStatistics:
    """``addresses`` with failures, ``locked_addresses``, ``refused`` checks (429), ``globally_refused`` of them
    by the global cap, ``failures_last_minute`` over all addresses."""

    addresses: int
    locked_addresses: int
    refused: int
    globally_refused: int = 0
    failures_last_minute: int = 0


class LoginThrottle:
    """Failed token checks per client address, and how long each address must wait before its next check.
    Thread-safe; ``clock`` is injectable (tests)."""

    def __init__(self, rules: ThrottleRules = ThrottleRules(), clock: Callable[[], float] = time.monotonic):
        self.rules = rules
        self._clock = clock
        self._lock = threading.Lock()
        self._by_address: dict[str, _Failures] = {}
        self._recent: collections.deque[float] = collections.deque()  # failures of the last minute, all addresses
        self._refused = 0
        self._globally_refused = 0

    def wait(self, address: str, *, count: bool = True) -> float:
        """Seconds before a wrong token from ``address`` may be checked (0: now): its own wait, or the global
        cap's. A positive answer counts as a refused check unless ``count`` is False."""
        now = self._clock()
        with self._lock:
            overall = self._global_wait(now)
            left = 0.0
            failures = self._by_address.get(address)
            if failures is not None:
                if now >= failures.next_allowed and now - failures.last > self.rules.forget_after:
                    del self._by_address[address]
                else:
                    left = max(0.0, failures.next_allowed - now)
            if max(left, overall) > 0 and count:
                self._refused += 1
                self._globally_refused += 1 if overall > left else 0
            return max(left, overall)

    def _global_wait(self, now: float) -> float:
        """Seconds until the global cap takes another wrong token (called under the lock)."""
        while self._recent and now - self._recent[0] >= 60.0:
            self._recent.popleft()
        if len(self._recent) < self.rules.global_per_minute:
            return 0.0
        return max(0.001, self._recent[0] + 60.0 - now)

    def failed(self, address: str) -> float:
        """Count a failed check of ``address``; returns the seconds it must now wait."""
        now = self._clock()
        with self._lock:
            failures = self._by_address.get(address)
            if failures is None:
                if len(self._by_address) >= self.rules.max_addresses:
                    self._forget_oldest(now)
                failures = self._by_address[address] = _Failures()
            failures.count += 1
            failures.last = now
            self._recent.append(now)
            wait = self.rules.delay(failures.count)
            failures.next_allowed = now + wait
            return wait

    def succeeded(self, address: str) -> None:
        """A correct token from ``address``: its failures are forgotten."""
        with self._lock:
            self._by_address.pop(address, None)

    def statistics(self) -> ThrottleStatistics:
        now = self._clock()
        with self._lock:
            locked = sum(1 for f in self._by_address.values()
                         if f.count >= self.rules.lockout_after and f.next_allowed > now)
            self._global_wait(now)
            return ThrottleStatistics(len(self._by_address), locked, self._refused, self._globally_refused,
                                      len(self._recent))

    def _forget_oldest(self, now: float) -> None:
        """Make room: addresses free to try again go first, then those that failed longest ago."""
        order = sorted(self._by_address, key=lambda a: (self._by_address[a].next_allowed > now,
                                                        self._by_address[a].last))
        for address in order[: max(1, len(order) // 10)]:
            del self._by_address[address]


def needs_token(host: str) -> bool:
    """True when binding ``host`` requires an auth token: every address but 127.0.0.1, ::1 and localhost."""
    return host.strip("[]").lower() not in LOCAL_HOSTS


def _is_loopback_name(name: str) -> bool:
    name = name.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8080`` → ``::1``, ``a:80`` → ``a``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header[1:]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass(frozen=True)
class SecurityStatistics:
    sessions: int
    logins: int
    failed_logins: int
    unauthorized: int
    csrf_refused: int
    host_refused: int
    bearer_refused: int = 0
    throttled: int = 0
    throttled_addresses: int = 0
    globally_throttled: int = 0
    failures_last_minute: int = 0
    locked_addresses: int = 0


class Security:
    """The rules of the module docstring for one server process. ``token`` None: loopback without auth."""

    def __init__(self, token: str | None, bind_host: str = "127.0.0.1", throttle: LoginThrottle | None = None):
        self._secret = secrets.token_bytes(32)
        self._token = self._digest(token) if token else None
        self._bind_host = bind_host.strip("[]").lower()
        self._sessions: dict[str, float] = {}
        self._lock = threading.Lock()
        self._counts = {"logins": 0, "failed_logins": 0, "unauthorized": 0, "csrf_refused": 0, "host_refused": 0,
                        "bearer_refused": 0}
        self.throttle = throttle or LoginThrottle()

    @property
    def enabled(self) -> bool:
        """Whether a token (or session) is required."""
        return self._token is not None

    def statistics(self) -> SecurityStatistics:
        throttle = self.throttle.statistics()
        with self._lock:
            return SecurityStatistics(sessions=len(self._sessions), **self._counts, throttled=throttle.refused,
                                      throttled_addresses=throttle.addresses,
                                      globally_throttled=throttle.globally_refused,
                                      failures_last_minute=throttle.failures_last_minute,
                                      locked_addresses=throttle.locked_addresses)

    def _count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    # ------------------------------------------------------------------------------------------ identity
    def _digest(self, text: str) -> bytes:
        return hmac.new(self._secret, text.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def token_matches(self, candidate: str | None) -> bool:
        """Constant-time comparison with the configured token (False when there is none): HMAC digests of
        both, so neither the content nor the length of the token leaks through timing."""
        if self._token is None or not candidate:
            return False
        return hmac.compare_digest(self._digest(candidate), self._token)

    def login(self, candidate: str | None, address: str | None = None) -> str | None:
        """A new session id when ``candidate`` is the token, else None. With ``address`` the outcome counts for
        the throttle (a wrong candidate: the caller asked :meth:`LoginThrottle.wait` first, in the same step).
        Raises :class:`Throttled` (the seconds to wait) for a wrong candidate that must wait: the token is
        compared first, so the right one is never refused."""
        right = self.token_matches(candidate)
        if address is not None and not right:
            wait = self.throttle.wait(address)
            if wait > 0:
                raise Throttled(wait)
        if not right:
            self._count("failed_logins")
            if address is not None:
                self.throttle.failed(address)
            return None
        if address is not None:
            self.throttle.succeeded(address)
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            self._counts["logins"] += 1
            if len(self._sessions) >= MAX_SESSIONS:
                for old in sorted(self._sessions, key=self._sessions.get)[: MAX_SESSIONS // 10]:
                    del self._sessions[old]
            self._sessions[sid] = now + SESSION_TTL
        return sid

    def logout(self, sid: str | None) -> None:
        with self._lock:
            self._sessions.pop(sid or "", None)

    def session_valid(self, sid: str | None) -> bool:
        if not sid:
            return False
        now = time.monotonic()
        with self._lock:
            expires = self._sessions.get(sid)
            if expires is None:
                return False
            if expires < now:
                del self._sessions[sid]
                return False
            return True

    def csrf_token(self, sid: str | None) -> str:
        """The CSRF token our pages embed for this session (``"anonymous"`` without one)."""
        return hmac.new(self._secret, (sid or "anonymous").encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, sid: str | None, candidate: str | None) -> bool:
        return bool(candidate) and hmac.compare_digest(candidate.encode(), self.csrf_token(sid).encode())

    # ------------------------------------------------------------------------------------------ requests
    def host_allowed(self, host_header: str) -> bool:
        """Without a token: the ``Host`` header must name a loopback address or the bound one."""
        if self.enabled:
            return True
        host = host_of(host_header)
        return _is_loopback_name(host) or host == self._bind_host

    def origin_allowed(self, request: Request) -> bool:
        """A POST's ``Origin`` (if any) must name the host the request was sent to."""
        origin = request.headers.get("origin")
        if not origin or origin == "null":
            return origin is None
        return host_of(origin.split("://", 1)[-1].split("/", 1)[0]) == host_of(request.headers.get("host", ""))

    def check_csrf(self, request: Request, form_token: str | None = None) -> bool:
        """Whether a state-changing request may go on (see module docstring). Counts refusals."""
        if request.state.auth == "bearer":
            return True
        ok = self.origin_allowed(request) and self.csrf_ok(request.state.session,
                                                             request.headers.get(CSRF_HEADER) or form_token)
        if not ok:
            self._count("csrf_refused")
        return ok

    def identify(self, scope: Scope) -> tuple[str | None, str | None]:
        """``(auth, session id)`` of a request: auth is ``"bearer"``, ``"session"``, ``"open"`` (no token
        configured), ``"throttled"`` (a Bearer header from an address that must wait: not checked) or None (not
        authenticated). A Bearer header counts for the throttle of the client's address."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        sid = None
        raw_cookie = headers.get("cookie")
        if raw_cookie:
            cookie: SimpleCookie = SimpleCookie()
            try:
                cookie.load(raw_cookie)
            except Exception:  # noqa: BLE001 - a malformed cookie header is no session
                cookie = SimpleCookie()
            if SESSION_COOKIE in cookie:
                sid = cookie[SESSION_COOKIE].value
        if not self.enabled:
            return "open", None
        auth = headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer":
            address = client_address(scope)
            if self.token_matches(value.strip()):  # first, in constant time: the right token is never locked out
                self.throttle.succeeded(address)
                return "bearer", None
            if self.throttle.wait(address) > 0:
                return "throttled", None
            self.throttle.failed(address)
            self._count("bearer_refused")
        if self.session_valid(sid):
            return "session", sid
        return None, None


class Throttled(Exception):
    """A wrong token that must wait: ``wait`` seconds (the address's or the global cap's)."""

    def __init__(self, wait: float):
        super().__init__(f"throttled for {wait:.1f} s")
        self.wait = wait


LoginPage = Callable[[Request, int], Awaitable[Response]]


class AccessGuard:
    """ASGI middleware applying :class:`Security` to every HTTP request before the app sees it; the
    request's ``state.auth`` and ``state.session`` tell the app who it is."""

    def __init__(self, app: ASGIApp, security: Security, login_page: LoginPage):
        self.app = app
        self.security = security
        self.login_page = login_page

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        if not self.security.host_allowed(request.headers.get("host", "")):
            self.security._count("host_refused")
            await JSONResponse({"error": "this server answers only to a loopback host name"}, 421)(
                scope, receive, _with_headers(send))
            return
        auth, sid = self.security.identify(scope)
        state = scope.setdefault("state", {})
        state["auth"], state["session"] = auth, sid
        path = scope.get("path", "")
        if auth == "throttled":
            wait = self.security.throttle.wait(client_address(scope), count=False)
            await too_many_attempts(wait)(scope, receive, _with_headers(send))
            return
        if auth is None and not path.startswith(PUBLIC_PATHS):
            self.security._count("unauthorized")
            if scope.get("method") == "GET" and not path.startswith("/api/") and \
                    "text/html" in request.headers.get("accept", ""):
                response = await self.login_page(request, 401)
            else:
                response = JSONResponse({"error": "unauthorized: send Authorization: Bearer <token> or log in"},
                                        401, headers={"WWW-Authenticate": 'Bearer realm="feiqiu-etl"'})
            await response(scope, receive, _with_headers(send))
            return
        await self.app(scope, receive, _with_headers(send, no_store=not path.startswith("/static/")))


def client_address(scope: Scope) -> str:
    """The client's address as the server saw it (the TCP peer): what the throttle counts."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def retry_after(wait: float) -> str:
    """``Retry-After`` for ``wait`` seconds (whole seconds, at least 1)."""
    return str(max(1, math.ceil(wait)))


def too_many_attempts(wait: float) -> JSONResponse:
    """The 429 answer to a token check that came too early."""
    return JSONResponse({"error": f"too many failed token checks from this address: try again in "
                                  f"{retry_after(wait)} s"}, 429, headers={"Retry-After": retry_after(wait)})


_SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # not no-referrer: with it Chromium sends "Origin: null" on our own form posts (login, logout)
    (b"referrer-policy", b"same-origin"),
]


def _with_headers(send: Send, no_store: bool = True) -> Send:
    """``send`` that adds the security headers (and ``Cache-Control: no-store``) to every response."""

    async def wrapped(message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            names = {k.lower() for k, _ in headers}
            headers += [h for h in _SECURITY_HEADERS if h[0] not in names]
            if no_store and b"cache-control" not in names:
                headers.append((b"cache-control", b"no-store"))
            message = {**message, "headers": headers}
        await send(message)

    return wrapped
