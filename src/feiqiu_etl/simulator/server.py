"""The simulator's HTTP server: a stdlib ``ThreadingHTTPServer`` in a background thread, and :class:`Simulator`,
the object tests and the CLI hold.

What it is for: serving upstream-api.md over real HTTP/1.1 (keep-alive) on loopback, writing each response fully
*before* telling risk control the request is complete (§2.2 rule 2 measures the gap from that instant), and
recording every request in the log. ``GET`` on an API path answers HTTP 405 (HTML, ``Allow: POST``); unknown
paths answer HTTP 404 (HTML); the simulator's own endpoints live under ``/__sim/`` (``admin``: the request log, the
clock, moving time forward, the minimum requests) and are not logged.

What it must never do: bind anything but the configured host (loopback by default), print or log the token
(only :func:`serve_forever` prints it, once), or let one failing request stop the server.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from feiqiu_etl.simulator.admin import PREFIX as ADMIN_PREFIX
from feiqiu_etl.simulator.config import SimulatorConfig
from feiqiu_etl.simulator.dataset import AdvanceSummary, Dataset
from feiqiu_etl.simulator.faults import FaultInjector
from feiqiu_etl.simulator.minimum import RequestMinimum
from feiqiu_etl.simulator.requestlog import RequestLog, RequestLogEntry
from feiqiu_etl.simulator.risk import RiskController
from feiqiu_etl.simulator.service import Reply, Service


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two small writes on a kept-alive connection: without TCP_NODELAY, Nagle's
    # algorithm holds the body until the client's delayed ACK (~40 ms on Linux) and every response looks slow.
    disable_nagle_algorithm = True
    server_version = "fq-gateway/1.0"
    sys_version = ""
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
        self._serve("POST")

    def do_GET(self) -> None:  # noqa: N802
        self._serve("GET")

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - keep the console quiet
        return

    def _serve(self, method: str) -> None:
        started = time.monotonic()
        simulator = self.server.simulator
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        path = urlsplit(self.path).path
        seq = simulator.log.next_seq()
        reply = simulator.service.handle(method, path, self.headers, raw)
        logged = not path.startswith(ADMIN_PREFIX)  # the simulator's own endpoints are not API traffic
        if logged:
            simulator.log.writing(seq)
        ended = None
        try:
            ended = self._write(reply)
        except OSError:  # the client went away (e.g. it timed out on a stall)
            self.close_connection = True
        finally:
            reply.on_complete()
            ended = time.monotonic() if ended is None else ended
            if logged:
                simulator.log.append(_entry(seq, path, reply, started, ended))

    def _write(self, reply: Reply) -> float:
        """Send ``reply``; returns the instant (monotonic s) its body was handed to the kernel: the earliest the
        client can hold the whole response. The log's ``ended`` is that instant, not the end of the write: on a
        busy machine this thread may get the CPU back tens of ms after the client already read the last byte,
        which made a gap measured here look that much shorter than the client's."""
        self.send_response(reply.http_status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        sent = time.monotonic()
        self.wfile.write(reply.body)
        self.wfile.flush()
        return sent


def _entry(seq: int, path: str, reply: Reply, started: float, ended: float) -> RequestLogEntry:
    return RequestLogEntry(
        seq=seq, path=path, body=reply.parsed_body, site_id=reply.site_id, started=started, ended=ended,
        http_status=reply.http_status, code=reply.code, outcome=reply.outcome, record_count=reply.record_count,
        accepted=reply.accepted, fault=reply.fault,
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], simulator: Simulator) -> None:
        self.simulator = simulator
        super().__init__(address, _Handler)


class Simulator:
    """A running (or startable) simulated Feiqiu API; see the package docstring for an example.

    ``clock`` (default ``time.monotonic``) drives risk control and may be replaced in tests.
    """

    def __init__(self, config: SimulatorConfig | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or SimulatorConfig()
        self.dataset = Dataset(self.config)
        self.risk = RiskController(self.config.risk, clock)
        self.faults = FaultInjector()
        for fault in self.config.faults:  # faults set at start (SimulatorConfig.faults)
            self.faults.inject(fault.get("path"), fault["kind"], fault.get("count", 1), day=fault.get("day"),
                               page=fault.get("page"))
        self.log = RequestLog()
        self.service = Service(self.config, self.dataset, self.risk, self.faults, self.log)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> Simulator:
        """Bind ``config.host:config.port`` (0 = a free port) and serve in a background thread."""
        if self._server is not None:
            return self
        self._server = _Server((self.config.host, self.config.port), self)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="feiqiu-simulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port (stalled handlers are daemon threads and are not waited for)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` of the running server."""
        if self._server is None:
            raise RuntimeError("the simulator is not running; call start() first")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- observation and control ---------------------------------------------------------------------------
    def request_log(self) -> list[RequestLogEntry]:
        """Snapshot of every request so far, in arrival order (thread-safe)."""
        return self.log.snapshot()

    def clear_log(self) -> None:
        self.log.clear()

    def advance(self, hours: float) -> AdvanceSummary:
        """Move the simulator's clock ``hours`` forward with the trading and edits of that time (what
        ``POST /__sim/advance`` does; see :meth:`Dataset.advance_trading`). Raises ``ValueError`` for bad hours."""
        return self.dataset.advance_trading(hours)

    def minimum_requests(self, site_id: int, start: datetime, end: datetime, limit: int = 200) -> RequestMinimum:
        """The fewest requests a perfect connector needs for a store over ``[start, end)`` (naive Shanghai times;
        ``POST /__sim/minimum``; see :meth:`Dataset.minimum_requests`)."""
        return self.dataset.minimum_requests(site_id, start, end, limit)

    def add_field(self, name: str, value: Any, task_code: str = "*") -> None:
        """Schema drift: from now on every list record of ``task_code`` (``"*"``: all) carries ``name: value``."""
        self.service.add_field(name, value, task_code)

    def remove_field(self, name: str, task_code: str = "*") -> None:
        """Undo :meth:`add_field` (or a configured ``extra_fields`` entry) for ``task_code``."""
        self.service.remove_field(name, task_code)

    def revoke(self, token: str, after: int = 0) -> None:
        """``token`` answers 40101 after ``after`` more requests, until :meth:`reinstate` (see ``Service.revoke``)."""
        self.service.revoke(token, after)

    def reinstate(self, token: str) -> None:
        self.service.reinstate(token)

    def inject(self, path: str | None = None, kind: str = "http500", count: int = 1, retry_after: int = 1,
               stall_seconds: float = 5.0, day: str | None = None, page: int | None = None) -> None:
        """Give the next ``count`` requests to ``path`` (``None`` = any) the fault ``kind`` (see ``faults``; the
        data faults ``short_page``, ``total_zero``/``empty_page``, ``total_moves`` and ``zero_day`` with its
        ``day`` strike list requests only, ``page`` only that page). Over HTTP: ``POST /__sim/faults``."""
        self.faults.inject(path, kind, count, retry_after, stall_seconds, day, page)

    def clear_faults(self) -> None:
        """Drop every pending fault."""
        self.faults.clear()


def serve_forever(cfg: SimulatorConfig) -> None:
    """Run a simulator in the foreground until SIGINT/SIGTERM; prints the base URL and the token once."""
    stop = threading.Event()
    with Simulator(cfg) as simulator:
        print(f"Feiqiu simulator listening on {simulator.base_url}", flush=True)
        print(f"Bearer token: {cfg.token}", flush=True)
        print(f"Sites: {', '.join(str(s) for s in cfg.all_site_ids())}; history until {simulator.dataset.now()} (Asia/Shanghai)",
              flush=True)
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, lambda *_: stop.set())
        try:
            while not stop.wait(0.5):
                pass
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
