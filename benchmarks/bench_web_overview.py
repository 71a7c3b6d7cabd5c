"""The chain overview (``/``, issue 29) of a 50-store × 21-task fleet with 30 nights of history, from a warm
``feiqiu-etl web`` server: does it render in under 1 s, and does the grid fit one 1440×900 screen?

One embedded PostgreSQL, one database seeded as the runner records a chain's nights (tests/webkit.seed_chain:
30 nightly runs of 50 stores in 5 lanes, each with a summary of 1,050 task results, the windows and snapshots
they completed, a few owed details; the last lane stopped at the deadline last night). One ``feiqiu-etl web``
process serves it, warmed by three requests. Then ``--rounds`` times:

* HTTP (httpx, a fresh connection each time): first and last byte of ``GET /`` and of ``GET /api/overview``;
* Debian's headless Chromium (Selenium) at 1440×900: Navigation Timing of ``/`` — ``responseStart``,
  ``loadEventEnd`` and the first frame painted after it (full render: HTML, CSS, layout, paint) — in English
  and in Chinese (the language switch's cookie);
* as a baseline on the same machine at the same moment, the Freshness page: the same 1,050 (store, task) pairs
  as a list (the page a chain had before the overview).

Afterwards it checks the grid's box: all 50 rows × 21 cells inside the 1440×900 viewport, no scrolling.

    python benchmarks/bench_web_overview.py [--stores 50] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_web_runs_page import browser_times, http_times  # noqa: E402
from feiqiu_etl.connector import load_connector  # noqa: E402
from feiqiu_etl.db.connection import connect  # noqa: E402
from feiqiu_etl.db.embedded import create_database, temporary_server  # noqa: E402
from feiqiu_etl.db.schema import ensure_schemas  # noqa: E402
from webkit import WebServer, chain_store_names, chromium, seed_chain  # noqa: E402

SCREEN = (1440, 900)


def grid_box(driver) -> dict:
    """Where the grid and its last cell are on the screen, and whether the page scrolls."""
    return driver.execute_script("""
        var t = document.getElementById('overview').getBoundingClientRect();
        var cells = document.querySelectorAll('#overview td.cell');
        var last = cells[cells.length - 1].getBoundingClientRect();
        return {rows: document.querySelectorAll('#overview tbody tr').length, cells: cells.length,
                right: t.right, bottom: t.bottom, last_right: last.right, last_bottom: last.bottom,
                cell_w: last.width, cell_h: last.height,
                scroll_x: document.documentElement.scrollWidth > window.innerWidth,
                inner: [window.innerWidth, window.innerHeight]};""")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stores", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load average at start {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    connector = load_connector()
    with temporary_server(prefix="bench-overview-") as server:
        create_database(server.dsn("postgres"), "overview")
        dsn = server.dsn("overview")
        t0 = time.perf_counter()
        with connect(dsn) as conn:
            ensure_schemas(conn)
            seeded = seed_chain(conn, connector, chain_store_names(args.stores))
        print(f"seeded {args.stores} stores × {len(connector.tasks)} tasks, {len(seeded['run_ids'])} nights in "
              f"{time.perf_counter() - t0:.1f} s")
        web = WebServer(dsn)
        try:
            with chromium() as driver:
                driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                       {"width": SCREEN[0], "height": SCREEN[1], "deviceScaleFactor": 1,
                                        "mobile": False})
                for _ in range(3):  # warm: templates compiled, pool connected
                    http_times(web.url + "/")
                    browser_times(driver, web.url + "/")
                r: dict[str, list] = {}
                for i in range(args.rounds):
                    for name, path in (("page", "/"), ("api", "/api/overview"), ("fresh", "/freshness")):
                        ttfb, total = http_times(web.url + path)
                        r.setdefault(f"{name}_ttfb", []).append(ttfb)
                        r.setdefault(f"{name}_total", []).append(total)
                    for lang in ("en", "zh-CN"):
                        driver.get(f"{web.url}/lang/{lang}?next=/static/app.css")
                        first, load, painted = browser_times(driver, web.url + "/")
                        r.setdefault(f"{lang}_ttfb", []).append(first)
                        r.setdefault(f"{lang}_load", []).append(load)
                        r.setdefault(f"{lang}_painted", []).append(painted)
                    first, load, painted = browser_times(driver, web.url + "/freshness")  # the baseline
                    r.setdefault("fresh_painted", []).append(painted)
                driver.get(web.url + "/")
                box = grid_box(driver)
        finally:
            web.stop()
        print(f"\nOverview of {args.stores} stores × {len(connector.tasks)} tasks, 30 nights; medians (max) of "
              f"{args.rounds} rounds, ms, warm server")
        labels = {"page_ttfb": "HTTP GET / first byte", "page_total": "HTTP GET / last byte",
                  "api_ttfb": "HTTP GET /api/overview first byte", "api_total": "HTTP GET /api/overview last byte",
                  "en_ttfb": "Chromium / (en) responseStart", "en_load": "Chromium / (en) loadEventEnd",
                  "en_painted": "Chromium / (en) first frame after load (full render)",
                  "zh-CN_ttfb": "Chromium / (zh-CN) responseStart", "zh-CN_load": "Chromium / (zh-CN) loadEventEnd",
                  "zh-CN_painted": "Chromium / (zh-CN) first frame after load (full render)",
                  "fresh_total": "baseline: HTTP GET /freshness (1,050 rows) last byte",
                  "fresh_painted": "baseline: Chromium /freshness (zh-CN) full render"}
        for key, label in labels.items():
            print(f"{label:58} {statistics.median(r[key]):8.1f} ({max(r[key]):.1f})")
        fits = box["last_right"] <= SCREEN[0] and box["last_bottom"] <= SCREEN[1] and not box["scroll_x"]
        print(f"\ngrid at {SCREEN[0]}×{SCREEN[1]}: {box['rows']} rows, {box['cells']} cells, last cell ends at "
              f"x={box['last_right']:.0f} y={box['last_bottom']:.0f} (cells {box['cell_w']:.0f}×{box['cell_h']:.0f} "
              f"px), horizontal scroll: {box['scroll_x']} -> {'fits one screen' if fits else 'DOES NOT FIT'}")
        print(f"load average at the end {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        worst = max(statistics.median(r[k]) for k in ("en_painted", "zh-CN_painted"))
        print(f"full render median {worst:.0f} ms -> {'under 1 s' if worst < 1000 else 'OVER 1 s'}")


if __name__ == "__main__":
    main()
