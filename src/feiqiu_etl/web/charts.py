"""Small server-drawn SVG charts of the overview and a cell's history (issue 29, part 4): no script, no library,
nothing from a CDN — the page works offline. Pure functions returning SVG text; every text in it is escaped.

* :func:`night_bars`: rows written per night of one store, the last ``nights`` nights, as a bar sparkline;
* :func:`age_trend`: the age of a store's task data at each load (hours), against the stale threshold.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Iterable, Mapping, Sequence

from markupsafe import escape


def night_bars(per_night: Mapping[date, int], last: date, *, nights: int = 30, width: int = 92, height: int = 12,
               label: str = "") -> str:
    """Bars of ``per_night`` rows for the ``nights`` nights ending with ``last`` (oldest left) as ONE path (a
    chain of 50 stores draws 50 of these on one page), nights without a run as a grey baseline tick; the
    bars' values are in ``data-rows`` (oldest first, empty for no run) and ``label`` (``{first}``, ``{last}``,
    ``{low}``, ``{high}``) is the chart's tooltip."""
    days = [last - timedelta(days=nights - 1 - i) for i in range(nights)]
    values = [per_night.get(d) for d in days]
    top = max([v for v in values if v] + [1])
    step = width / nights
    bar = max(1.0, step - 1)
    bars, ticks = [], []
    for i, v in enumerate(values):
        x = i * step
        if v is None:
            ticks.append(f"M{x:.1f} {height - 1}h{bar:.1f}v1h-{bar:.1f}z")
        else:
            h = max(1.0, (height - 1) * int(v) / top)
            bars.append(f"M{x:.1f} {height}v-{h:.1f}h{bar:.1f}v{h:.1f}z")
    seen = [int(v) for v in values if v is not None]
    tip = escape(label.format(first=days[0].isoformat(), last=days[-1].isoformat(),
                              low=f"{min(seen):,}" if seen else "-", high=f"{max(seen):,}" if seen else "-"))
    rows = ",".join("" if v is None else str(int(v)) for v in values)
    return (f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" data-nights="{len(seen)}" data-rows="{rows}">'
            f'<title>{tip}</title><path class="none" d="{"".join(ticks)}"/><path class="bar" d="{"".join(bars)}"/>'
            "</svg>")


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
