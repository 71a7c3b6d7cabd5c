"""The web page in Chinese and English (issue 29, part 1) and the chain overview's model (part 2), in process
(Starlette's TestClient) on real PostgreSQL with a real run against the simulator.

* The catalog: every message of the templates, the JavaScript and the Python of the page (extracted by Babel
  now, from the sources) has a Chinese translation, and the JavaScript's are in its JSON catalog.
* Every page rendered in zh-CN has no English word left outside codes, ids and units (``translate="no"``
  marks data: run ids, codes, upstream and engine messages); in English, no Chinese outside the data's names.
* Which language a request gets: the switch's cookie, ``web.language``, ``Accept-Language``.
* The overview's cells are the freshness rule's rows (``freshness --json``), coloured by age.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from starlette.testclient import TestClient

from feiqiu_etl.connector import load_connector
from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.schema import ensure_schemas
from feiqiu_etl.simulator import Simulator
from feiqiu_etl.web import WebSettings, create_app, i18n
from flowkit import run_flow, sim_config
from webkit import seed_run

pytestmark = pytest.mark.integration

CONNECTOR = load_connector()
CODES = tuple(t.code for t in CONNECTOR.tasks)
NAMES = {t.code: dict(t.names) for t in CONNECTOR.tasks}
WEB = Path(__file__).resolve().parents[2] / "src" / "feiqiu_etl" / "web"
STORE_NAMES = {}  # filled from the simulator: Chinese store names, as a fleet file gives them
# Words a Chinese page may keep: units, protocol and product codes (not sentences).
ALLOWED_IN_ZH = {"ODS", "DWD", "SQL", "JSON", "API", "HTTP", "ID", "min", "s", "h", "d", "pid", "JavaScript",
                 "feiqiu-etl"}  # the product's name
CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")


class _Text(HTMLParser):
    """The visible text of a page without what is marked ``translate="no"`` (data) and without scripts, styles
    and SVG; plus ``title`` attributes (tooltips are read too)."""

    VOID = {"br", "img", "input", "meta", "link", "hr", "col", "source", "wbr", "area", "base"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[bool] = []
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        hidden = (self.stack and self.stack[-1]) or a.get("translate") == "no" or \
            tag in ("script", "style", "svg", "title")  # <title> repeats the h1 (which marks its run id)
        if not hidden and a.get("title"):
            self.parts.append(a["title"])
        if not hidden and tag == "input" and a.get("placeholder"):
            self.parts.append(a["placeholder"])
        if tag not in self.VOID:
            self.stack.append(bool(hidden))

    def handle_endtag(self, tag):
        if tag not in self.VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data):
        if not (self.stack and self.stack[-1]):
            self.parts.append(data)


def visible(html: str) -> str:
    p = _Text()
    p.feed(html)
    return " ".join(" ".join(p.parts).split())


def english_words(text: str, data: set[str]) -> list[str]:
    """Latin words of 2+ letters that are not units, codes (UPPER_CASE with _ or digits) or data."""
    out = []
    for w in re.findall(r"[A-Za-z][A-Za-z_\-]*[A-Za-z0-9]|[A-Za-z]", text):
        if w in ALLOWED_IN_ZH or w in data or re.fullmatch(r"[A-Z0-9_]+", w) and ("_" in w or len(w) <= 3):
            continue
        if len(w) == 1:
            continue
        out.append(w)
    return out


@pytest.fixture(scope="module")
def dsn(pg_server_dsn):
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from feiqiu_etl.db.embedded import create_database

    name = f"t_i18n_{uuid.uuid4().hex[:10]}"
    create_database(pg_server_dsn, name)
    yield make_conninfo(**{**conninfo_to_dict(pg_server_dsn), "dbname": name})
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def history(dsn):
    """A real run (two stores, four tasks, in process, fast gaps) plus a seeded FAILED and a DEADLINE run."""
    with Simulator(sim_config(seed=29, days=2)) as sim:
        result = run_flow(sim, dsn, tasks=["ODS_PAYMENT", "ODS_MEMBER_CARD", "ODS_GOODS", "ODS_SETTLEMENT"])
        sites = list(sim.config.site_ids)
    assert result.status == "SUCCESS"
    STORE_NAMES.update({sites[0]: "旗舰店", **({sites[1]: "南山店"} if len(sites) > 1 else {})})
    now = datetime.now(timezone.utc)
    with connect(dsn) as conn:
        ensure_schemas(conn)
        seed_run(conn, "seed-failed", status="FAILED", started_at=now - timedelta(hours=3), stores=(sites[0],),
                 error="upstream said: 40101 token invalid", errors=1)
    return {"run_id": result.run_id, "sites": sites}


def client(dsn: str, **kw) -> TestClient:
    settings = WebSettings(dsn=dsn, connector="feiqiu", task_codes=CODES, task_names=NAMES,
                           store_names=dict(STORE_NAMES), **kw)
    return TestClient(create_app(settings), base_url="http://127.0.0.1:8080")


def pages(history) -> list[str]:
    site = history["sites"][0]
    return ["/", "/runs", f"/runs/{history['run_id']}", "/runs/seed-failed", "/live", "/freshness",
            f"/history?site={site}&task=ODS_PAYMENT", f"/history?site={site}&task=ODS_GOODS", "/runs/nope",
            "/runs?status=FAILED", "/freshness?hours=oops"]


# ------------------------------------------------------------------------------------------------ catalog
def test_every_message_of_the_page_has_a_chinese_translation():
    from babel.messages.extract import extract_from_dir

    method_map = [("**/templates/**.html", "jinja2"), ("**/static/**.js", "javascript"), ("**.py", "python")]
    options = {"**/templates/**.html": {"extensions": "jinja2.ext.i18n"}}
    keywords = {"_": None, "gettext": None, "ngettext": (1, 2), "N_": None}
    found = {}
    for filename, lineno, message, _comments, _ctx in extract_from_dir(
            str(WEB), method_map, options_map=options, keywords=keywords):
        key = message if isinstance(message, str) else message[0]
        if key:
            found.setdefault(key, f"{filename}:{lineno}")
    assert len(found) > 200  # the extraction really read the templates, the scripts and the Python
    catalog = {m.id if isinstance(m.id, str) else m.id[0]: m for m in i18n._catalog("zh-CN") if m.id}
    missing = sorted(f"{where}: {msg!r}" for msg, where in found.items() if msg not in catalog)
    empty = sorted(f"{found[k]}: {k!r}" for k, m in catalog.items()
                   if k in found and (not m.string or (isinstance(m.string, tuple) and not all(m.string))))
    assert missing == [], "messages without a translation in locale/zh_CN (pybabel update):\n" + "\n".join(missing)
    assert empty == [] and i18n.untranslated("zh-CN") == []
    js = i18n.js_catalog("zh-CN")
    in_js = {k for k, where in found.items() if where.split(":")[0].endswith(".js")}
    assert in_js and in_js <= set(js) and js["Cancel…"] == "取消…"
    assert i18n.js_catalog("en") == {}


def test_language_comes_from_the_cookie_then_the_setting_then_accept_language():
    assert i18n.choose(None, "auto", "zh-CN,zh;q=0.9,en;q=0.8") == "zh-CN"
    assert i18n.choose(None, "auto", "en-US,en;q=0.9,zh;q=0.5") == "en"
    assert i18n.choose(None, "auto", "fr-FR, zh-TW;q=0.7") == "zh-CN"  # any Chinese gets the Chinese page
    assert i18n.choose(None, "auto", "fr-FR,de;q=0.5") == "en" and i18n.choose(None, "auto", None) == "en"
    assert i18n.choose(None, "auto", "zh;q=0, en;q=0.1") == "en"
    assert i18n.choose(None, "zh", "en-US") == "zh-CN" and i18n.choose(None, "en", "zh-CN") == "en"
    assert i18n.choose("en", "zh-CN", "zh-CN") == "en" and i18n.choose("zh-CN", "en", "en") == "zh-CN"
    assert i18n.choose("klingon", "zh-CN", "en") == "zh-CN"  # a bad cookie is ignored


# ------------------------------------------------------------------------------------------------- pages
def test_chinese_pages_leave_no_english_word_outside_codes_ids_and_units(dsn, history):
    data = {w for name in STORE_NAMES.values() for w in name.split()} | {"nope", "oops"}  # ids typed in the URL
    with client(dsn) as c:
        report = {}
        for path in pages(history):
            r = c.get(path, headers={"Accept-Language": "zh-CN,zh;q=0.9"})
            assert r.status_code in (200, 400, 404), (path, r.status_code)
            assert r.headers["content-language"] == "zh-CN" and '<html lang="zh-CN">' in r.text
            words = english_words(visible(r.text), data)
            if words:
                report[path] = sorted(set(words))
            assert CJK.search(visible(r.text)), path
        assert report == {}, f"English left on the Chinese pages: {report}"
        home = c.get("/", headers={"Accept-Language": "zh-CN"}).text
        assert "总览" in home and "会员卡/储值卡" in home and "支付流水" in home and "旗舰店" in home
        assert "成功" in c.get("/runs", headers={"Accept-Language": "zh-CN"}).text
        login = TestClient(create_app(WebSettings(dsn=dsn, token="a-long-enough-test-token-0123",
                                                  host="0.0.0.0", task_codes=CODES)),
                           base_url="http://127.0.0.1:8080")
        with login as anonymous:
            page = anonymous.get("/runs", headers={"Accept": "text/html", "Accept-Language": "zh-CN"})
            assert page.status_code == 401 and "登录" in page.text
            assert english_words(visible(page.text), data) == []


def test_english_pages_have_no_chinese_outside_the_data(dsn, history):
    names = set(STORE_NAMES.values())
    with client(dsn) as c:
        for path in pages(history):
            r = c.get(path, headers={"Accept-Language": "en-US,en;q=0.9"})
            assert r.headers["content-language"] == "en"
            text = visible(r.text)
            for name in names:
                text = text.replace(name, "")
            assert not CJK.search(text), (path, CJK.findall(text)[:10])
        home = c.get("/").text
        assert "Overview" in home and "Member cards" in home and "Payments" in home


def test_the_switch_remembers_the_language_in_a_cookie(dsn, history):
    with client(dsn) as c:
        assert c.get("/freshness", headers={"Accept-Language": "en"}).headers["content-language"] == "en"
        r = c.get("/lang/zh-CN?next=/freshness", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/freshness"
        assert "lang=zh-CN" in r.headers["set-cookie"] and "Max-Age=31536000" in r.headers["set-cookie"]
        page = c.get("/freshness", headers={"Accept-Language": "en-US"})  # the cookie wins over the browser
        assert page.headers["content-language"] == "zh-CN" and "数据新鲜度" in page.text
        assert c.get("/lang/en?next=//evil.example", follow_redirects=False).headers["location"] == "/"
        assert c.get("/lang/xx").status_code == 404
        c.get("/lang/en")
        assert c.get("/freshness").headers["content-language"] == "en"
    with client(dsn, language="zh-CN") as c:  # web.language: zh-CN whatever the browser says
        assert c.get("/", headers={"Accept-Language": "en"}).headers["content-language"] == "zh-CN"


# ---------------------------------------------------------------------------------------------- overview
def test_overview_cells_are_the_freshness_rows_coloured_by_age(dsn, history):
    with client(dsn) as c:
        fresh = c.get("/api/freshness").json()
        over = c.get("/api/overview").json()
        html = c.get("/").text
        assert c.get("/?status=FAILED", follow_redirects=False).headers["location"] == "/runs?status=FAILED"
    rows = {(str(r["site_id"]), r["task"]): r for r in fresh["rows"]}
    cells = {(site, task): cell for site, by in over["cells"].items() for task, cell in by.items()}
    assert set(rows) == set(cells) and len(cells) == len(history["sites"]) * len(CODES)
    limit = fresh["stale_after_hours"] * 3600
    for key, row in rows.items():
        cell = cells[key]
        assert cell["stale"] == row["stale"] and cell["fresh_until"] == row["fresh_until"]
        assert (cell["age_seconds"] is None) == (row["age_seconds"] is None)
        assert row["age_seconds"] is None or abs(cell["age_seconds"] - row["age_seconds"]) < 60  # read apart
        expected = ("never" if row["age_seconds"] is None else "stale" if row["age_seconds"] > limit
                    else "aging" if row["age_seconds"] > limit / 2 else "fresh")
        assert cell["colour"] == expected
        assert f'href="/history?site={key[0]}&amp;task={key[1]}"' in html
    colours = {c["colour"] for c in cells.values()}
    for colour in ("fresh", "aging", "stale", "never"):  # the grid draws every cell in its colour
        assert html.count(f'<td class="cell c-{colour}"') == sum(1 for c in cells.values() if c["colour"] == colour)
    assert {"fresh", "stale", "never"} <= colours  # snapshots just taken, 2024 windows, tasks never run
    store = next(s for s in over["stores"] if s["site_id"] == history["sites"][0])
    assert store["name"] == "旗舰店" and store["last_success"] and store["rows_last_night"] > 0
    assert sum(store["nights"].values()) == store["rows_last_night"]
    assert over["last_night"]["run_id"] == history["run_id"] and over["tonight"] == []
    bars = re.findall(r'<svg class="spark"[^>]*data-nights="(\d+)"', html)
    assert len(bars) == len(history["sites"]) and all(int(n) >= 1 for n in bars)  # last night, per store


def test_cell_history_lists_the_runs_and_the_age_at_each_load(dsn, history):
    site = history["sites"][0]
    with client(dsn) as c:
        page = c.get(f"/history?site={site}&task=ODS_PAYMENT").text
        assert history["run_id"] in page and 'id="age-trend"' in page
        points = int(re.search(r'data-points="(\d+)"', page).group(1))
        assert points >= 1  # the run loaded at least one payment window
        assert c.get("/history?site=1&task=NOPE").status_code == 400
