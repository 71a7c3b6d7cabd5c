"""The Runs page with 1,000 runs in history vs 50 (one page), side by side: time to first byte and full render (the Runs page is /runs since the overview took /, issue 29).

Two databases on one embedded PostgreSQL: one with 50 runs, one with 1,000 (each with 21 tasks, 1-3 stores,
a summary of 21 task results, every status). One ``feiqiu-etl web`` process serves each. Measurements
alternate between the two (small, large, large, small, small, …) to share the machine's noise:

* HTTP (httpx, a fresh connection each time): time to first byte and to the last byte of ``GET /runs`` (the
  first page, 50 runs), of ``GET /runs?per_page=500`` and of ``GET /api/runs``;
* Debian's headless Chromium (Selenium): Navigation Timing of ``/runs`` — ``responseStart`` (first byte),
  ``loadEventEnd``, and the first frame painted after it (full render: HTML, CSS, layout, paint).

    python benchmarks/bench_web_runs_page.py [--runs 1000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from feiqiu_etl.connector import load_connector  # noqa: E402
from feiqiu_etl.db.connection import connect  # noqa: E402
from feiqiu_etl.db.embedded import EmbeddedPostgres, create_database  # noqa: E402
from feiqiu_etl.db.schema import ensure_schemas  # noqa: E402
from webkit import WebServer, chromium, seed_run  # noqa: E402

STATUSES = ["SUCCESS"] * 14 + ["PARTIAL"] * 3 + ["FAILED", "CANCELLED", "INTERRUPTED"]
STORES = [8640015201004417, 8640015201004418, 8640015201004419, 8640015201004420]


def seed(dsn: str, n: int) -> None:
    codes = [t.code for t in load_connector().tasks]
    rnd = random.Random(n)
    now = datetime.now(timezone.utc)
    with connect(dsn) as conn:
        ensure_schemas(conn)
        for i in range(n):
            status = rnd.choice(STATUSES)
            stores = tuple(rnd.sample(STORES, rnd.randint(1, 3)))
            summary = {"tasks": [{"task": c, "site_id": s, "status": "SUCCESS", "total_requests": rnd.randint(1, 90),
                                  "total_inserted": rnd.randint(0, 5000), "errors": [], "timing": {"total": 3.2}}
                                 for s in stores for c in codes],
                       "timeline": {"rows": [[t, t * 40] for t in range(60)]}}
            seed_run(conn, f"bench-{i:05d}", status=status, started_at=now - timedelta(hours=n - i),
                     seconds=rnd.uniform(20, 900), stores=stores, tasks=codes, summary=summary,
                     rows=rnd.randint(0, 200000), n_requests=rnd.randint(20, 2000),
                     rejections=rnd.randint(0, 3) if status != "SUCCESS" else 0,
                     errors=rnd.randint(1, 5) if status in ("PARTIAL", "FAILED") else 0,
                     error=None if status == "SUCCESS" else f"{status.lower()}: <upstream said something>")


def http_times(url: str) -> tuple[float, float]:
    """(first byte, last byte) of GET ``url`` in ms, on a fresh connection."""
    with httpx.Client() as client:
        t0 = time.perf_counter()
        with client.stream("GET", url) as response:
            first = time.perf_counter()
            response.read()
            last = time.perf_counter()
        assert response.status_code == 200, response.status_code
    return (first - t0) * 1000, (last - t0) * 1000


def browser_times(driver, url: str) -> tuple[float, float, float]:
    """(responseStart, loadEventEnd, first frame after load) of ``url`` in ms since navigation start; the
    last one is "full render": everything loaded, laid out and painted. (Headless Chromium reports no
    first-contentful-paint entry for many repeated navigations, so that one is not used.)"""
    driver.get(url)
    return tuple(driver.execute_async_script("""
        var done = arguments[arguments.length - 1];
        function report() {
          requestAnimationFrame(function () { requestAnimationFrame(function () {
            var painted = performance.now();
            var n = performance.getEntriesByType('navigation')[0];
            done([n.responseStart, n.loadEventEnd, painted]);
          }); });
        }
        if (document.readyState === 'complete') report(); else window.addEventListener('load', report);"""))


def med(values) -> float:
    return statistics.median(values)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--small", type=int, default=50, help="the other history: one full first page")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    import os

    print(f"{os.cpu_count()} CPUs, load average at start {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    home = Path(tempfile.mkdtemp(prefix="bench-web-"))
    server = EmbeddedPostgres(home / "pgdata").start()
    try:
        admin = server.dsn("postgres")
        dsns = {}
        for label, n in (("small", args.small), ("large", args.runs)):
            create_database(admin, f"web_{label}")
            dsns[label] = server.dsn(f"web_{label}")
            t0 = time.perf_counter()
            seed(dsns[label], n)
            print(f"seeded {n} runs in {time.perf_counter() - t0:.1f} s")
        webs = {label: WebServer(dsn) for label, dsn in dsns.items()}
        try:
            results: dict[str, dict[str, list]] = {k: {} for k in webs}
            with chromium() as driver:
                for label, web in webs.items():  # warm-up: templates compiled, pool connected
                    http_times(web.url + "/runs")
                    browser_times(driver, web.url + "/runs")
                for i in range(args.rounds):
                    for label, web in (list(webs.items()) if i % 2 == 0 else list(webs.items())[::-1]):
                        r = results[label]
                        for name, path in (("page", "/runs"), ("page500", "/runs?per_page=500"),
                                           ("api", "/api/runs")):
                            ttfb, total = http_times(web.url + path)
                            r.setdefault(f"{name}_ttfb", []).append(ttfb)
                            r.setdefault(f"{name}_total", []).append(total)
                        first, load, painted = browser_times(driver, web.url + "/runs")
                        r.setdefault("br_ttfb", []).append(first)
                        r.setdefault("br_load", []).append(load)
                        r.setdefault("br_painted", []).append(painted)
                rows = len(driver.find_elements("css selector", "#runs tbody tr"))
            print(f"\nRuns page, medians of {args.rounds} rounds (ms); history of {args.small} vs {args.runs} runs; "
                  f"the first page shows {rows} rows")
            print(f"{'measure':46} {args.small:>8} {args.runs:>8}   ratio")
            labels = {"page_ttfb": "HTTP GET /runs first byte", "page_total": "HTTP GET /runs last byte",
                      "page500_ttfb": "HTTP GET /runs?per_page=500 first byte",
                      "page500_total": "HTTP GET /runs?per_page=500 last byte",
                      "api_ttfb": "HTTP GET /api/runs first byte", "api_total": "HTTP GET /api/runs last byte",
                      "br_ttfb": "Chromium /runs responseStart (first byte)",
                      "br_load": "Chromium /runs loadEventEnd",
                      "br_painted": "Chromium /runs first frame after load (full render)"}
            for key, label in labels.items():
                small, large = med(results["small"][key]), med(results["large"][key])
                print(f"{label:46} {small:8.1f} {large:8.1f}   {large / small:5.2f}x")
        finally:
            for web in webs.values():
                web.stop()
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
