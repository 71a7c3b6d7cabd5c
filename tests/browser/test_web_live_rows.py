"""Live "rows written" counts only rows inserted or updated (issue 27.3), in a REAL headless Chromium: an unchanged
rerun reads 0 rows written while it runs and when it ended, its unchanged rows shown apart; the Live header's
time carries the display zone's offset. ``feiqiu-etl web`` and ``feiqiu-etl run`` are real processes, the
simulator answers over loopback HTTP, PostgreSQL is the embedded server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from feiqiu_etl.simulator import Simulator
from flowkit import ANCHOR, run_flow, sim_config
from webkit import WebServer, chromium

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def _wait(predicate, timeout: float = 30.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


TASKS = "ODS_MEMBER_CARD,ODS_GOODS,ODS_PAYMENT,ODS_TABLE_USE,ODS_GOODS_SALE,ODS_INVENTORY_CHANGE"


def test_an_unchanged_rerun_reads_0_rows_written_on_the_live_page(pg_dsn):
    with Simulator(sim_config(seed=31, days=2)) as sim, chromium() as browser:
        first = run_flow(sim, pg_dsn, tasks=TASKS.split(","))  # the first load: every row new
        assert first.status == "SUCCESS" and first.totals()["rows_written"] > 0
        server = WebServer(pg_dsn, env={"DISPLAY_TIMEZONE": "Asia/Kolkata"})
        try:
            browser.get(server.url + "/live")
            _wait(lambda: browser.find_element("id", "feed-state").get_attribute("data-state") == "live",
                  what="the live feed")
            assert re.search(r"\d\d:\d\d:\d\d \+05:30$", browser.find_element("id", "feed-state").text)
            browser.execute_script("""
                window.__seen = [];
                document.addEventListener('feiqiu:live-rendered', function () {
                  document.querySelectorAll('#live-runs .run-card, #finished-runs .run-card').forEach(function (c) {
                    window.__seen.push({s: c.querySelector('[data-field=status]').textContent,
                      w: c.querySelector('[data-field=rows_written]').textContent,
                      u: c.querySelector('[data-field=rows_unchanged]').textContent});
                  });
                });""")
            sets = {"pipeline.rate_min": 0.6, "pipeline.rate_max": 0.7, "pipeline.batch_timeout": 0.2,
                    "api.retry_backoff": 0.02, "api.timeout": 5, "detail.recheck_share": 0}
            window = ["--window-start", (ANCHOR - timedelta(days=2)).strftime("%Y-%m-%d %H:%M:%S"),
                      "--window-end", ANCHOR.strftime("%Y-%m-%d %H:%M:%S")]
            proc = subprocess.run(
                [sys.executable, "-m", "feiqiu_etl", "run", "--api-base", sim.base_url, "--site-id",
                 str(sim.config.site_ids[0]), "--dsn", pg_dsn, "--no-dwd", "--json", "--unsafe-gaps", "--no-progress",
                 "--tasks", TASKS, *window, *[f"--set={k}={v}" for k, v in sets.items()]],
                capture_output=True, text=True, timeout=120, env={**os.environ, "FEIQIU_API_TOKEN": sim.config.token})
            assert proc.returncode == 0, proc.stderr
            rerun = json.loads(proc.stdout)
            assert rerun["rows_written"] == 0 and rerun["rows_unchanged"] > 0  # every record unchanged
            card = _wait(lambda: [c for c in browser.find_elements("css selector", "#finished-runs .run-card")
                                  if c.get_attribute("data-run-id") == rerun["run_id"]], what="the finished card")[0]
            _wait(lambda: card.find_element("css selector", "[data-field=status]").text == "SUCCESS",
                  what="SUCCESS on the card")
            seen = browser.execute_script("return window.__seen")
            final = (card.find_element("css selector", "[data-field=rows_written]").text,
                     card.find_element("css selector", "[data-field=rows_unchanged]").text)
        finally:
            code, log = server.stop()
        assert code == 0, log
    running = [s for s in seen if s["s"] == "RUNNING" and s["w"] != "-"]
    assert running, seen[-5:]  # the page saw the rerun while it ran
    assert {s["w"] for s in running} == {"0"}  # never the unchanged rows as "written"
    assert any(s["u"] not in ("-", "0") for s in running)  # they are shown apart
    assert final == ("0", f"{rerun['rows_unchanged']:,}")
