"""The chain overview, tonight at a glance and the pages in Chinese, in a REAL headless Chromium (issue 29).

A chain of 50 stores × 21 tasks with 30 nights of history (webkit.seed_chain, as the runner records them) is
served by a real ``feiqiu-etl web`` process; the checks read what Chromium drew:

* every cell of the grid agrees with ``feiqiu-etl freshness --json`` (a separate process): stale exactly when
  it says stale, the colour its age gives against the threshold, the age itself; the grid fits 1440×900;
* a click on a cell opens its history with the age chart;
* during a real ``feiqiu-etl run --deadline`` against the simulator, the Tonight table shows each lane's
  expected end and deadline, and the expected end agrees with ``feiqiu-etl status --json`` within 10 %;
* the language switch turns every page Chinese and back, and the Chinese glyphs are drawn by a font (not the
  boxes of a missing one: fonts-noto-cjk, which .ci/run installs);
* screenshots for docs/screenshots in both languages (``FEIQIU_UPDATE_SCREENSHOTS=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta

import psycopg
import pytest
from psycopg import sql

from feiqiu_etl.connector import load_connector
from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.schema import ensure_schemas
from feiqiu_etl.simulator import Simulator
from flowkit import ANCHOR, sim_config
from webkit import WebServer, chain_store_names, chromium, screenshot, seed_chain

pytestmark = [pytest.mark.browser, pytest.mark.integration]

STORES = 50
SCREEN = (1440, 900)
CONNECTOR = load_connector()


def _wait(predicate, timeout: float = 20.0, step: float = 0.05, what: str = "condition"):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def cli(dsn: str, *args: str, timeout: float = 60) -> dict | list:
    out = subprocess.run([sys.executable, "-m", "feiqiu_etl", *args, "--json", "--dsn", dsn],
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode in (0, 1), out.stderr  # freshness exits 1 with stale rows only under --fail-stale
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def dsn(pg_server_dsn):
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from feiqiu_etl.db.embedded import create_database

    name = f"t_ov_{uuid.uuid4().hex[:10]}"
    create_database(pg_server_dsn, name)
    dsn = make_conninfo(**{**conninfo_to_dict(pg_server_dsn), "dbname": name})
    with connect(dsn) as conn:
        ensure_schemas(conn)
        seed_chain(conn, CONNECTOR, chain_store_names(STORES))
    yield dsn
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def web(dsn):
    server = WebServer(dsn)
    yield server
    code, log = server.stop()
    assert code == 0, log
    assert "Traceback" not in log


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def grid(browser) -> dict:
    """What Chromium shows of every cell: ``{(site, task): {colour, age, background}}`` and the grid's box."""
    return browser.execute_script("""
        var t = document.getElementById('overview');
        var heads = Array.from(t.querySelectorAll('thead th.t')).map(function (th) { return th.dataset.code; });
        var first = t.querySelectorAll('thead th').length - heads.length;
        var cells = [];
        t.querySelectorAll('tbody tr').forEach(function (tr) {
          tr.querySelectorAll('td.cell').forEach(function (td) {
            var colour = (td.className.match(/c-(\\w+)/) || [])[1];
            cells.push([tr.dataset.site, heads[td.cellIndex - first], colour, td.dataset.age,
                        getComputedStyle(td).backgroundColor + '|' + getComputedStyle(td).backgroundImage,
                        td.textContent]);
          });
        });
        var last = t.querySelector('tbody tr:last-child td.cell:last-child').getBoundingClientRect();
        return {cells: cells, right: last.right, bottom: last.bottom,
                scroll_x: document.documentElement.scrollWidth > window.innerWidth};""")


def test_every_cell_agrees_with_freshness_json_and_the_grid_fits_one_screen(web, browser, dsn):
    browser.viewport(*SCREEN)
    try:
        before = cli(dsn, "freshness")
        browser.get(f"{web.url}/lang/en?next=/")
        drawn = grid(browser)
        after = cli(dsn, "freshness")
        assert drawn["right"] <= SCREEN[0] and drawn["bottom"] <= SCREEN[1] and not drawn["scroll_x"], drawn
        screenshot(browser, "overview", SCREEN)
        browser.get(f"{web.url}/lang/zh-CN?next=/")
        assert grid(browser)["bottom"] <= SCREEN[1]  # Chinese headers fit too
        screenshot(browser, "overview-zh", SCREEN)
    finally:
        browser.viewport()
    limit = before["stale_after_hours"] * 3600
    rows = {(str(r["site_id"]), r["task"]): r for r in before["rows"]}
    later = {(str(r["site_id"]), r["task"]): r for r in after["rows"]}
    cells = {(site, task): (colour, age, bg, text) for site, task, colour, age, bg, text in drawn["cells"]}
    # every (store, task) pair is judged (the pair never loaded is a row too): the grid has all 1,050
    assert set(cells) == set(rows) and len(cells) == STORES * len(CONNECTOR.tasks)
    backgrounds: dict[str, set] = {}
    for key, row in rows.items():
        colour, age, bg, text = cells[key]
        backgrounds.setdefault(colour, set()).add(bg)
        if row["age_seconds"] is None:
            assert colour == "never" and age == "" and row["stale"], key
            continue
        low, high = row["age_seconds"], later[key]["age_seconds"]  # the page was read between the two
        assert low - 1 <= float(age) <= high + 1, (key, age, low, high)
        assert (colour in ("stale", "never")) == row["stale"], (key, colour, row)
        expected = "stale" if float(age) > limit else "aging" if float(age) > limit / 2 else "fresh"
        assert colour == expected, (key, colour, age)
        assert text.strip(), key
    assert {"fresh", "aging", "stale", "never"} <= set(backgrounds)  # a chain with every state
    assert all(len(b) == 1 for b in backgrounds.values())  # one colour per state …
    assert len({next(iter(b)) for b in backgrounds.values()}) == len(backgrounds)  # … and distinct colours


def test_a_cell_opens_its_history_with_the_age_chart(web, browser):
    browser.get(f"{web.url}/lang/zh-CN?next=/")
    cell = browser.find_element("css selector", "#overview tbody tr:first-child a[href$='task=ODS_PAYMENT']")
    cell.click()
    _wait(lambda: "/history?" in browser.current_url, what="the cell's history")
    chart = browser.find_element("id", "age-trend")
    assert chart.size["width"] >= 600 and browser.find_elements("css selector", "#age-trend polyline.age")
    assert int(chart.get_attribute("data-points")) >= 29  # a day's window loaded each night of 30
    runs = browser.find_elements("css selector", "#cell-runs tbody tr")
    assert len(runs) >= 29  # one run a night
    assert "支付流水" in browser.find_element("css selector", "h1").text
    screenshot(browser, "history-zh")


def test_chinese_is_drawn_with_a_font_not_boxes(web, browser):
    """A missing CJK font draws every Chinese character as the same box: compare the pixels of two different
    characters with those of two unassigned code points (always boxes) in the page's own font."""
    browser.get(f"{web.url}/lang/zh-CN?next=/runs")
    assert browser.find_element("css selector", "html").get_attribute("lang") == "zh-CN"
    same = browser.execute_script("""
        var font = getComputedStyle(document.body).fontFamily;
        function pixels(text) {
          var c = document.createElement('canvas'); c.width = 64; c.height = 32;
          var g = c.getContext('2d'); g.font = '24px ' + font; g.fillText(text, 2, 26);
          return Array.from(g.getImageData(0, 0, 64, 32).data).join(',');
        }
        var box = pixels('\\u0378');
        return {fu: pixels('福') === box, dian: pixels('店') === box, differ: pixels('福') !== pixels('店')};""")
    assert same == {"fu": False, "dian": False, "differ": True}, same
    screenshot(browser, "runs-zh")
    browser.find_element("css selector", "#lang-switch a[data-lang='en']").click()
    _wait(lambda: browser.find_element("css selector", "html").get_attribute("lang") == "en", what="English")
    assert browser.find_element("css selector", "header nav a[href='/runs']").text == "Runs"
    browser.get(web.url + "/freshness")  # remembered
    assert browser.find_element("css selector", "html").get_attribute("lang") == "en"


def test_tonight_shows_each_lane_expected_end_next_to_its_deadline(web, browser, dsn):
    # ~70 requests at 0.9-1.0 s: about a minute of work, well inside the 150 s deadline (the ETA is the lane's own);
    # the run is stopped (SIGTERM) once the page was compared, so the test does not wait for its end
    sets = {"pipeline.rate_min": 0.9, "pipeline.rate_max": 1.0, "pipeline.batch_timeout": 0.2,
            "api.retry_backoff": 0.02, "api.timeout": 5}
    window = ["--window-start", (ANCHOR - timedelta(days=2)).strftime("%Y-%m-%d %H:%M:%S"),
              "--window-end", ANCHOR.strftime("%Y-%m-%d %H:%M:%S")]
    with Simulator(sim_config(seed=31, days=2)) as sim:
        proc = subprocess.Popen(
            [sys.executable, "-m", "feiqiu_etl", "run", "--api-base", sim.base_url, "--site-id",
             str(sim.config.site_ids[0]), "--dsn", dsn, "--no-dwd", "--json", "--unsafe-gaps", "--tasks",
             "ODS_MEMBER,ODS_SETTLEMENT", "--deadline", "150s", *window,
             *[f"--set={k}={v}" for k, v in sets.items()]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "FEIQIU_API_TOKEN": sim.config.token})
        try:
            def lane_with_eta():
                status = cli(dsn, "status")
                live = [r for r in status if (r.get("live") or {}).get("lanes")]
                lanes = [ln for r in live for ln in r["live"]["lanes"] if ln.get("state") == "running"
                         and ln.get("requests_sent", 0) >= 3 and ln.get("eta_s")]
                return (live[0], lanes[0]) if lanes else None

            reads = [_wait(lane_with_eta, 60, 0.2, what="a running lane with an ETA")]
            browser.get(f"{web.url}/lang/en?next=/")
            row = _wait(lambda: browser.find_elements("css selector", "#tonight-lanes tbody tr"), 10,
                        what="the Tonight table")[0]
            shown = {k: row.get_attribute(f"data-{k}") for k in ("lane", "eta-s", "deadline-in-s", "expected-end",
                                                                  "deadline-at", "heartbeat")}
            shown["cells"] = row.text
            reads.append(lane_with_eta())  # status --json just before and just after the page was drawn
            browser.execute_script("document.getElementById('tonight').scrollIntoView()")
            screenshot(browser, "tonight")
            browser.get(f"{web.url}/lang/zh-CN?next=/%23tonight")
            browser.execute_script("document.getElementById('tonight').scrollIntoView()")
            screenshot(browser, "tonight-zh")
            zh_row = browser.find_element("css selector", "#tonight-lanes tbody tr")
            assert "截止" in browser.find_element("id", "tonight").text and zh_row.get_attribute("data-lane")
        finally:
            proc.terminate()
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    assert all(r is not None for r in reads) and shown["deadline-at"] and shown["expected-end"]
    assert {lane["name"] for _, lane in reads} == {shown["lane"]}
    assert shown["cells"].count(":") >= 4  # expected end and deadline shown as times of day
    page_end = datetime.fromisoformat(shown["expected-end"])
    page_deadline = datetime.fromisoformat(shown["deadline-at"])
    compared = []
    for run, lane in reads:
        beat = datetime.fromisoformat(run["heartbeat_at"])
        status_end = beat + timedelta(seconds=lane["eta_s"])
        status_deadline = beat + timedelta(seconds=lane["deadline_in_s"])
        compared.append((abs((page_end - status_end).total_seconds()), lane["eta_s"], status_end,
                         abs((page_deadline - status_deadline).total_seconds())))
    apart, remaining, status_end, deadline_apart = min(compared)
    assert remaining >= 10, compared  # a real estimate, not the last second of the run
    assert apart <= 0.1 * remaining, (page_end, compared)  # issue 29: within 10 %
    assert max(c[3] for c in compared) <= 1.5  # the deadline is the same instant (1 s heartbeat resolution)
    print(f"\nexpected end: page {page_end.isoformat()} vs status --json {status_end.isoformat()} "
          f"({apart:.1f} s apart = {100 * apart / remaining:.1f} % of the {remaining:.0f} s ETA; the other read "
          f"{max(c[0] for c in compared):.1f} s); deadline {page_deadline.isoformat()}")


def test_the_live_page_script_speaks_chinese(web, browser):
    """The Live page's JavaScript takes its words from the page's JSON catalog."""
    browser.get(f"{web.url}/lang/zh-CN?next=/live")
    state = browser.find_element("id", "feed-state")
    _wait(lambda: state.get_attribute("data-state") == "live", what="the live feed")
    assert state.text.startswith("实时 · ")  # "live · HH:MM:SS", drawn by live.js
    assert browser.execute_script("return window._('Cancel…')") == "取消…"
    assert browser.execute_script("return window._('in %(t)s (%(why)s)', {t: '3 s', why: 'x'})") == "3 s 后（x）"
    browser.get(f"{web.url}/lang/en?next=/live")
    assert browser.execute_script("return window._('Cancel…')") == "Cancel…"
