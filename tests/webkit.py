"""Test helpers for the web page: seeded runs, the web server as a real ``feiqiu-etl web`` process, and
Debian's real headless Chromium driven by Selenium through Debian's chromedriver.

Never a downloaded browser: the binaries are /usr/bin/chromium and /usr/bin/chromedriver (``.ci/run``
installs the packages ``chromium`` and ``chromium-driver``). If they are missing, :func:`chromium` fails the
test — it never skips. The flags keep Chromium off the network (the machine has none: without them it
hangs on lookups) and the profile is a fresh folder each time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         "--disable-default-apps", "--disable-extensions", "--password-store=basic", "--window-size=1280,800"]
VIEWPORT = (1280, 800)
SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
_SHOTS_TMP = Path(tempfile.gettempdir()) / "feiqiu-etl-screenshots"


@contextmanager
def chromium() -> Iterator["object"]:
    """A Selenium WebDriver on Debian's headless Chromium with a 1280×800 viewport."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    assert not missing, (f"{', '.join(missing)} missing: install Debian's chromium and chromium-driver "
                         "(apt-get install -y chromium chromium-driver; .ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must never try to download anything
    profile = tempfile.mkdtemp(prefix="feiqiu-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1,
                                "mobile": False})
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver, name: str) -> Path:
    """Take the viewport (1280×800) as ``<name>.png`` in a temporary folder, or in docs/screenshots (the
    docs site's pictures, docs/guides/web.md) when ``FEIQIU_UPDATE_SCREENSHOTS=1``, so that a test run leaves the
    checkout clean."""
    import struct

    folder = SCREENSHOTS if os.environ.get("FEIQIU_UPDATE_SCREENSHOTS") == "1" else _SHOTS_TMP
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot of {name}"
    width, height = struct.unpack(">II", path.read_bytes()[16:24])  # the PNG header's IHDR
    assert (width, height) == VIEWPORT, (name, width, height)
    return path


class WebServer:
    """``feiqiu-etl web --port 0`` as a real process; ``url`` is read from its first stderr line."""

    def __init__(self, dsn: str, *extra: str, host: str = "127.0.0.1", env: dict | None = None):
        cmd = [sys.executable, "-m", "feiqiu_etl", "web", "--host", host, "--port", "0", "--dsn", dsn, *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self._signalled = False
        deadline = time.monotonic() + 30
        while True:
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError(f"web server ended early ({self.proc.wait()}): {''.join(self.lines)}")
            self.lines.append(line)
            found = re.search(r"serving (http://\S+/)", line)
            if found:
                self.url = found.group(1).rstrip("/")
                break
            assert time.monotonic() < deadline, "web server did not start"
        import threading

        self._drain = threading.Thread(target=self._read_rest, daemon=True)  # a full pipe would block it
        self._drain.start()
        self._wait_ready()

    def _read_rest(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/static/app.css", timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise AssertionError("web server does not answer")

    def stop(self, sig: int | None = None) -> tuple[int, str]:
        """``sig`` (default SIGINT, once: a second one would be a hard abort), then its exit code and
        everything it wrote on stderr."""
        import signal

        if self.proc.poll() is None and not self._signalled:
            self._signalled = True
            self.proc.send_signal(sig or signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drain.join(5)
        return self.proc.returncode, "".join(self.lines)

    def __enter__(self) -> "WebServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------ seeding
def seed_run(conn, run_id: str, *, status: str = "SUCCESS", started_at=None, seconds: float = 12.0,
             stores=(8640015201004417,), tasks=("ODS_PAYMENT",), error: str | None = None,
             summary: dict | None = None, log: list[dict] | None = None, requests: list[dict] | None = None,
             rows: int = 100, n_requests: int = 10, rejections: int = 0, errors: int = 0) -> str:
    """A run record as the runner writes it (registry.start_run/finish_run), finished ``seconds`` after
    ``started_at`` (default: now - seconds); ``status`` RUNNING leaves it running (this process's pid)."""
    from datetime import datetime, timedelta, timezone

    from feiqiu_etl import registry

    started_at = started_at or datetime.now(timezone.utc) - timedelta(seconds=seconds)
    registry.start_run(conn, registry.Invocation(run_id, "run", {"token": "***"}), config={}, lanes=["default"],
                       stores=stores, tasks=tasks, started_at=started_at)
    if log:
        registry.append_log(conn, run_id, log)
    if requests:
        registry.append_requests(conn, run_id, requests)
    if status != "RUNNING":
        registry.finish_run(conn, run_id, status=status, exit_code={"SUCCESS": 0, "PARTIAL": 3, "FAILED": 4,
                                                                    "CANCELLED": 5}.get(status, 4),
                            summary=summary, error=error, totals={"rows_written": rows, "requests": n_requests,
                                                                  "rejections": rejections, "errors": errors})
        conn.execute("UPDATE etl_meta.run SET finished_at = started_at + make_interval(secs => %s) "
                     "WHERE run_id = %s", (seconds, run_id))
        conn.commit()
    return run_id


def attempt(seq: int, at, *, lane: str = "default", outcome: str = "ok", seconds: float = 0.05,
            gap: float | None = 0.3, wait_reason: str | None = "gap", request: str = "/api/payment/list page 1",
            gap_class: str = "standard", task: str = "ODS_PAYMENT", detail: str | None = None,
            site_id: int = 8640015201004417) -> dict:
    """One lane attempt row for ``etl_meta.run_request`` (registry.REQUEST_COLUMNS)."""
    return {"lane": lane, "seq": seq, "site_id": site_id, "task": task, "request": request, "gap_class": gap_class,
            "started_at": at, "seconds": seconds, "gap": gap, "wait_reason": wait_reason, "outcome": outcome,
            "detail": detail}
