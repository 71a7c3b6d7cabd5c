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
        driver.viewport = lambda w=VIEWPORT[0], h=VIEWPORT[1]: driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride", {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": False})
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver, name: str, size: tuple[int, int] = VIEWPORT) -> Path:
    """Take the viewport (``size``, default 1280×800) as ``<name>.png`` in a temporary folder, or in
    docs/screenshots (the docs site's pictures, docs/guides/web.md) when ``FEIQIU_UPDATE_SCREENSHOTS=1``, so
    that a test run leaves the checkout clean."""
    import struct

    folder = SCREENSHOTS if os.environ.get("FEIQIU_UPDATE_SCREENSHOTS") == "1" else _SHOTS_TMP
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot of {name}"
    width, height = struct.unpack(">II", path.read_bytes()[16:24])  # the PNG header's IHDR
    assert (width, height) == tuple(size), (name, width, height)
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


# ------------------------------------------------------------------------------------- a chain's 30 nights
DISTRICTS = ("福田", "南山", "罗湖", "宝安", "龙岗", "龙华", "坪山", "光明", "盐田", "大鹏")


def chain_store_names(n: int, first_site: int = 8640015201004417) -> dict[int, str]:
    """``n`` stores with Chinese names (福田1号店 …), site ids from ``first_site`` on."""
    return {first_site + i: f"{DISTRICTS[i % len(DISTRICTS)]}{i // len(DISTRICTS) + 1}号店" for i in range(n)}


def seed_chain(conn, connector, stores: dict[int, str], *, nights: int = 30, lanes: int = 5,
               now=None) -> dict:
    """``nights`` nightly runs of a chain (``stores``: site id → name) in ``lanes`` lanes, as the runner records
    them: each night a run record (registry.start_run/finish_run) whose summary has the lanes' stores and one
    task result per store and task, plus the freshness state the tasks leave (``etl_meta.window_progress``: one
    day's segment per windowed task and night, ``etl_meta.snapshot_done`` per snapshot task). Not everything
    succeeds: the last lane's stores stopped at the deadline the last two nights (their windowed tasks are two
    days behind), one store never loaded its coupons, a few owe details, three stores' snapshots were taken this
    morning and one's 20 h ago, so the grid has every colour at any time of day. Returns
    ``{run_ids, last_run, stale_stores}``."""
    from datetime import datetime, timedelta, timezone

    from psycopg.types.json import Jsonb

    now = now or datetime.now(timezone.utc)
    sites = sorted(stores)
    tasks = list(connector.tasks)
    per_lane = -(-len(sites) // lanes)
    lane_of = {s: f"lane-{i // per_lane + 1}" for i, s in enumerate(sites)}
    late_lane = f"lane-{lanes}"
    never = {(sites[1], "ODS_COUPON")} if len(sites) > 1 else set()
    run_ids = []
    windows, snapshots = [], {}
    for k in range(nights, 0, -1):
        night_start = (now - timedelta(days=k - 1)).replace(hour=18, minute=0, second=0, microsecond=0) \
            - timedelta(days=1)  # 02:00 Asia/Shanghai
        started = night_start
        run_id = f"night-{started:%Y%m%d}"
        summary_lanes, results = [], []
        rows_total = 0
        for lane in sorted(set(lane_of.values())):
            members = [s for s in sites if lane_of[s] == lane]
            cut = k <= 2 and lane == late_lane  # the last two nights: a day behind and more
            lane_stores = []
            for n, site in enumerate(members):
                store_rows = 0
                done = 0
                for t_i, task in enumerate(tasks):
                    if (site, task.code) in never:
                        continue
                    stopped = cut and task.kind == "windowed"
                    rows = 0 if stopped else 40 + (site % 97) + 13 * t_i + (k % 7) * 5
                    store_rows += rows
                    done += 0 if stopped else 1
                    results.append({"site_id": site, "task": task.code, "table": task.table,
                                    "status": "DEADLINE" if stopped else "SUCCESS", "total_requests": 2,
                                    "total_fetched": rows, "total_inserted": rows // 4, "total_updated": rows // 9,
                                    "total_skipped": rows - rows // 4 - rows // 9, "total_deleted": 0,
                                    "errors": []})
                    if stopped:
                        continue
                    end = (started - timedelta(hours=2)).replace(hour=16, minute=0)  # 00:00 Shanghai
                    if task.kind == "windowed":
                        windows.append((task.code, site, end - timedelta(days=1), end, run_id,
                                        started + timedelta(minutes=5 + n + t_i / 10)))
                    else:
                        snapshots[(task.code, site)] = (started + timedelta(minutes=5 + n + t_i / 10), run_id)
                rows_total += store_rows
                lane_stores.append({"site_id": site, "name": stores[site],
                                    "status": "DEADLINE" if cut else "SUCCESS",
                                    "tasks_done": done, "tasks": len(tasks), "rows": store_rows, "requests": 42,
                                    "reason": "deadline 06:00 reached" if cut else None})
            deadline = {"text": "06:00", "reached": cut, "pace": 1.0}
            if cut:
                deadline["left_requests"] = 12 * len(members)
            summary_lanes.append({"name": lane, "status": "DEADLINE" if cut else "SUCCESS",
                                  "reason": "deadline 06:00 reached" if cut else None, "stores": lane_stores,
                                  "requests_sent": 42 * len(members), "deadline": deadline})
        from feiqiu_etl import registry

        registry.start_run(conn, registry.Invocation(run_id, "run", {"token": "***"}), config={},
                           lanes=[ln["name"] for ln in summary_lanes], stores=sites,
                           tasks=[t.code for t in tasks], started_at=started)
        status = "DEADLINE" if k <= 2 else "SUCCESS"
        registry.finish_run(conn, run_id, status=status, exit_code=0 if status == "SUCCESS" else 6,
                            summary={"lanes": summary_lanes, "tasks": results},
                            error="deadline 06:00 reached: lane-%d stopped" % lanes if k <= 2 else None,
                            totals={"rows_written": rows_total, "requests": 42 * len(sites)})
        conn.execute("UPDATE etl_meta.run SET finished_at = %s WHERE run_id = %s",
                     (started + timedelta(hours=3, minutes=40), run_id))
        run_ids.append(run_id)
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO etl_meta.window_progress (connector, task_code, site_id, window_start, "
                        "window_end, run_id, completed_at) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT DO NOTHING", [(connector.name, *w) for w in windows])
        cur.executemany("INSERT INTO etl_meta.snapshot_done (connector, task_code, site_id, completed_at, run_id) "
                        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        [(connector.name, code, site, at, rid) for (code, site), (at, rid) in snapshots.items()])
        owed = [(connector.name, "ODS_SETTLEMENT", s, f"owed-{i}", Jsonb({"settleId": i}))
                for i, s in enumerate(sites[:3] * 2)]
        cur.executemany("INSERT INTO etl_meta.detail_pending (connector, task_code, site_id, parent_key, record) "
                        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", owed)
        # whatever the time of day: three stores' snapshots were taken again this morning (fresh), one store's
        # 20 h ago (aging against the default 26 h)
        cur.execute("UPDATE etl_meta.snapshot_done SET completed_at = %s WHERE site_id = ANY(%s)",
                    (now - timedelta(minutes=30), sites[:3]))
        cur.execute("UPDATE etl_meta.snapshot_done SET completed_at = %s WHERE site_id = %s",
                    (now - timedelta(hours=20), sites[3 % len(sites)]))
    conn.commit()
    return {"run_ids": run_ids, "last_run": run_ids[-1],
            "stale_stores": [s for s in sites if lane_of[s] == late_lane]}
