"""The lane timeline of one run as an SVG drawn on the server (no JavaScript, no plotting library, works
offline): a picture of what the lane did, for people who would rather look than read.

Per lane, left to right in seconds since the run started:

* a thin **wait** strip: the time the lane waited before each attempt (``gap`` seconds before it), coloured by
  why (random gap, learnt floor, ``Retry-After``, ban, timeout hold);
* the **requests**: one bar per attempt from its start for its duration, coloured by endpoint class when it
  succeeded and by outcome when it did not (throttled, banned, hold, timeout, unreachable, aborted, error),
  with a triangle above every failed attempt and a ring above every retry (the same request again after a
  failed attempt);
* below the lanes, **rows written** over time (the run summary's ``timeline.rows`` series).

Every bar carries ``data-outcome``/``data-class`` and a ``<title>`` tooltip. Neighbouring successful attempts
of one class that fall on the same pixel are drawn as one bar ("N requests"), so that the picture stays a few
hundred kilobytes even for a lane of tens of thousands of requests. All text is XML-escaped (request labels
and error details come from the upstream).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from html import escape
from typing import Any, Iterable

WIDTH = 1200
LEFT = 128
RIGHT = 18
LANE_H = 70
ROWS_H = 120
AXIS_H = 30

CLASS_COLORS = {"standard": "#2563eb", "groupbuy": "#0d9488"}
_EXTRA_CLASS_COLORS = ["#7c3aed", "#db2777", "#65a30d", "#0891b2"]
OUTCOME_COLORS = {"throttled": "#f59e0b", "hold": "#ea580c", "banned": "#b91c1c", "timeout": "#7e22ce",
                  "unreachable": "#475569", "aborted": "#9ca3af", "error": "#e11d48"}
WAIT_COLORS = {"gap": "#cbd5e1", "floor": "#93c5fd", "retry-after": "#fbbf24", "banned": "#ef4444",
               "timeout-hold": "#c084fc", "lane": "#a5b4fc"}
WAIT_LABELS = {"gap": "random gap", "floor": "learnt floor", "retry-after": "Retry-After", "banned": "ban",
               "timeout-hold": "timeout hold", "lane": "other store's turn"}
NO_REASON = "#e2e8f0"


@dataclass
class _Bar:
    x0: float
    x1: float
    color: str
    kind: str
    outcome: str
    klass: str
    n: int = 1
    t0: float = 0.0
    t1: float = 0.0
    title: str = ""
    extra: dict = field(default_factory=dict)


def _attr(value: Any) -> str:
    return escape(str(value), quote=True)


def nice_step(span: float, max_ticks: int = 10) -> float:
    """The smallest of 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30 s, 1, 2, 5, 10, 15, 30 min, 1, 2, 3, 6, 12 h … whose
    ticks over ``span`` seconds number at most ``max_ticks``."""
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                 43200, 86400):
        if span / step <= max_ticks:
            return step
    return 86400.0 * max(1, round(span / 86400 / max_ticks))


def tick_label(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds < 60:
        return f"{seconds:g} s"
    if seconds < 3600:
        m, s = divmod(int(round(seconds)), 60)
        return f"{m} min" if s == 0 else f"{m}m{s:02d}s"
    h, rest = divmod(int(round(seconds)), 3600)
    return f"{h} h" if rest == 0 else f"{h}h{rest // 60:02d}"


def class_color(klass: str | None, palette: dict[str, str]) -> str:
    key = klass or "standard"
    if key not in palette:
        palette[key] = CLASS_COLORS.get(key) or _EXTRA_CLASS_COLORS[len([k for k in palette if k not in
                                                                          CLASS_COLORS]) % len(_EXTRA_CLASS_COLORS)]
    return palette[key]


def attempt_counts(requests: Iterable[dict]) -> dict[str, dict[str, int]]:
    """``{"outcome": {ok: n, …}, "class": {standard: n, …}, "wait": {gap: n, …}, "retries": {"all": n}}``."""
    out: dict[str, dict[str, int]] = {"outcome": {}, "class": {}, "wait": {}, "retries": {"all": 0}}
    last: dict[str, dict] = {}
    for r in requests:
        out["outcome"][r["outcome"]] = out["outcome"].get(r["outcome"], 0) + 1
        k = r.get("gap_class") or "standard"
        out["class"][k] = out["class"].get(k, 0) + 1
        if r.get("wait_reason"):
            out["wait"][r["wait_reason"]] = out["wait"].get(r["wait_reason"], 0) + 1
        if _is_retry(r, last.get(r["lane"])):
            out["retries"]["all"] += 1
        last[r["lane"]] = r
    return out


def _is_retry(r: dict, previous: dict | None) -> bool:
    return bool(previous and previous["outcome"] != "ok" and previous.get("request") == r.get("request")
                and previous.get("site_id") == r.get("site_id"))


def _merge(bars: list[_Bar], bar: _Bar) -> None:
    """Append ``bar``, or widen the previous bar when both are mergeable and touch on screen."""
    prev = bars[-1] if bars else None
    if prev is not None and prev.kind == bar.kind and prev.color == bar.color and bar.outcome in ("ok", "wait") \
            and prev.outcome == bar.outcome and bar.x0 <= prev.x1 + 0.6:
        prev.x1 = max(prev.x1, bar.x1)
        prev.t1 = max(prev.t1, bar.t1)
        prev.n += 1
        return
    bars.append(bar)


@dataclass(frozen=True)
class _Frame:
    """The chart's geometry: ``end`` seconds across ``plot_w`` pixels from ``LEFT``, lanes from ``lanes_top``
    down to the time axis at ``axis_y``, ticks every ``step`` seconds."""
    end: float
    lanes_top: float
    axis_y: float
    step: float
    plot_w: float = WIDTH - LEFT - RIGHT

    def sx(self, t: float) -> float:
        """The x pixel of ``t`` seconds since the start (clamped to the plot)."""
        return LEFT + max(0.0, min(t, self.end)) / self.end * self.plot_w


_Mark = tuple[float, float, str, str]  # x, y, kind ("retry" or the outcome), title


def timeline_svg(requests: list[dict], *, started_at: datetime, seconds: float | None,
                 rows_series: list[list[float]] | None = None, lanes: Iterable[str] = ()) -> str:
    """The chart (see module docstring) for the attempts ``requests`` (rows of
    :func:`feiqiu_etl.registry.run_requests`) of a run that started at ``started_at`` and lasted
    ``seconds`` (None while running: up to the last attempt). Returns the SVG markup (``<svg id="timeline">``)."""
    lane_names = list(dict.fromkeys([*lanes, *(r["lane"] for r in requests)])) or ["default"]
    points = [(float(t), float(v)) for t, v in (rows_series or [])]
    rel = [((r["started_at"] - started_at).total_seconds(), r) for r in requests]
    end = max([seconds or 0.0, *(t + float(r["seconds"]) for t, r in rel), *(t for t, _ in points), 0.1])
    palette = palette_preview(requests)
    legend_h = 14 + 18 * _legend_rows(palette, requests)
    height = legend_h + LANE_H * len(lane_names) + AXIS_H + (ROWS_H + AXIS_H if points else 0) + 8
    frame = _Frame(end=end, lanes_top=legend_h, axis_y=legend_h + LANE_H * len(lane_names), step=nice_step(end))
    out = _header(height, len(requests), end)
    out.extend(_time_axis(frame))
    marks: list[_Mark] = []
    for i, lane in enumerate(lane_names):
        out.extend(_lane(frame, frame.lanes_top + i * LANE_H, lane, [(t0, r) for t0, r in rel if r["lane"] == lane],
                         palette, marks))
    out.extend(_mark(x, y, kind, title) for x, y, kind, title in marks)
    if points:
        out.extend(_rows_panel(points, frame.sx, frame.axis_y + AXIS_H, frame.step, end))
    out.extend(_legend(palette, requests))
    out.append("</svg>")
    return "\n".join(out)


def _header(height: float, attempts: int, end: float) -> list[str]:
    """The opening ``<svg>`` tag, its title and the white background."""
    return [
        f'<svg id="timeline" class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" role="img" aria-labelledby="timeline-title" data-attempts="{attempts}" '
        f'data-seconds="{end:.3f}" font-family="system-ui, sans-serif" font-size="12">',
        '<title id="timeline-title">Lane timeline: requests over time by endpoint class and outcome, waits, '
        'retries, bans; rows written over time</title>',
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>',
    ]


def _time_axis(frame: _Frame) -> list[str]:
    """The vertical grid and the time axis under the lanes."""
    out: list[str] = []
    t = 0.0
    while t <= frame.end + 1e-9:
        x = frame.sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{frame.lanes_top}" x2="{x:.1f}" y2="{frame.axis_y}" stroke="#eef2f7"/>')
        out.append(f'<text x="{x:.1f}" y="{frame.axis_y + 16}" text-anchor="middle" fill="#475569">'
                   f'{_attr(tick_label(t))}</text>')
        t = round(t + frame.step, 6)
    out.append(f'<line x1="{LEFT}" y1="{frame.axis_y}" x2="{WIDTH - RIGHT}" y2="{frame.axis_y}" stroke="#94a3b8"/>')
    return out


def _lane(frame: _Frame, top: float, lane: str, rel: list[tuple[float, dict]], palette: dict[str, str],
          marks: list[_Mark]) -> list[str]:
    """One lane's row (label, wait strip, request bars) for its attempts ``rel`` (seconds since the start,
    row); appends the lane's failure and retry marks to ``marks`` (drawn after every lane)."""
    mark_y, wait_y, req_y = top + 18, top + 21, top + 32
    out = [f'<text x="{LEFT - 10}" y="{req_y + 13}" text-anchor="end" font-weight="600" fill="#0f172a">'
           f'{_attr(lane)}</text>',
           f'<text x="{LEFT - 10}" y="{wait_y + 7}" text-anchor="end" fill="#64748b" font-size="10">waits</text>',
           f'<rect x="{LEFT}" y="{req_y}" width="{frame.plot_w}" height="22" fill="#f8fafc"/>']
    waits, bars = _lane_bars(frame, rel, palette, marks, mark_y)
    for w in waits:
        title = w.title if w.n == 1 else f"{w.n} waits ({WAIT_LABELS.get(w.klass, 'no wait needed')}), " \
                                         f"from {w.t0:.1f} s to {w.t1:.1f} s of the run"
        out.append(f'<rect class="wait" data-reason="{_attr(w.klass or "none")}" x="{w.x0:.2f}" y="{wait_y}" '
                   f'width="{w.x1 - w.x0:.2f}" height="8" fill="{w.color}"><title>{_attr(title)}</title></rect>')
    for b in bars:
        title = b.title if b.n == 1 else f"{b.n} requests ({b.klass}, ok), from {b.t0:.1f} s to {b.t1:.1f} s of the run"
        out.append(f'<rect class="req" data-outcome="{_attr(b.outcome)}" data-class="{_attr(b.klass)}" '
                   f'data-n="{b.n}" x="{b.x0:.2f}" y="{req_y}" width="{b.x1 - b.x0:.2f}" height="22" '
                   f'fill="{b.color}"><title>{_attr(title)}</title></rect>')
    return out


def _lane_bars(frame: _Frame, rel: list[tuple[float, dict]], palette: dict[str, str], marks: list[_Mark],
               mark_y: float) -> tuple[list[_Bar], list[_Bar]]:
    """The wait strips and request bars of one lane's attempts (neighbours merged), and its marks at ``mark_y``."""
    sx = frame.sx
    waits: list[_Bar] = []
    bars: list[_Bar] = []
    last: dict | None = None
    for t0, r in rel:
        secs = float(r["seconds"])
        gap = float(r["gap"]) if r.get("gap") is not None else 0.0
        if gap > 0:
            reason = r.get("wait_reason")
            _merge(waits, _Bar(sx(t0 - gap), max(sx(t0), sx(t0 - gap) + 0.8), WAIT_COLORS.get(reason or "", NO_REASON),
                               "wait", "wait", reason or "", t0=t0 - gap, t1=t0,
                               title=f"waited {gap:.2f} s before {r.get('request') or 'a request'}"
                                     f" ({WAIT_LABELS.get(reason or '', 'no wait needed')})"))
        outcome = r["outcome"]
        klass = r.get("gap_class") or "standard"
        color = class_color(klass, palette) if outcome == "ok" else OUTCOME_COLORS.get(outcome, "#e11d48")
        detail = f" — {r['detail']}" if r.get("detail") else ""
        title = (f"{t0:.2f} s · {r.get('task') or ''} · {r.get('request') or ''} · site {r.get('site_id')} · "
                 f"{outcome} in {secs:.3f} s{detail}")
        x0 = sx(t0)
        bar = _Bar(x0, max(sx(t0 + secs), x0 + 1.0), color, "req", outcome, klass, t0=t0, t1=t0 + secs, title=title)
        retry = _is_retry(r, last)
        if retry or outcome != "ok":
            bars.append(bar)
        else:
            _merge(bars, bar)
        if outcome != "ok":
            marks.append((x0, mark_y, outcome, title))
        if retry:
            marks.append((x0, mark_y - 11, "retry", f"retry of {r.get('request') or 'the request'} at {t0:.2f} s"))
        last = r
    return waits, bars


def _mark(x: float, y: float, kind: str, title: str) -> str:
    """A ring above a retry, or a triangle (coloured by outcome) above a failed attempt."""
    if kind == "retry":
        return (f'<circle class="retry" cx="{x:.2f}" cy="{y:.1f}" r="3.5" fill="none" stroke="#0f172a" '
                f'stroke-width="1.3"><title>{_attr(title)}</title></circle>')
    color = OUTCOME_COLORS.get(kind, "#e11d48")
    return (f'<path class="fail" data-outcome="{_attr(kind)}" d="M{x - 4:.2f},{y - 7:.1f} '
            f'L{x + 4:.2f},{y - 7:.1f} L{x:.2f},{y:.1f} Z" fill="{color}"><title>{_attr(title)}'
            '</title></path>')


def _rows_panel(points: list[tuple[float, float]], sx, top: float, step: float, end: float) -> list[str]:
    bottom = top + ROWS_H
    peak = max(v for _, v in points) or 1.0

    def sy(v: float) -> float:
        return bottom - v / peak * (ROWS_H - 14)

    out = [f'<text x="{LEFT - 10}" y="{top + 10}" text-anchor="end" font-weight="600" fill="#0f172a">rows</text>',
           f'<text x="{LEFT - 10}" y="{top + 24}" text-anchor="end" fill="#64748b" font-size="10">written</text>']
    for frac in (0.0, 0.5, 1.0):
        y = sy(peak * frac)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#eef2f7"/>')
        out.append(f'<text x="{LEFT + 4}" y="{y - 3:.1f}" fill="#64748b" font-size="10">{peak * frac:,.0f}</text>')
    t = 0.0
    while t <= end + 1e-9:
        x = sx(t)
        out.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle" fill="#475569">'
                   f'{_attr(tick_label(t))}</text>')
        t = round(t + step, 6)
    out.append(f'<line x1="{LEFT}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}" stroke="#94a3b8"/>')
    line = " ".join(f"{sx(t):.1f},{sy(v):.1f}" for t, v in points)
    area = f"{sx(points[0][0]):.1f},{bottom} {line} {sx(points[-1][0]):.1f},{bottom}"
    out.append(f'<polygon points="{area}" fill="#dbeafe"/>')
    out.append(f'<polyline id="rows-line" points="{line}" fill="none" stroke="#1d4ed8" stroke-width="2"/>')
    if len(points) <= 300:
        for t, v in points:
            out.append(f'<circle class="rows-point" cx="{sx(t):.1f}" cy="{sy(v):.1f}" r="2.5" fill="#1d4ed8">'
                       f'<title>{t:.1f} s: {v:,.0f} rows</title></circle>')
    out.append(f'<text x="{WIDTH - RIGHT}" y="{top + 10}" text-anchor="end" fill="#1d4ed8" font-weight="600">'
               f'{points[-1][1]:,.0f} rows</text>')
    return out


def palette_preview(requests: list[dict]) -> dict[str, str]:
    """The class colours the chart will use for ``requests`` (successful attempts only)."""
    palette: dict[str, str] = {}
    for r in requests:
        if r["outcome"] == "ok":
            class_color(r.get("gap_class") or "standard", palette)
    return palette


def _legend_items(palette: dict[str, str], requests: list[dict]) -> list[tuple[str, str]]:
    outcomes = [o for o in OUTCOME_COLORS if any(r["outcome"] == o for r in requests)]
    waits = [w for w in WAIT_COLORS if any(r.get("wait_reason") == w for r in requests)]
    items = [(f"{k} ok", c) for k, c in (palette or {"standard": CLASS_COLORS["standard"]}).items()]
    items += [(o, OUTCOME_COLORS[o]) for o in outcomes]
    items += [(f"wait: {WAIT_LABELS[w]}", WAIT_COLORS[w]) for w in waits]
    if attempt_counts(requests)["retries"]["all"]:
        items.append(("retry", ""))
    return items


def _legend_layout(items: list[tuple[str, str]]) -> list[tuple[float, float, str, str]]:
    placed, x, y = [], LEFT, 18
    for label, color in items:
        width = 26 + 6.4 * len(label)
        if x + width > WIDTH - RIGHT:
            x, y = LEFT, y + 18
        placed.append((x, y, label, color))
        x += width
    return placed


def _legend_rows(palette: dict[str, str], requests: list[dict]) -> int:
    placed = _legend_layout(_legend_items(palette, requests))
    return 1 + int((placed[-1][1] - 18) // 18) if placed else 1


def _legend(palette: dict[str, str], requests: list[dict]) -> list[str]:
    out = ['<g class="legend">']
    for x, y, label, color in _legend_layout(_legend_items(palette, requests)):
        if label == "retry":
            out.append(f'<circle cx="{x + 6}" cy="{y - 4}" r="3.5" fill="none" stroke="#0f172a" stroke-width="1.3"/>')
        else:
            out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" rx="2" fill="{color}"/>')
        out.append(f'<text x="{x + 17}" y="{y}" fill="#334155">{_attr(label)}</text>')
    out.append("</g>")
    return out
