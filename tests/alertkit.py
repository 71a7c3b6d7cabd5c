"""Real local alert receivers for the tests: an HTTP webhook (a threaded ``http.server`` on 127.0.0.1) that
can answer 200, answer 500 or hang, and an SMTP server (aiosmtpd) on 127.0.0.1. Each records what arrived
and when (``time.time()``), so a test can count the alerts and measure the latency from a run's end."""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    at: float
    path: str
    headers: dict
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


class WebhookReceiver:
    """``mode``: ``"ok"`` (200), ``"error"`` (500), ``"hang"`` (reads the request, never answers until
    closed) or ``"trickle"`` (answers 200 and then one byte every 0.2 s, never finishing: each read succeeds,
    so no socket timeout ever fires). ``url`` is the Apprise ``json://`` URL of its ``/hook`` path."""

    def __init__(self, mode: str = "ok", path: str = "/hook"):
        self.mode = mode
        self.received: list[Received] = []
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.received.append(Received(time.time(), self.path, dict(self.headers), body))
                if receiver.mode == "hang":
                    receiver._release.wait(60)
                    return
                if receiver.mode == "trickle":  # an answer that never ends: one byte now and then
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    while not receiver._release.wait(0.2):
                        try:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                        except OSError:
                            return
                    return
                code = 200 if receiver.mode == "ok" else 500
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok" if code == 200 else b"no")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"json://127.0.0.1:{self.port}{path}"
        self.http_url = f"http://127.0.0.1:{self.port}{path}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "WebhookReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    def messages(self) -> list[dict]:
        return [r.json() for r in self.received]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Mail:
    at: float
    sender: str
    recipients: list[str]
    message: email.message.EmailMessage = field(repr=False)

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    def text(self) -> str:
        part = self.message.get_body(preferencelist=("plain",))
        return part.get_content() if part is not None else ""


class SmtpReceiver:
    """An aiosmtpd server on 127.0.0.1; ``url`` is the Apprise ``mailto://`` URL that sends to it."""

    def __init__(self, sender: str = "etl@example.com", to: str = "ops@example.com"):
        from aiosmtpd.controller import Controller

        self.mails: list[Mail] = []
        receiver = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
                receiver.mails.append(Mail(time.time(), envelope.mail_from, list(envelope.rcpt_tos), msg))
                return "250 OK"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.url = f"mailto://127.0.0.1:{self.port}?from={sender}&to={to}&mode=insecure"

    def __enter__(self) -> "SmtpReceiver":
        self.controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self.controller.stop()

