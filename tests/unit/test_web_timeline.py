"""The server-drawn lane timeline (pure): well-formed SVG, one bar per attempt (neighbours on the same pixel
merged), colours by class and outcome, waits by reason, retry rings, the rows line, escaping."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

from feiqiu_etl.web.timeline import CLASS_COLORS, OUTCOME_COLORS, WAIT_COLORS, attempt_counts, nice_step, timeline_svg
from webkit import attempt

NS = {"s": "http://www.w3.org/2000/svg"}
T0 = datetime(2024, 3, 4, tzinfo=timezone.utc)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # raises on anything not well-formed


def test_every_attempt_is_drawn_with_its_class_or_outcome_colour():
    reqs = [attempt(1, _at(0.0), gap=None, wait_reason=None),
            attempt(2, _at(10.0), gap_class="groupbuy", gap=9.9),
            attempt(3, _at(20.0), outcome="throttled", gap=9.9),
            attempt(4, _at(40.0), wait_reason="retry-after", gap=19.9),   # the same request again: a retry
            attempt(5, _at(60.0), outcome="banned", request="/api/x page 2", gap=19.9),
            attempt(6, _at(90.0), wait_reason="banned", request="/api/x page 2", gap=29.9),
            attempt(1, _at(5.0), lane="second", gap=None, wait_reason=None)]
    root = _parse(timeline_svg(reqs, started_at=T0, seconds=100.0, rows_series=[[0, 0], [50, 120], [100, 300]],
                               lanes=["default", "second"]))
    bars = root.findall(".//s:rect[@class='req']", NS)
    assert len(bars) == 7
    fills = [(b.get("data-outcome"), b.get("data-class"), b.get("fill")) for b in bars]
    assert ("ok", "standard", CLASS_COLORS["standard"]) in fills
    assert ("ok", "groupbuy", CLASS_COLORS["groupbuy"]) in fills
    assert ("throttled", "standard", OUTCOME_COLORS["throttled"]) in fills
    assert ("banned", "standard", OUTCOME_COLORS["banned"]) in fills
    waits = {w.get("data-reason"): w.get("fill") for w in root.findall(".//s:rect[@class='wait']", NS)}
    assert waits["retry-after"] == WAIT_COLORS["retry-after"] and waits["banned"] == WAIT_COLORS["banned"]
    assert len(root.findall(".//s:path[@class='fail']", NS)) == 2  # throttled, banned
    assert len(root.findall(".//s:circle[@class='retry']", NS)) == 2  # after the throttle, after the ban
    line = root.find(".//s:polyline[@id='rows-line']", NS)
    assert len(line.get("points").split()) == 3
    xs = [float(b.get("x")) for b in bars]
    assert xs[:6] == sorted(xs[:6]) and xs[0] < xs[6] < xs[1]  # time runs left to right, per lane
    assert float(bars[6].get("y")) > float(bars[0].get("y"))  # the second lane is drawn below the first
    assert root.get("data-attempts") == "7"
    counts = attempt_counts(reqs)
    assert counts["outcome"] == {"ok": 5, "throttled": 1, "banned": 1} and counts["retries"]["all"] == 2


def test_neighbours_on_the_same_pixel_become_one_bar():
    reqs = [attempt(i, _at(i * 0.001), gap=0.0005) for i in range(2000)]
    svg = timeline_svg(reqs, started_at=T0, seconds=3600.0)
    bars = _parse(svg).findall(".//s:rect[@class='req']", NS)
    assert 1 <= len(bars) < 5 and sum(int(b.get("data-n")) for b in bars) == 2000
    assert len(svg) < 20000


def test_upstream_text_is_escaped():
    evil = '<script>alert(1)</script>" onload="x'
    svg = timeline_svg([attempt(1, _at(1), request=evil, outcome="error", detail=evil, task=evil)],
                       started_at=T0, seconds=5.0, lanes=[evil])
    assert "<script>" not in svg and 'onload="x' not in svg
    root = _parse(svg)
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(evil in (t or "") for t in titles)


def test_a_running_run_without_series_and_ticks():
    svg = timeline_svg([], started_at=T0, seconds=None)
    root = _parse(svg)
    assert root.findall(".//s:rect[@class='req']", NS) == [] and root.find(".//s:polyline", NS) is None
    assert nice_step(3.0) == 0.5 and nice_step(100.0) == 10 and nice_step(7200.0) == 900
