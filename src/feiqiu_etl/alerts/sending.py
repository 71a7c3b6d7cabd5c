"""Sending alert messages through Apprise, within a hard time bound, without leaking a secret.

Apprise speaks each platform's format by URL: ``json://`` (a generic JSON webhook: ``{version, title,
message, attachments, type}``), ``feishu://``/``lark://``, ``dingtalk://``, ``wecombot://``, ``slack://``,
``mailto://`` (SMTP) and many more; we write none of those formats ourselves.

:func:`deliver` sends every ``(target, message)`` at once, one worker thread each, all under ONE deadline
(``timeout`` seconds from the call): each attempt's socket timeouts are cut to the time left, failed
attempts are retried with tenacity (exponential backoff, never past the deadline), and the caller waits for
the workers only until the deadline — a receiver that hangs or trickles costs at most ``timeout`` seconds,
then counts as failed ("no answer within N s"). Nothing here raises: every outcome is a :class:`Delivery`.

An Apprise URL holds its secret (a bot key, a token, a password) in its user, password, host or path, so
URLs are never logged: :func:`redact` gives ``json://127.0.0.1:9000/…`` or ``feishu://a…z``, and
:func:`scrub` removes every secret piece of a URL from an error text. Apprise's own log is kept off our
handlers (its DEBUG lines contain full URLs); its warnings are captured per attempt for the error message.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Callable, Sequence

from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential
from tenacity.stop import stop_base

from feiqiu_etl.alerts.messages import Message, clean
from feiqiu_etl.textsafe import redact_url, url_secrets

log = logging.getLogger("feiqiu_etl.alerts")

_APPRISE_LOG = logging.getLogger("apprise")
_APPRISE_LOG.propagate = False      # its DEBUG lines carry full URLs: never into our log handlers
_APPRISE_LOG.addHandler(logging.NullHandler())
_APPRISE_LOG.setLevel(logging.WARNING)

HTTP_SCHEMAS = frozenset({"json", "jsons", "form", "forms", "xml", "xmls", "mailto", "mailtos"})
"""Schemas whose host is an address, not a secret (shown by :func:`redact`)."""
MIN_ATTEMPT = 0.2
"""An attempt needs at least this much time left (s); less and the worker stops trying."""


class SendFailed(Exception):
    """One attempt failed; ``str()`` is a one-line reason, secrets scrubbed."""


@dataclass(frozen=True)
class Delivery:
    """The outcome of sending one message to one target: ``target`` (redacted label), ``ok``, ``error`` (one
    line, None when ok), ``latency_s`` (from the call to the answer, s), ``attempts`` and ``sent_at`` (ISO
    8601 with offset, when the answer came or the deadline passed)."""

    target: str
    ok: bool
    error: str | None
    latency_s: float
    attempts: int
    sent_at: str

    def to_dict(self) -> dict:
        return asdict(self)


def usable(url: str) -> str | None:
    """None when Apprise can send to ``url``; else why not, without the URL (for a one-line config error)."""
    import apprise

    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if not scheme:
        return "is not an Apprise URL (SCHEME://…)"
    with _captured():
        plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
    if plugin is None:
        return f"is not a {clean(scheme, 20)}:// URL that Apprise can use (see its list of services)"
    return None


def redact(url: str) -> str:
    """``url`` safe to show (:func:`feiqiu_etl.textsafe.redact_url`, the one URL redactor): for address-like
    schemas (json, form, xml, mailto) ``scheme://host:port`` plus ``/…`` when more follows; for the others
    (whose host is a key: ``tgram://BOT_TOKEN``) not even the host (``tgram://***``). No user, password, path or
    query."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return redact_url(url, secret_path=True, secret_host=scheme not in HTTP_SCHEMAS)


def secrets_of(url: str) -> set[str]:
    """The pieces of ``url`` that may be secret (:func:`feiqiu_etl.textsafe.url_secrets`): user, password,
    path segments, query values and (for non-address schemas) the host, and the URL itself. Pieces shorter
    than 4 characters are left (they would garble text)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    found = url_secrets(url, secret_path=True, secret_host=scheme not in HTTP_SCHEMAS)
    return {piece for piece in found if len(piece) >= 4} | {url}


def scrub(text: str, url: str) -> str:
    """``text`` (e.g. an exception message) without any secret piece of ``url`` (each becomes ``***``)."""
    for secret in sorted(secrets_of(url), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class _Capture(logging.Handler):
    """Apprise's WARNING+ records of one attempt. Apprise may log from its own worker threads, into which it
    copies the caller's context, so the attempt is recognised by a context variable, not by its thread."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if _CURRENT.get() is self:
            try:
                self.lines.append(record.getMessage())
            except Exception:  # noqa: BLE001 - a bad format string in a plugin
                self.lines.append(str(record.msg))


_CURRENT: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("feiqiu_alert_capture", default=None)


class _captured:
    def __enter__(self) -> _Capture:
        self.handler = _Capture()
        self.token = _CURRENT.set(self.handler)
        _APPRISE_LOG.addHandler(self.handler)
        return self.handler

    def __exit__(self, *exc) -> None:
        _APPRISE_LOG.removeHandler(self.handler)
        _CURRENT.reset(self.token)


def notify_once(url: str, message: Message, timeout: float) -> None:
    """One attempt: send ``message`` to ``url`` with connect and read timeouts of ``timeout`` s. Raises
    :class:`SendFailed` with Apprise's reason (scrubbed)."""
    import apprise

    with _captured() as capture:
        asset = _asset()
        plugin = apprise.Apprise.instantiate(url, asset=asset, suppress_exceptions=True)
        if plugin is None:
            raise SendFailed("Apprise cannot use this URL")
        plugin.socket_connect_timeout = plugin.socket_read_timeout = max(0.1, timeout)
        sender = apprise.Apprise(asset=asset)
        sender.add(plugin)
        try:
            ok = sender.notify(title=message.title, body=message.body, notify_type=message.severity,
                               body_format=apprise.NotifyFormat.TEXT)
        except Exception as exc:  # noqa: BLE001 - a plugin bug must not escape
            raise SendFailed(scrub(clean(f"{exc.__class__.__name__}: {exc}"), url)) from None
    if not ok:
        why = "; ".join(dict.fromkeys(line.strip() for line in capture.lines if line.strip()))
        raise SendFailed(scrub(clean(why or "the target did not accept the message"), url))


def _asset():
    """Apprise sends in the calling (daemon) thread: no async mode and no service deadline of its own (ours
    is the bound), else it uses a pool whose threads the interpreter joins at exit — a receiver that
    trickles bytes could then hold the process past our deadline. (``service_timeout`` is Apprise >= 2.)"""
    import apprise

    try:
        return apprise.AppriseAsset(async_mode=False, service_timeout=0)
    except TypeError:  # an Apprise without service deadlines sends sequentially in this thread anyway
        return apprise.AppriseAsset(async_mode=False)


def deliver(jobs: Sequence[tuple[object, Message]], *, timeout: float, attempts: int,
            send=notify_once, since: float | None = None) -> list[Delivery]:
    """Send each ``(target, message)`` (``target`` has ``url`` and ``label``) at once; return one
    :class:`Delivery` per job, in order, within ``timeout`` seconds (plus thread start-up) counted from
    ``since`` (``time.monotonic()``; default: now — a caller that first read the database passes its own start,
    so the bound covers that too). ``send(url, message, attempt_timeout)`` does one attempt (default: Apprise)."""
    if not jobs:
        return []
    if send is notify_once:
        import apprise  # noqa: F401 - the first import loads its plugins (about a second): not on the clock

    bound = _Bound(send, time.monotonic() if since is None else since, timeout, attempts)
    out: list[Delivery | None] = [None] * len(jobs)
    tries = [0] * len(jobs)

    def work(i: int, target, message: Message) -> None:
        out[i] = bound.sent(target, message, tries, i)

    workers = [threading.Thread(target=work, args=(i, t, m), name=f"alert-{i}", daemon=True)
               for i, (t, m) in enumerate(jobs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(max(0.0, bound.deadline - time.monotonic()))
    results = []
    for i, (target, message) in enumerate(jobs):
        d = out[i]
        if d is None:  # still waiting for an answer: abandoned (a daemon thread, its sockets time out too)
            d = Delivery(target.label, False, f"no answer within {timeout:g} s",
                         round(time.monotonic() - bound.start, 3), max(tries[i], 1), _now())
        results.append(d)
        _log_delivery(d, message)
    return results


@dataclass(frozen=True)
class _Bound:
    """One :func:`deliver` call: ``send`` one attempt, at most ``attempts`` per job, every job within ``timeout``
    seconds from ``start`` (monotonic s)."""

    send: Callable[[str, Message, float], None]
    start: float
    timeout: float
    attempts: int

    @property
    def deadline(self) -> float:
        return self.start + self.timeout

    def sent(self, target, message: Message, tries: list[int], i: int) -> Delivery:
        """Send ``message`` to ``target``, retried within the bound (``tries[i]`` counts the attempts, read by
        :func:`deliver` for a job it abandons); never raises."""
        deadline = self.deadline

        def attempt() -> None:
            tries[i] += 1
            left = deadline - time.monotonic()
            if left < MIN_ATTEMPT:
                raise _OutOfTime()
            self.send(target.url, message, left)

        def wait(state) -> float:  # exponential, never past the deadline
            return max(0.0, min(base(state), deadline - time.monotonic() - MIN_ATTEMPT))

        base = wait_exponential(multiplier=0.25, max=2.0)
        try:
            for tried in Retrying(stop=stop_after_attempt(self.attempts) | _past(deadline), wait=wait,
                                  retry=retry_if_exception_type(SendFailed), reraise=True):
                with tried:
                    attempt()
            error = None
        except _OutOfTime:
            error = f"no answer within {self.timeout:g} s"
        except (SendFailed, RetryError) as exc:
            error = str(exc) or exc.__class__.__name__
        except Exception as exc:  # noqa: BLE001 - never escapes a worker
            error = scrub(clean(f"{exc.__class__.__name__}: {exc}"), target.url)
        if time.monotonic() > deadline and error is None:
            error = f"answered after the {self.timeout:g} s bound"
        return Delivery(target.label, error is None, error, round(time.monotonic() - self.start, 3), tries[i], _now())


def _log_delivery(d: Delivery, message: Message) -> None:
    if d.ok:
        log.info("alert sent to %s in %.2f s (%s)", d.target, d.latency_s, ", ".join(message.reasons))
    else:
        log.warning("alert to %s failed after %d attempt(s), %.2f s: %s", d.target, d.attempts, d.latency_s,
                    d.error)


class _OutOfTime(Exception):
    pass


class _past(stop_base):
    """Stop retrying when less than :data:`MIN_ATTEMPT` is left before ``deadline`` (monotonic s)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __call__(self, state) -> bool:
        return time.monotonic() >= self.deadline - MIN_ATTEMPT


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()
