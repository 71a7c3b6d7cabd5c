"""The simulator's data faults (issue 25 part 7): an upstream that answers ``code 0`` with wrong data — a page one
record short, a list that answers empty, a total that moves, a day that answers zero — set at start
(``SimulatorConfig.faults``) or while running (``Simulator.inject``, ``POST /__sim/faults``)."""

from __future__ import annotations

import httpx
import pytest

from feiqiu_etl.simulator import RiskControlConfig, Simulator, SimulatorConfig

SITE = 8640015201004417
AUTH = {"Authorization": "Bearer fq_test_token"}


@pytest.fixture()
def sim():
    cfg = SimulatorConfig(risk=RiskControlConfig(enabled=False), days=3,
                          faults=({"kind": "short_page", "path": "/api/member/list"},))
    with Simulator(cfg) as simulator:
        yield simulator


def page(sim, path: str, **body) -> dict:
    answer = httpx.post(sim.base_url + path, json={"siteId": SITE, "page": 1, "limit": 200, **body},
                        headers=AUTH, timeout=10).json()
    assert answer["code"] == 0, answer
    data = answer["data"]
    return data.get("page", data)


def rows(data: dict) -> list:
    return next(v for v in data.values() if isinstance(v, list))


def test_short_page_set_at_start_misses_one_record_once_total_unchanged(sim):
    faulty, clean = page(sim, "/api/member/list"), page(sim, "/api/member/list")
    assert faulty["total"] == clean["total"] == 40
    assert len(rows(faulty)) == 39 and len(rows(clean)) == 40
    assert rows(faulty) == rows(clean)[:39]
    assert [e.fault for e in sim.request_log()] == ["short_page", None]


def test_total_zero_over_http_answers_code_0_total_0_no_rows_and_spares_details(sim):
    admin = httpx.post(sim.base_url + "/__sim/faults", json={"kind": "total_zero", "path": "/api/goods/list",
                                                              "count": 2}, headers=AUTH, timeout=10).json()
    assert admin["code"] == 0 and admin["data"][-1] == {"kind": "total_zero", "path": "/api/goods/list",
                                                         "count": 2, "day": None, "page": None}
    assert httpx.get(sim.base_url + "/__sim/faults", timeout=10).json()["data"][-1]["count"] == 2
    for _ in range(2):
        data = page(sim, "/api/goods/list")
        assert data["total"] == 0 and rows(data) == []
    assert page(sim, "/api/goods/list")["total"] == 30
    sim.inject(kind="empty_page", count=1)  # any path: a detail request never takes a data fault
    detail = httpx.post(sim.base_url + "/api/member/detail",
                        json={"siteId": SITE, "memberId": rows(page(sim, "/api/member/list"))[0]["memberId"]},
                        headers=AUTH, timeout=10).json()
    assert detail["code"] == 0 and detail["data"] is not None
    # the member list took the short page set at start; the detail took nothing: empty_page still waits
    assert [f.kind for f in sim.faults.pending()] == ["empty_page"]


def test_total_moves_and_zero_day_only_for_its_day(sim):
    sim.clear_faults()
    sim.inject("/api/goods/list", "total_moves")
    moved = page(sim, "/api/goods/list")
    assert moved["total"] == 31 and len(rows(moved)) == 30
    now = sim.dataset.now()
    day = now[:10]
    sim.inject(kind="zero_day", day=day, count=5)
    other = page(sim, "/api/settlement/list", startTime="2000-01-01 00:00:00", endTime="2000-01-02 00:00:00")
    assert other["total"] == 0  # no data then: the fault did not strike (still 5 pending)
    assert sim.faults.pending()[0].remaining == 5
    assert page(sim, "/api/member/list")["total"] == 40  # a snapshot never takes zero_day
    hit = page(sim, "/api/settlement/list", startTime=f"{day} 00:00:00", endTime=now)
    assert hit["total"] == 0 and rows(hit) == []
    assert sim.faults.pending()[0].remaining == 4


def test_a_data_fault_for_one_page_only(sim):
    sim.clear_faults()
    sim.inject("/api/goods/list", "empty_page", page=2)
    assert len(rows(page(sim, "/api/goods/list"))) == 30  # page 1: untouched, the fault still waits
    second = page(sim, "/api/goods/list", page=2, limit=20)
    assert second["total"] == 0 and rows(second) == [] and sim.faults.pending() == []


@pytest.mark.parametrize("body, wrong", [({"kind": "bogus"}, "unknown fault kind"),
                                         ({"kind": "short_page", "count": 0}, "count"),
                                         ({"kind": "short_page", "day": "2024-01-01"}, "zero_day"),
                                         ({"kind": "short_page", "colour": 1}, "unknown fault key"),
                                         ({"kind": "http500", "page": 2}, "data faults only")])
def test_bad_fault_bodies_answer_40001(sim, body, wrong):
    answer = httpx.post(sim.base_url + "/__sim/faults", json=body, headers=AUTH, timeout=10).json()
    assert answer["code"] == 40001 and wrong in answer["msg"]


def test_bad_fault_at_start_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="unknown fault kind"):
        SimulatorConfig(faults=({"kind": "nope"},))


def test_simulate_refuses_a_bad_fault_in_one_line_before_it_listens():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "feiqiu_etl", "simulate", "--port", "0", "--fault", "bogus"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "unknown fault kind 'bogus'" in proc.stderr


@pytest.mark.parametrize("body, wrong", [({"kind": "zero_day", "day": "2024-02-30"}, "day: expected a date"),
                                         ({"kind": "zero_day", "day": "2024/03/01"}, "day: expected a date"),
                                         ({"kind": "short_page", "path": "/api/setlement/list"}, "unknown path"),
                                         ({"kind": "http500", "path": "api/member/list"}, "unknown path")])
def test_a_fault_on_no_real_day_or_on_a_path_nobody_asks_for_is_refused(sim, body, wrong):
    """Adversarial trial: ``zero_day`` took any 10 characters as its day, and a fault on a misspelt path was
    queued and never struck (a test or benchmark that meant it measured a clean upstream)."""
    before = sim.faults.pending()
    answer = httpx.post(sim.base_url + "/__sim/faults", json=body, headers=AUTH, timeout=10).json()
    assert answer["code"] == 40001 and wrong in answer["msg"], answer
    assert sim.faults.pending() == before  # nothing queued
