"""Small server-drawn SVG charts of the overview and a cell's history (issue 29, part 4): no script, no library,
nothing from a CDN — the page works offline. Pure functions returning SVG text; every text in it is escaped.

* :func:`night_bars`: rows written per night of one store, the last ``nights`` nights, as a bar sparkline;
* :func:`age_trend`: the age of a store's task data at each load (hours), against the stale threshold.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Iterable, Mapping, Sequence

from markupsafe import escape


def night_bars(per_night: Mapping[date, int], last: date, *, nights: int = 30, width: int = 92, height: int = 14,
               label: str = "") -> str:
    """Bars of ``per_night`` rows for the ``nights`` nights ending with ``last`` (oldest left); a night without
    a run is a grey tick. ``label`` formats each bar's tooltip (``{night}``, ``{rows}``)."""
    days = [last - timedelta(days=nights - 1 - i) for i in range(nights)]
    top = max([per_night.get(d, 0) for d in days] + [1])
    step = width / nights
    parts = [f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" data-nights="{sum(1 for d in days if d in per_night)}">']
    for i, d in enumerate(days):
        x = round(i * step, 2)
        if d not in per_night:
            parts.append(f'<rect class="none" x="{x}" y="{height - 1}" width="{max(1.0, step - 1):.2f}" height="1"/>')
            continue
        rows = int(per_night[d])
        h = max(1.0, (height - 1) * rows / top)
        tip = escape(label.format(night=d.isoformat(), rows=f"{rows:,}")) if label else f"{d}: {rows:,}"
        parts.append(f'<rect class="bar" x="{x}" y="{height - h:.2f}" width="{max(1.0, step - 1):.2f}" '
                     f'height="{h:.2f}" data-night="{d.isoformat()}" data-rows="{rows}"><title>{tip}</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


def age_trend(points: Sequence[tuple[float, float]], *, stale_hours: float, width: int = 640, height: int = 160,
              axis: Iterable[str] = (), label: str = "{hours} h") -> str:
    """A line of ``points`` ``(x in [0, 1] along the time axis, age in hours)`` with a dashed line at
    ``stale_hours``; ``axis`` are labels spread under the axis (escaped); ``label`` formats the y labels."""
    pad_l, pad_b, pad_t = 48, 22, 8
    inner_w, inner_h = width - pad_l - 8, height - pad_b - pad_t
    top = max([a for _, a in points] + [stale_hours * 1.2, 1.0])

    def y(hours: float) -> float:
        return round(pad_t + inner_h * (1 - hours / top), 2)

    out = [f'<svg class="trend" id="age-trend" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" data-points="{len(points)}">',
           f'<line class="axis" x1="{pad_l}" y1="{pad_t + inner_h}" x2="{width - 8}" y2="{pad_t + inner_h}"/>',
           f'<line class="stale" x1="{pad_l}" y1="{y(stale_hours)}" x2="{width - 8}" y2="{y(stale_hours)}"/>']
    for v in (0.0, stale_hours, top):
        out.append(f'<text class="ylabel" x="{pad_l - 4}" y="{y(v) + 4}" text-anchor="end">'
                   f'{escape(label.format(hours=f"{v:.0f}" if v >= 10 else f"{v:.1f}"))}</text>')
    labels = list(axis)
    for i, text in enumerate(labels):
        x = pad_l + inner_w * (i / max(1, len(labels) - 1))
        anchor = "start" if i == 0 else "end" if i == len(labels) - 1 else "middle"
        out.append(f'<text class="xlabel" x="{x:.1f}" y="{height - 6}" text-anchor="{anchor}">{escape(text)}</text>')
    if points:
        coords = " ".join(f"{pad_l + inner_w * x:.1f},{y(a)}" for x, a in points)
        out.append(f'<polyline class="age" points="{coords}"/>')
        for x, a in points:
            cls = "dot stale" if a > stale_hours else "dot"
            out.append(f'<circle class="{cls}" cx="{pad_l + inner_w * x:.1f}" cy="{y(a)}" r="2.5"/>')
    out.append("</svg>")
    return "".join(out)
