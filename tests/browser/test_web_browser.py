"""The admin web page in a REAL headless Chromium (Debian's chromium + chromium-driver, driven by Selenium):
Runs, a live run watched and cancelled from the Live page (CANCELLED on the page and in ``feiqiu-etl show``),
a run's timeline chart, Freshness, and the token on a non-loopback bind. Takes the docs' screenshots
(docs/screenshots/*.png, 1280×800) and prints the measured live-update delay and cancel latency.

Everything is real: ``feiqiu-etl web`` and ``feiqiu-etl run`` are separate processes, the simulator answers
over loopback HTTP, PostgreSQL is the embedded server. A missing Chromium fails these tests; they never skip.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

import httpx
import psycopg
import pytest
from psycopg import sql

from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.schema import ensure_schemas
from feiqiu_etl.simulator import Simulator
from flowkit import ANCHOR, run_flow, sim_config
from webkit import WebServer, attempt, chromium, screenshot, seed_run

pytestmark = [pytest.mark.browser, pytest.mark.integration]

TOKEN = "browser-test-token-0123456789"
XSS_ERROR = 'upstream said: <script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
LIVE_TASKS = "ODS_MEMBER,ODS_SETTLEMENT"  # ~70 requests at 0.3-0.4 s: about 25 s if nobody cancels
RESULTS: dict[str, object] = {}


def _wait(predicate, timeout: float = 20.0, step: float = 0.02, what: str = "condition"):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


@pytest.fixture(scope="module")
def dsn(pg_server_dsn):
    """One database for the whole module (the pages build on each other's runs)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from feiqiu_etl.db.embedded import create_database

    name = f"t_web_{uuid.uuid4().hex[:10]}"
    create_database(pg_server_dsn, name)
    yield make_conninfo(**{**conninfo_to_dict(pg_server_dsn), "dbname": name})
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def sim():
    with Simulator(sim_config(seed=23, days=2)) as s:
        yield s


@pytest.fixture(scope="module")
def history(dsn, sim):
    """A real finished run (in process, fast gaps) plus seeded runs of every status, one with an upstream
    error that carries markup."""
    result = run_flow(sim, dsn, tasks=["ODS_PAYMENT", "ODS_MEMBER_CARD", "ODS_GOODS", "ODS_GROUP_PACKAGE"])
    assert result.status == "SUCCESS"
    now = datetime.now(timezone.utc)
    with connect(dsn) as conn:
        ensure_schemas(conn)
        for i, status in enumerate(["SUCCESS", "PARTIAL", "INTERRUPTED", "SUCCESS"]):
            seed_run(conn, f"2024seed-{i}", status=status, started_at=now - timedelta(hours=30 - i), seconds=40 + i,
                     stores=(sim.config.site_ids[0],), rows=1200 + 10 * i, n_requests=60 + i,
                     rejections=i % 2, errors=1 if status == "PARTIAL" else 0,
                     error="3 item(s) failed" if status == "PARTIAL" else None)
        seed_run(conn, "2024seed-xss", status="FAILED", started_at=now - timedelta(hours=2), seconds=3,
                 error=XSS_ERROR, stores=(sim.config.site_ids[0],), rows=0, n_requests=2, errors=1,
                 log=[{"ts": now - timedelta(hours=2), "level": "ERROR", "message": XSS_ERROR}],
                 requests=[attempt(1, now - timedelta(hours=2), outcome="error", detail=XSS_ERROR, gap=None)])
    return result.run_id


@pytest.fixture(scope="module")
def web(dsn, history):
    server = WebServer(dsn)
    yield server
    code, log = server.stop()
    assert code == 0, log
    assert "Traceback" not in log


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def test_runs_page_lists_the_history_newest_first_with_filters(web, browser, history):
    browser.get(web.url + "/runs")
    rows = browser.find_elements("css selector", "#runs tbody tr")
    ids = [r.get_attribute("data-run-id") for r in rows]
    assert ids[0] == history and len(ids) == 6  # the real run is the newest
    statuses = {r.get_attribute("data-run-id"): r.find_element("css selector", ".badge").text for r in rows}
    assert statuses["2024seed-1"] == "PARTIAL" and statuses["2024seed-xss"] == "FAILED"
    colour = browser.find_element("css selector", "tr[data-run-id='2024seed-xss'] .badge").value_of_css_property(
        "color")
    assert colour == "rgba(185, 28, 28, 1)"  # failed is red
    screenshot(browser, "runs")
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("name", "status")).select_by_value("PARTIAL")
    browser.find_element("css selector", ".filters button[type=submit]").click()
    _wait(lambda: "status=PARTIAL" in browser.current_url, what="the filtered page")
    assert [r.get_attribute("data-run-id") for r in browser.find_elements("css selector", "#runs tbody tr")] == \
        ["2024seed-1"]
    assert browser.execute_script("return window.__xss") is None


def test_live_page_follows_a_run_and_cancel_makes_it_cancelled(web, browser, sim, dsn):
    browser.get(web.url + "/live")
    _wait(lambda: browser.find_element("id", "feed-state").get_attribute("data-state") == "live",
          what="the live feed")
    # record, after the frame that shows it, every new value of "requests sent" and the run's status
    browser.execute_script("""
        window.__seen = []; window.__status = [];
        document.addEventListener('feiqiu:live-rendered', function () {
          requestAnimationFrame(function () {
            var now = Date.now();
            document.querySelectorAll('#live-runs .run-card, #finished-runs .run-card').forEach(function (c) {
              var v = c.querySelector('[data-field=requests_sent]').textContent;
              var s = c.querySelector('[data-field=status]').textContent;
              var last = window.__seen[window.__seen.length - 1];
              if (s === 'RUNNING' && (!last || last.v !== v))
                window.__seen.push({t: now, v: v, run: c.dataset.runId, beat: c.dataset.heartbeat});
              var ls = window.__status[window.__status.length - 1];
              if (!ls || ls.s !== s) window.__status.push({t: now, s: s});
            });
          });
        });""")
    sim.clear_log()
    for kind in ("http429", "http500"):  # something for the timeline to show: a throttle, an error, retries
        sim.inject(path="/api/member/detail", kind=kind, count=1, retry_after=1)
    sets = {"pipeline.rate_min": 0.3, "pipeline.rate_max": 0.4, "pipeline.batch_timeout": 0.2,
            "api.retry_backoff": 0.02, "api.timeout": 5}
    window = ["--window-start", (ANCHOR - timedelta(days=2)).strftime("%Y-%m-%d %H:%M:%S"),
              "--window-end", ANCHOR.strftime("%Y-%m-%d %H:%M:%S")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "feiqiu_etl", "run", "--api-base", sim.base_url, "--site-id",
         str(sim.config.site_ids[0]), "--dsn", dsn, "--no-dwd", "--json", "--unsafe-gaps", "--tasks", LIVE_TASKS,
         *window, *[f"--set={k}={v}" for k, v in sets.items()]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FEIQIU_API_TOKEN": sim.config.token})
    try:
        card = _wait(lambda: browser.find_elements("css selector", "#live-runs .run-card"), 30,
                     what="the run's card")[0]
        run_id = card.get_attribute("data-run-id")
        _wait(lambda: sum(s["v"].replace(",", "").isdigit() for s in browser.execute_script("return window.__seen"))
              >= 8, 30, what="eight live updates")
        browser.execute_script("window.scrollTo(0, 0)")
        screenshot(browser, "live")
        assert card.find_element("css selector", "[data-field=phase]").text
        lanes = card.find_elements("css selector", "table.lanes tbody tr")
        assert lanes and lanes[0].get_attribute("data-lane") == "default"
        assert "ODS_" in lanes[0].find_element("css selector", "[data-field=current]").text \
            or lanes[0].find_element("css selector", "[data-field=next]").text
        # Cancel: the dialog first, then the real click on "Cancel the run"
        card.find_element("css selector", "button[data-cancel]").click()
        dialog = browser.find_element("id", "cancel-dialog")
        _wait(lambda: dialog.get_attribute("open") is not None, what="the confirmation dialog")
        assert run_id in dialog.text
        screenshot(browser, "cancel-dialog")
        browser.execute_script("""document.getElementById('cancel-confirm').addEventListener('click',
            function () { window.__clicked = Date.now(); }, {capture: true, once: true});""")
        browser.find_element("id", "cancel-confirm").click()
        _wait(lambda: card.find_element("css selector", "[data-field=status]").text == "CANCELLED", 10, 0.01,
              what="CANCELLED on the page")
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 5, err
    assert json.loads(out)["status"] == "CANCELLED"
    clicked = browser.execute_script("return window.__clicked")
    shown = next(s["t"] for s in browser.execute_script("return window.__status") if s["s"] == "CANCELLED")
    cancel_latency = (shown - clicked) / 1000
    assert 0 < cancel_latency < 3.0  # "within a couple of seconds"
    assert card.get_attribute("data-status") == "CANCELLED"
    assert card.find_elements("css selector", "button[data-cancel]") == []
    show = subprocess.run([sys.executable, "-m", "feiqiu_etl", "show", run_id, "--json", "--dsn", dsn],
                          capture_output=True, text=True, timeout=60)
    assert show.returncode == 0, show.stderr
    shown_run = json.loads(show.stdout)
    assert shown_run["status"] == "CANCELLED" and shown_run["cancel_requested_by"].startswith("web page")
    # live-update delay: the lane sends request N (the simulator logs its arrival) → the first frame that shows
    # N or more; and the run's heartbeat (the snapshot written to the database) → the frame that shows it
    offset = time.time() - time.monotonic()
    arrivals = sorted(e.started + offset for e in sim.request_log())
    seen = [s for s in browser.execute_script("return window.__seen")
            if s["run"] == run_id and s["v"].replace(",", "").isdigit()]
    paints = [(s["t"] / 1000, int(s["v"].replace(",", ""))) for s in seen]
    delays = []
    for n, sent in enumerate(arrivals, 1):
        shown_at = next((t for t, v in paints if v >= n), None)
        if n > paints[0][1] and shown_at is not None:  # sent while the page was watching, and shown
            delays.append(shown_at - sent)
    beats = [s["t"] / 1000 - datetime.fromisoformat(s["beat"]).timestamp() for s in seen if s.get("beat")]
    assert len(delays) >= 4 and min(delays) > 0 and beats and min(beats) > 0
    q = statistics.quantiles(delays, n=20, method="inclusive")
    RESULTS.update(run_id=run_id, cancel_latency_s=round(cancel_latency, 3),
                   live_delay_median_s=round(statistics.median(delays), 3), live_delay_p95_s=round(q[-1], 3),
                   live_delay_max_s=round(max(delays), 3), lane_events=len(delays),
                   heartbeat_to_paint_median_s=round(statistics.median(beats), 3))
    print(f"\nlive-update delay (request sent at the lane -> first frame showing it): median "
          f"{statistics.median(delays):.3f} s, p95 {q[-1]:.3f} s, max {max(delays):.3f} s over {len(delays)} "
          f"requests; heartbeat written -> painted: median {statistics.median(beats):.3f} s, max {max(beats):.3f} s "
          f"over {len(beats)} updates; cancel latency (click -> CANCELLED painted): {cancel_latency:.3f} s")
    assert max(delays) < 3.0


def test_run_page_draws_the_lane_timeline(web, browser, history):
    run_id = RESULTS.get("run_id") or history
    browser.get(f"{web.url}/runs/{run_id}")
    chart = browser.find_element("css selector", "svg#timeline")
    assert chart.size["width"] > 1000 and chart.size["height"] > 150  # laid out and drawn
    bars = browser.find_elements("css selector", "svg#timeline rect.req")
    drawn = browser.execute_script(
        "return Array.from(document.querySelectorAll('svg#timeline rect.req')).map(function (r) {"
        " var b = r.getBBox(); return [b.width, b.height, Number(r.dataset.n)]; })")
    assert len(bars) >= 5 and all(w >= 1 and h > 10 for w, h, _ in drawn)
    assert sum(n for _, _, n in drawn) == int(chart.get_attribute("data-attempts")) > 5
    assert browser.find_elements("css selector", "svg#timeline rect.wait")
    if RESULTS.get("run_id"):  # the cancelled run: its rows series was stored at the end
        points = browser.find_element("css selector", "svg#timeline #rows-line").get_attribute("points").split()
        assert len(points) >= 2
        assert browser.find_element("id", "run-status").text == "CANCELLED"
    browser.execute_script("window.scrollTo(0, 0)")
    screenshot(browser, "run")
    # the same page for a run whose error carries markup: shown as text, never run
    browser.get(f"{web.url}/runs/2024seed-xss")
    assert XSS_ERROR in browser.find_element("id", "run-error").text
    assert browser.execute_script("return window.__xss") is None
    browser.get(f"{web.url}/runs/{history}")
    tasks = [t.get_attribute("data-task") for t in browser.find_elements("css selector", "tr.task")]
    assert tasks == ["ODS_PAYMENT", "ODS_MEMBER_CARD", "ODS_GOODS", "ODS_GROUP_PACKAGE"]
    everything = len(browser.find_elements("css selector", "#run-log tbody tr"))
    browser.find_element("css selector", "tr.task[data-task='ODS_PAYMENT'] a").click()  # its stored log
    _wait(lambda: "task=ODS_PAYMENT" in browser.current_url, what="the task's log")
    logged = [r.find_elements("css selector", "td")[4].text for r in
              browser.find_elements("css selector", "#run-log tbody tr")]
    assert logged and set(logged) == {"ODS_PAYMENT"} and len(logged) < everything


def test_freshness_page_reds_what_is_older_than_the_threshold(web, browser):
    browser.get(web.url + "/freshness")
    rows = browser.find_elements("css selector", "#freshness tbody tr")
    by_task = {r.get_attribute("data-task"): r.get_attribute("class") for r in rows}
    assert by_task["ODS_GOODS"] == "fresh" and by_task["ODS_MEMBER_CARD"] == "fresh"  # snapshots just taken
    assert by_task["ODS_PAYMENT"] == "stale"  # its window ended on the simulator's 2024 anchor
    assert by_task["ODS_COUPON"] == "stale"  # never loaded
    screenshot(browser, "freshness")
    field = browser.find_element("name", "hours")
    field.clear()
    field.send_keys("0.0001")
    field.submit()
    _wait(lambda: "hours=0.0001" in browser.current_url, what="the new threshold")
    assert {r.get_attribute("class") for r in browser.find_elements("css selector", "#freshness tbody tr")} == \
        {"stale"}


def test_a_non_loopback_bind_answers_401_without_the_token(dsn, browser, history):
    with WebServer(dsn, host="127.0.0.2", env={"FEIQIU_WEB_TOKEN": TOKEN}) as server:
        assert server.url.startswith("http://127.0.0.2:")
        for path in ("/", "/api/runs", "/api/status", f"/runs/{history}"):
            anonymous = httpx.get(server.url + path)
            assert anonymous.status_code == 401 and TOKEN not in anonymous.text, path
        api = httpx.get(server.url + "/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert api.status_code == 200 and api.json()["total"] == 7 and TOKEN not in api.text
        browser.get(server.url + "/live")
        assert browser.find_element("id", "login-submit")  # the 401 page is the login form
        screenshot(browser, "login")
        browser.find_element("id", "token").send_keys(TOKEN)
        browser.find_element("id", "login-submit").click()
        _wait(lambda: browser.current_url.endswith("/live"), what="the live page after login")
        _wait(lambda: browser.find_element("id", "feed-state").get_attribute("data-state") == "live",
              what="the live feed behind the login")
        assert TOKEN not in browser.page_source
        assert TOKEN not in browser.execute_script("return document.cookie")  # HttpOnly, and not the token
    code, log = server.stop()
    assert TOKEN not in log
