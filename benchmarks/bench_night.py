"""A night of one token: what the lane sends against what the data needs, with time scaled down.

One token, N ``medium`` stores (upstream-api.md §4.1's lower-bound volumes) on the simulator with its risk control
ON, every gap scaled by ``--factor`` (the simulator's G and ban, the connector's random gaps and retry backoff):

1. night 1: ``feiqiu-etl run`` as a real process (a fleet of one lane with the N stores) at ``--now`` = the end of
   the simulator's history: a first load of ``--days`` days;
2. the simulator trades for 24 h (``POST /__sim/advance``): settlements, reopened ones, member and goods edits,
   volatile (Q11) and Q13 changes;
3. night 2: the same command at ``--now`` 24 h later.

After each night it prints, per store and task, the requests sent (counted in the simulator's request log,
``GET /__sim/log``) against the minimum a perfect connector needs (``POST /__sim/minimum``: list pages at
``limit=200`` + one detail per new or changed parent, none for a volatile-only change) and the excess, the rows
fetched; and for the lane: lane time scaled back to real hours (measured, and requests × the mean configured gap),
stores fully refreshed within a ``--night-hours`` night, 42901/42902 counts per gap class, the share of lane time with
a request in flight, and the order: whether every store's recent data (snapshots and the windows that reach into
yesterday) came before any history (older windows). Later features add flags with ``--run-arg`` and columns in
``COLUMNS``.

The runs use a copy of the connector whose documented minimum gaps (``api.gap_classes``) are scaled like the
simulator's G, and ``lane.safety_margin_seconds`` scaled too, so that a ``--deadline`` narrows the gaps toward the
floors that match the scaled upstream (3.3 s → 0.033 s at ``--factor 0.01``).

What is scaled (issue 30): every gap the runs model is × ``--factor`` — the simulator's G, violation window and ban,
the unit of its ``retryAfter`` (``retry_after_unit``: whole units of ``factor`` s instead of whole seconds, so one
rejection costs the scaled lane what it costs a real one), the connector's documented minima, random gaps, retry
backoff and ``lane.safety_margin_seconds`` (which is also the margin of a floor learnt from a 42901). Not scaled,
and why: the time a request takes (milliseconds at both scales: nothing to model) and so its HTTP timeout
(``api.timeout``: a bound on that time) — a run that meets a timeout is refused (its 60 s hold would be a scaled
hour). The bench refuses a factor at which the scaled safety margin is below :data:`JITTER_FLOOR` (the machine's
scheduling delay between a response and the simulator's mark of its completion, which nothing scales).

It also reports the load average before and after each night, and the whole stores (every task SUCCESS, its last
response by then) at 25/50/75/100 % of the night (``--night-hours``) and of the lane time; and where the lane's time
went, per request, from the lane's own timeline (``etl_meta.run_request``): the gap at its class's safe floor, the gap
above it (the pace's slack, the machine waking the lane late), the attempt (of it the simulator's own time), the
rejections — and how often the simulator saw a gap shorter than the lane measured it by more than the scaled margin.
With ``--inject-42901``, what the injected rejection cost in gaps: exactly, from the lane's timeline (each attempt's gap
drawn against its gap waited: what the floor and the hold added), and as the simulator saw it (random gaps against
median ones: noisy).

The simulator runs at a raised priority (:data:`SIMULATOR_NICE`, where the machine permits it; the report's head says
which): the upstream is another machine, and on a busy one the simulator's completion mark (from which rule 2 measures
the next gap) can come 10 ms after the lane already had the response — a second of the modelled upstream at
``--factor 0.01``, far above the scaled margin, and nothing scales it. The product (the run, its database) keeps the
normal priority.

``--deadline HOURS`` gives the runs a deadline of HOURS of real time, scaled. ``--seed-first-load`` makes night 1 a
seed: the first load runs with the simulator's risk control off and no gaps (minutes instead of hours for many
stores; its requests are still compared with the minimum, its time means nothing), and the deadline applies to
night 2 only — what a chain's nightly refresh costs once every store is loaded.

Usage: python benchmarks/bench_night.py [--stores 2] [--factor 0.01] [--days 7] [--deadline 8]
[--seed-first-load] [--output FILE] (needs the dev extras; starts its own PostgreSQL and simulator; about 8 minutes
per store at --factor 0.01 without --seed-first-load)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import psycopg

from feiqiu_etl.connector import load_connector
from feiqiu_etl.connector.windows import fmt, parse_local
from feiqiu_etl.db.embedded import create_database, temporary_server
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.pipeline.request_scheduler import FLOOR_DECAY_REQUESTS
from feiqiu_etl.simulator import SCALE_PROFILES, TASK_CODES
from feiqiu_etl.simulator.catalog import DETAIL_BY_PARENT, DETAIL_BY_PATH, LIST_BY_PATH, GapClass

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from flowkit import scaled_connector  # noqa: E402

PY = [sys.executable, "-m", "feiqiu_etl"]
TOKEN_ENV, TOKEN = "FQ_NIGHT", "fq_bench_night"
FIRST_SITE = 8640015201004417
UPSTREAM = {"gap_standard": 3.0, "gap_groupbuy": 8.0, "ban_seconds": 300.0, "violation_window": 60.0}
"""upstream-api.md §2.2: G per class, the ban, the violation window (all scaled)."""
RETRY_BACKOFF = 1.0
"""The connector's first retry backoff (docs/reference/settings.md: ``api.retry_backoff``), scaled like a gap."""
SAFETY_MARGIN_SECONDS = 0.3
"""``lane.safety_margin_seconds`` (docs/guides/deadline.md), scaled like a gap."""
JITTER_FLOOR = 0.002
"""s: the scaled safety margin must be at least this (the scheduling delay on a busy machine between the client
reading a response and the simulator marking it complete is not scaled: a margin below it measures the machine)."""
SIMULATOR_NICE = -10
"""The simulator's scheduling priority (``nice``; where the machine permits it). The upstream is another machine: its
completion marks (rule 2 measures each gap from one) and its answers must not wait in this machine's run queue behind
the other processes of a busy machine — at ``--factor 0.01`` such a delay of 10 ms is a second of the modelled upstream's
time, which the lane's scaled safety margin (3 ms) cannot cover and nothing scales. The lane itself, its database and
everything else of the product run at the normal priority: the product must hold on a busy machine."""
CUTS = (0.25, 0.5, 0.75, 1.0)
"""The shares of the night (and of the lane time) at which the whole stores are counted."""


@dataclass
class Night:
    """One night: the run's JSON, the simulator's log entries of it, the minimum per store, wall seconds."""

    label: str
    now: datetime
    start: datetime
    result: dict
    entries: list[dict]
    minimum: dict[int, dict]
    wall: float
    began: tuple[float, float] = (0.0, 0.0)  # (time.time(), time.monotonic()) when the command was started
    load: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())  # os.getloadavg() before and after
    per_task: dict[int, dict[str, Counter]] = field(default_factory=dict)
    lane: list[dict] = field(default_factory=list)  # the lane's own timeline (etl_meta.run_request), in order


def task_of(path: str) -> tuple[str, str] | None:
    """(task code, "list" | "detail") of an API path."""
    if path in LIST_BY_PATH:
        return LIST_BY_PATH[path].task_code, "list"
    if path in DETAIL_BY_PATH:
        return DETAIL_BY_PATH[path].parent_task, "detail"
    return None


def gaps(factor: float) -> dict[str, float]:
    """The connector settings that make every configured gap (the defaults, the connector's per-task ones) and
    the retry backoff ``factor`` times as long."""
    base = PipelineConfig()
    settings = {"pipeline.rate_min": base.rate_min * factor, "pipeline.rate_max": base.rate_max * factor,
                "api.retry_backoff": RETRY_BACKOFF * factor, "lane.safety_margin_seconds": SAFETY_MARGIN_SECONDS * factor}
    for spec in load_connector().tasks:
        for key in ("rate_min", "rate_max"):
            if key in (spec.pipeline or {}):
                settings[f"pipeline.{spec.code.lower()}.{key}"] = spec.pipeline[key] * factor
    return {k: round(v, 6) for k, v in settings.items()}


def mean_gaps() -> dict[str, float]:
    """The mean configured gap per task (s, unscaled): what one request costs the lane at the default gaps."""
    base = PipelineConfig()
    out = {}
    for spec in load_connector().tasks:
        p = spec.pipeline or {}
        out[spec.code] = (p.get("rate_min", base.rate_min) + p.get("rate_max", base.rate_max)) / 2
    return out


def start_simulator(args, fleet: Path, env: dict, log: Path) -> tuple[subprocess.Popen, str, str]:
    """``feiqiu-etl simulate`` as a process (its stderr to ``log``); returns it, its base URL and its own token
    (which the ``/__sim/`` endpoints demand)."""
    f = args.factor
    cmd = [*PY, "simulate", "--port", "0", "--scale", args.scale, "--days", str(args.days), "--seed", str(args.seed),
           "--anchor", fmt(args.anchor), "--fleet", str(fleet),
           *(x for k, v in UPSTREAM.items() for x in (f"--{k.replace('_', '-')}", f"{v * f:g}"))]
    with log.open("w") as errors:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, env=env, text=True,
                                preexec_fn=_raise_priority)
    lines: list[str] = []  # "… listening on URL", "Bearer token: T" (or nothing: the process ended)
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout.readline() for _ in range(2)), daemon=True)
    reader.start()
    reader.join(timeout=600)  # 35 stores take minutes to generate on a busy machine
    if len(lines) < 2 or "listening on" not in lines[0] or not lines[1].startswith("Bearer token:"):
        proc.kill()
        raise SystemExit(f"the simulator did not start: {log.read_text()[-2000:]}")
    return proc, lines[0].split()[-1], lines[1].split()[-1]


def _raise_priority() -> None:
    """In the simulator's process before it starts: :data:`SIMULATOR_NICE`, or the normal priority where the machine
    does not permit it (the report says which)."""
    try:
        os.nice(SIMULATOR_NICE - os.nice(0))
    except OSError:
        pass


ADMIN: dict[str, str] = {}
"""``{"token": …}``: the simulator's own token, for its ``/__sim/`` endpoints."""


def admin(base: str, path: str, body: dict | None = None):
    """``GET`` (no body) or ``POST`` one of the simulator's ``/__sim/`` endpoints; the answer's data."""
    if body is None:
        return httpx.get(f"{base}{path}", timeout=120).json()
    answer = httpx.post(f"{base}{path}", json=body, headers={"Authorization": f"Bearer {ADMIN['token']}"},
                        timeout=300).json()
    if answer["code"] != 0:
        raise SystemExit(f"{path}: {answer}")
    return answer["data"]


def run_night(args, label: str, base: str, dsn: str, fleet: Path, env: dict, now: datetime, start: datetime,
              settings: dict, after_seq: int, extra: list[str] = (), inject_after: float | None = None) -> Night:
    cmd = [*PY, "run", "--fleet", str(fleet), "--api-base", base, "--dsn", dsn, "--now", fmt(now), "--unsafe-gaps",
           "--no-progress", "--json", "--connector", str(args.connector), *([] if args.dwd else ["--no-dwd"]),
           *(f"--set={k}={v}" for k, v in settings.items()), *args.run_arg, *extra]
    load_before = os.getloadavg()
    began = time.monotonic()
    began_wall = time.time()
    stop = threading.Event()
    if inject_after is not None:  # one 42901 mid-night (issue 30: it may cost at most three gaps)
        threading.Thread(target=lambda: stop.wait(inject_after) or admin(base, "/__sim/faults", {"kind": "code42901"}),
                         daemon=True).start()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    finally:
        stop.set()
    wall = time.monotonic() - began
    load_after = os.getloadavg()
    try:
        result = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"{label}: exit {done.returncode}, no JSON: {done.stderr[-2000:]}") from None
    entries = [e for e in admin(base, "/__sim/log") if e["seq"] > after_seq]
    minimum = {site: admin(base, "/__sim/minimum", {"siteId": site, "startTime": fmt(start), "endTime": fmt(now)})
               for site in args.sites}
    night = Night(label, now, start, result, entries, minimum, wall, (began_wall, began), (load_before, load_after),
                  lane=lane_timeline(dsn, began_wall))
    for site in args.sites:
        night.per_task[site] = defaultdict(Counter)
    for e in entries:
        where = task_of(e["path"])
        if where is None or e["site_id"] not in night.per_task:
            continue
        counter = night.per_task[e["site_id"]][where[0]]
        counter[where[1]] += 1
        counter["sent"] += 1
    return night


# --- report ----------------------------------------------------------------------------------------------------

def _rows(result: dict, site: int, task: str) -> int:
    return sum(t.get("total_fetched", 0) for t in result.get("tasks", []) if t["site_id"] == site and t["task"] == task)


COLUMNS = (  # (header, width, value(night, site, task, its minimum entry, its sent counter)); add columns here
    # "min" is the ground truth; "vol.only": parents changed only in a volatile field (Q11), which need no detail
    ("task", 27, lambda n, s, t, m, c: t),
    ("sent", 6, lambda n, s, t, m, c: c["sent"]),
    ("min", 6, lambda n, s, t, m, c: m["requests"]),
    ("excess", 7, lambda n, s, t, m, c: f"{c['sent'] - m['requests']:+d}"),
    ("pages", 6, lambda n, s, t, m, c: c["list"]),
    ("min", 5, lambda n, s, t, m, c: m["pages"]),
    ("details", 8, lambda n, s, t, m, c: c["detail"]),
    ("min", 5, lambda n, s, t, m, c: m["details"]),
    ("vol.only", 9, lambda n, s, t, m, c: m["volatile_only"] if t in DETAIL_BY_PARENT else ""),
    ("rows", 7, lambda n, s, t, m, c: _rows(n.result, s, t)),
)


def table(night: Night, site: int) -> list[str]:
    header = "  " + " ".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w, _) in enumerate(COLUMNS))
    lines = [header]
    minimum = {t["task_code"]: t for t in night.minimum[site]["tasks"]}
    for task in TASK_CODES:
        values = [fn(night, site, task, minimum[task], night.per_task[site][task]) for _, _, fn in COLUMNS]
        lines.append("  " + " ".join(f"{v!s:<{w}}" if i == 0 else f"{v!s:>{w}}"
                                     for i, ((_, w, _), v) in enumerate(zip(COLUMNS, values))))
    return lines


def gap_class_of(path: str) -> str:
    api = LIST_BY_PATH.get(path) or DETAIL_BY_PATH.get(path)
    return (api.gap_class if api is not None else GapClass.STANDARD).value


def order_line(args, night: Night, entries: list[dict]) -> str:
    """Whether every store's recent data came before any history: a list request is *history* when its window ends
    by yesterday 00:00 (of the night's --now), *recent* otherwise (snapshot pages included)."""
    yesterday = datetime.combine(night.now.date() - timedelta(days=1), datetime.min.time())
    t0 = entries[0]["started"]

    def kind(e: dict) -> str | None:
        if e["path"] not in LIST_BY_PATH or e["code"] != 0:
            return None
        end = (e.get("body") or {}).get("endTime")
        return "history" if end is not None and parse_local(end) <= yesterday else "recent"

    history = [e for e in entries if kind(e) == "history"]
    recent_by_store = {s: max((e["ended"] for e in entries if kind(e) == "recent" and e["site_id"] == s), default=None)
                       for s in args.sites}
    if not history:
        last = max((t for t in recent_by_store.values() if t is not None), default=t0) - t0
        return (f"  order: no history requested; every store's recent data by {last:.1f} s = "
                f"{last / args.factor / 3600:.2f} h")
    first_history = min(e["started"] for e in history)
    late = [s for s, t in recent_by_store.items() if t is None or t > first_history]
    return (f"  order: {len(history)} history page(s), the first at {(first_history - t0) / args.factor / 3600:.2f} h; "
            f"every store's recent data before it: {'yes' if not late else 'NO: ' + ', '.join(map(str, late))}")


def injected_cost(night: Night, entries: list[dict], f: float) -> list[str]:
    """What an injected ``code42901`` cost the lane, in gaps: from the lane's own timeline (exact, :func:`lane_cost`),
    then as the simulator saw it (:func:`simulator_cost`: random gaps against median ones, noisy)."""
    faults = [i for i, e in enumerate(entries) if e.get("fault") == "code42901"]
    if not faults:
        return []
    return [lane_cost(night, entries, faults[0], f), simulator_cost(entries, faults[0], f)]


def lane_cost(night: Night, entries: list[dict], i: int, f: float) -> str:
    """The injected 42901 ``entries[i]`` (the k-th 42901 the simulator answered is the lane's k-th ``throttled``
    attempt) from the lane's timeline: the rejected attempt's gap and its own time, plus what floors and holds added
    to the gaps drawn (``gap - drawn``, at least 0) of the attempts after it until ``FLOOR_DECAY_REQUESTS + 1`` of its
    class were accepted (the floor is gone), in mean drawn gaps of its class; beside it the same sum over as many
    accepted before it (the machine's late wake-ups alone)."""
    k = sum(1 for e in entries[:i] if e["code"] == 42901)
    rejected = [n for n, r in enumerate(night.lane) if r["outcome"] == "throttled"]
    if len(rejected) <= k:
        return "  injected 42901, lane timeline: the rejected attempt is not in it"
    j = rejected[k]
    r = night.lane[j]
    mine = [x for x in night.lane if x["gap_class"] == r["gap_class"] and x["drawn"] is not None]
    if not mine or r["gap"] is None:
        return "  injected 42901, lane timeline: no gaps drawn recorded"

    def added(rows: list[dict]) -> float:
        return sum(max(0.0, x["gap"] - x["drawn"]) for x in rows if x["gap"] is not None and x["drawn"] is not None)

    def span(rows: list[dict]) -> list[dict]:  # up to and including the (N+1)-th accepted attempt of the class
        out, ok = [], 0
        for x in rows:
            out.append(x)
            ok += x["outcome"] == "ok" and x["gap_class"] == r["gap_class"]
            if ok == FLOOR_DECAY_REQUESTS + 1:
                return out
        return []

    after, before = span(night.lane[j + 1:]), span(night.lane[:j][::-1])
    if not after:
        return "  injected 42901, lane timeline: too close to the end of the night to measure"
    mean = sum(x["drawn"] for x in mine) / len(mine)
    cost = r["gap"] + r["seconds"] + added(after)
    return (f"  injected 42901 at {(r['started'] - night.lane[0]['started']) / f / 3600:.2f} h, from the lane's timeline: "
            f"the rejected attempt's gap {r['gap'] * 1000:.1f} ms + its time {r['seconds'] * 1000:.1f} ms + what floors "
            f"and holds added to the gaps drawn of the {len(after)} attempts after it (until {FLOOR_DECAY_REQUESTS + 1} "
            f"of {r['gap_class']} were accepted) {added(after) * 1000:.1f} ms (the same over the {len(before)} before "
            f"it, the machine's late wake-ups: {added(before) * 1000:.1f} ms) = {cost * 1000:.1f} ms: it cost "
            f"{cost / mean:.2f} gaps (mean gap drawn {mean * 1000:.1f} ms; {cost / f:.1f} s scaled back)")


def simulator_cost(entries: list[dict], i: int, f: float) -> str:
    """The injected 42901 ``entries[i]`` as the simulator saw it: the gaps (a request's arrival less the previous
    response's end) from the last accepted response before it through the next ``FLOOR_DECAY_REQUESTS + 1``
    accepted requests, plus the rejected request's own time, less as many median gaps of the 200 accepted requests
    before it (random gaps against median ones: a 21-gap sum has a std of ~1.8 gaps)."""
    accepted = [e for e in entries if e.get("accepted") and e.get("fault") is None]
    before = [e for e in accepted if e["started"] < entries[i]["started"]]
    after = [e for e in accepted if e["started"] > entries[i]["started"]][:FLOOR_DECAY_REQUESTS + 1]
    if len(before) < 2 or len(after) < FLOOR_DECAY_REQUESTS + 1:
        return "  injected 42901, as the simulator saw it: too close to an end of the night to measure"
    seen = sorted(b["started"] - a["ended"] for a, b in zip(before[-201:], before[-200:]))
    median = seen[len(seen) // 2]
    chain = [before[-1], entries[i], *after]  # the gaps between them, and the rejected request's own time
    spent = sum(b["started"] - a["ended"] for a, b in zip(chain, chain[1:])) + entries[i]["ended"] - entries[i]["started"]
    lost = spent - len(after) * median
    return (f"  injected 42901 at {(entries[i]['started'] - entries[0]['started']) / f / 3600:.2f} h, as the simulator "
            f"saw it: the {len(after)} gaps after it (and the rejected request) took {spent * 1000:.0f} ms where "
            f"{len(after)} median gaps ({median * 1000:.1f} ms) are {len(after) * median * 1000:.0f} ms: it cost "
            f"{lost / median:.2f} gaps ({lost / f:.1f} s scaled back; random gaps against median ones, noisy)")


def _share(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def time_split(night: Night, entries: list[dict], f: float) -> list[str]:
    """Where the lane's time went, per request (ms, and s scaled back): the gap the lane waited (at its class's safe
    floor, and above it: the pace's slack and the machine's wake-up delay), the attempt's own time (of it the
    simulator's), the rejected attempts; and how much the simulator saw a gap shorter than the lane measured it (its
    completion marked after the lane had the response: the machine's scheduling delay, which nothing scales)."""
    lane = night.lane
    if not lane:
        return ["  time split: the lane's timeline is empty"]
    deadline = next((x.get("deadline") for x in night.result.get("lanes", []) if x.get("deadline")), None) or {}
    safe = (deadline.get("fit") or {}).get("safe_gaps") or {}
    n = len(lane)
    span = max(r["started"] + r["seconds"] for r in lane) - lane[0]["started"]
    gaps = [r for r in lane if r["gap"] is not None]
    at_floor = sum(min(r["gap"], safe.get(r["gap_class"] or "", r["gap"])) for r in gaps)
    above = sum(r["gap"] for r in gaps) - at_floor
    attempt = sum(r["seconds"] for r in lane)
    served = sum(e["ended"] - e["started"] for e in entries)
    rejected = [r for r in lane if r["outcome"] != "ok"]

    def ms(total: float) -> str:
        return f"{total / n * 1000:.2f} ms ({total / n / f:.2f} s)"

    lines = [f"  time split per request (of {n}; scaled back in brackets): lane time {ms(span)} = gap at the safe floor "
             f"{ms(at_floor)} + gap above it {ms(above)} + the attempt {ms(attempt)} (the simulator's own part "
             f"{ms(served)}) + the rest {ms(span - at_floor - above - attempt)}; rejected attempts {len(rejected)}"]
    if len(entries) == n:
        squeezed = [r["gap"] - (b["started"] - a["ended"]) for r, a, b in zip(lane[1:], entries, entries[1:])
                    if r["gap"] is not None]
        margin = SAFETY_MARGIN_SECONDS * f
        lines.append(f"  the simulator saw the gap shorter than the lane measured it (its completion marked after the lane "
                     f"had the response) by more than the scaled margin {margin * 1000:g} ms in "
                     f"{sum(x > margin for x in squeezed)} of {len(squeezed)} gaps; p99.9 {_share(squeezed, 0.999) * 1000:.2f}"
                     f" ms, max {max(squeezed) * 1000:.2f} ms")
    return lines


def report(args, night: Night, means: dict[str, float]) -> list[str]:
    f = args.factor
    entries = sorted(night.entries, key=lambda e: e["started"])
    lines = [f"{night.label}: --now {fmt(night.now)}; minimum over [{fmt(night.start)}, {fmt(night.now)}); "
             f"run status {night.result.get('status')} (exit {night.result.get('exit_code')})"]
    if not entries:
        return [*lines, "  no request was sent"]
    t0, t_end = entries[0]["started"], max(e["ended"] for e in entries)
    in_flight = sum(e["ended"] - e["started"] for e in entries)
    stores = {s["site_id"]: s for lane in night.result.get("lanes", []) for s in lane.get("stores", [])}
    refreshed = 0
    whole_at: dict[int, float] = {}  # store -> its last response (h of the lane, scaled back), stores SUCCESS only
    total_sent = total_min = 0
    model_seconds = 0.0
    for site in args.sites:
        mine = [e for e in entries if e["site_id"] == site]
        sent, minimum = len(mine), night.minimum[site]["requests"]
        total_sent, total_min = total_sent + sent, total_min + minimum
        done_at = ((max(e["ended"] for e in mine) - t0) / f / 3600) if mine else 0.0
        status = stores.get(site, {}).get("status", "?")
        fits = status == "SUCCESS" and done_at <= args.night_hours
        refreshed += fits
        if status == "SUCCESS" and mine:
            whole_at[site] = done_at
        model = sum(means[task] * counter["sent"] for task, counter in night.per_task[site].items())
        model_seconds += model
        lines.append(f"store {site}: {status}, sent {sent} / minimum {minimum} ({sent / minimum:.2f}x, excess "
                     f"{sent - minimum:+d}); its last response at {done_at:.2f} h of the lane (scaled back); "
                     f"at the default gaps {model / 60:.0f} min of lane time")
        lines.extend(table(night, site))
    codes = Counter(e["code"] for e in entries)
    by_class = Counter((gap_class_of(e["path"]), e["code"]) for e in entries if e["code"] in (42901, 42902))
    per_class = ", ".join(f"{c} {by_class.get((c, 42901), 0)}/{by_class.get((c, 42902), 0)}"
                          for c in (g.value for g in GapClass))
    lane_hours = (t_end - t0) / f / 3600
    lines.append(f"lane: {len(entries)} requests, sent/minimum {total_sent}/{total_min} = {total_sent / total_min:.2f}x; "
                 f"42901: {codes.get(42901, 0)}, 42902: {codes.get(42902, 0)} (per gap class 42901/42902: {per_class})")
    lines.extend(injected_cost(night, entries, f))
    lines.extend(time_split(night, entries, f))
    previous = None
    for e in entries:  # each rejection: when, and how long after the previous accepted response it arrived
        if e["code"] in (42901, 42902):
            seen = f"{(e['started'] - previous['ended']) * 1000:.1f} ms after" if previous else "before any"
            lines.append(f"  {e['code']} ({e.get('outcome')}) at {(e['started'] - t0) / f / 3600:.2f} h, "
                         f"{gap_class_of(e['path'])}: it arrived {seen} the previous accepted response ended")
        elif e.get("accepted"):
            previous = e
    deadline = next((lane.get("deadline") for lane in night.result.get("lanes", []) if lane.get("deadline")), None)
    if deadline:
        fit = deadline.get("fit") or {}
        lines.append(f"  deadline {deadline['text']}: {'reached' if deadline.get('reached') else 'met'}; the plan said "
                     f"{fit.get('requests')} requests, {fit.get('seconds', 0) / f / 3600:.2f} h at the configured gaps, "
                     f"{fit.get('seconds_narrowest', 0) / f / 3600:.2f} h at the narrowest (scaled back), pace at the "
                     f"start {fit.get('pace')}, at the end {deadline.get('pace')}; requests left "
                     f"{deadline.get('left_requests', 0)}")
        # the simulator logs time.monotonic() (one clock for every process of the machine): the deadline's wall time
        # moved onto it through the moment the command was started
        at = datetime.fromisoformat(deadline["at"]).timestamp() - night.began[0] + night.began[1]
        over = t_end - at
        widest = f * max([PipelineConfig().rate_max,
                          *((t.pipeline or {}).get("rate_max", 0) for t in load_connector().tasks)])
        lines.append(f"  the last response {abs(over):.3f} s {'after' if over > 0 else 'before'} the deadline "
                     f"(= {abs(over) / f:.0f} s scaled back; the widest configured gap is {widest:g} s)")
    lines.append(f"  lane time per request {(t_end - t0) / len(entries) * 1000:.1f} ms (= "
                 f"{(t_end - t0) / len(entries) / f:.2f} s scaled back); the simulator's G {UPSTREAM['gap_standard'] * f * 1000:g} ms")
    lines.append(f"  lane time (first request to last response) {t_end - t0:.1f} s measured = {lane_hours:.2f} h "
                 f"scaled back (÷ {f:g}); the command's wall time {night.wall:.1f} s = {night.wall / f / 3600:.2f} h")
    lines.append(f"  at the default gaps (requests × mean configured gap): {model_seconds / 3600:.2f} h, "
                 f"{model_seconds / 60 / len(args.sites):.0f} min per store")
    lines.append(f"  stores fully refreshed within a {args.night_hours:g}-hour night: {refreshed} of {len(args.sites)}; "
                 f"lane busy share (a request in flight): {in_flight / (t_end - t0):.1%}; lane time used of the night: "
                 f"{lane_hours / args.night_hours:.0%}")
    n = len(args.sites)
    of_night = ", ".join(f"{c:.0%} {sum(t <= c * args.night_hours + 1e-9 for t in whole_at.values())}" for c in CUTS)
    of_lane = ", ".join(f"{c:.0%} {sum(t <= c * lane_hours + 1e-9 for t in whole_at.values())}" for c in CUTS)
    lines.append(f"  whole stores (of {n}) at a share of the {args.night_hours:g}-hour night: {of_night}; at a share "
                 f"of the lane time ({lane_hours:.2f} h): {of_lane}")
    timeouts = json.dumps(night.result.get("tasks", []), ensure_ascii=False).count("timeout: ")
    before, after = night.load
    lines.append(f"  load average (1/5/15 min) before {' '.join(f'{x:.2f}' for x in before)}, after "
                 f"{' '.join(f'{x:.2f}' for x in after)} ({os.cpu_count()} CPUs); HTTP timeouts: {timeouts}"
                 + ("  -> REFUSED: a timeout's hold is not scaled, this night measures the machine" if timeouts else ""))
    lines.append(order_line(args, night, entries))
    return lines


def lane_timeline(dsn: str, since: float) -> list[dict]:
    """The lane's own record of its attempts since ``since`` (epoch s): ``etl_meta.run_request`` rows in order, with
    ``started`` as epoch seconds, ``seconds`` (the attempt as the lane timed it), ``gap`` (since the last
    response, as the lane measured it) and ``drawn`` (the gap the lane drew for it)."""
    keys = ("seq", "site_id", "task", "gap_class", "started", "seconds", "gap", "wait_reason", "outcome", "drawn")
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT {', '.join(keys[:4])}, extract(epoch from started_at)::float8, seconds, gap, "
                            "wait_reason, outcome, drawn FROM etl_meta.run_request WHERE started_at >= to_timestamp(%s) "
                            "ORDER BY started_at, seq", (since,)).fetchall()
    return [dict(zip(keys, r)) for r in rows]


def dump(path: Path, night: Night) -> None:
    """Night 2's simulator log entries and the lane's own timeline, as JSON (for a closer look)."""
    path.write_text(json.dumps({"began": night.began, "entries": night.entries, "lane": night.lane}), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", type=int, default=2, help="stores on the one token (default 2)")
    parser.add_argument("--scale", choices=sorted(SCALE_PROFILES), default="medium",
                        help="the stores' size (upstream-api.md §4.1; default medium)")
    parser.add_argument("--factor", type=float, default=0.01, help="every gap and the ban × this (default 0.01)")
    parser.add_argument("--days", type=int, default=7, help="days of history = the first load (default 7)")
    parser.add_argument("--night-hours", type=float, default=8.0, help="length of a night, real hours (default 8)")
    parser.add_argument("--anchor", default="2024-03-04 00:00:00", help="end of the simulator's history")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dwd", action="store_true", help="load DWD after ODS too (not lane time)")
    parser.add_argument("--run-arg", action="append", default=[], help="extra argument for both runs (repeatable)")
    parser.add_argument("--deadline", type=float, metavar="HOURS",
                        help="pass `--deadline` (HOURS of real time, scaled: --deadline <HOURS×3600×factor>s) to both "
                             "runs (to night 2 only with --seed-first-load)")
    parser.add_argument("--seed-first-load", dest="seeded", action="store_true",
                        help="night 1 is a seed: risk control off and no gaps (its time means nothing)")
    parser.add_argument("--inject-42901", dest="inject", action="store_true",
                        help="night 2: one injected 42901 (POST /__sim/faults code42901) at half the deadline, or "
                             "after 60 %% of night 2's requests at the mean configured gap; reports what it cost")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds a run may take (default 7200)")
    parser.add_argument("--output", type=Path, help="also write the report here")
    parser.add_argument("--dump", type=Path, help="write night 2's simulator log and lane timeline (JSON) here")
    args = parser.parse_args()
    if SAFETY_MARGIN_SECONDS * args.factor < JITTER_FLOOR:
        parser.exit(2, f"--factor {args.factor:g}: the scaled safety margin {SAFETY_MARGIN_SECONDS * args.factor * 1000:g} "
                       f"ms would be below the machine's scheduling jitter ({JITTER_FLOOR * 1000:g} ms), which is not "
                       f"scaled; use a factor >= {JITTER_FLOOR / SAFETY_MARGIN_SECONDS:g}\n")
    args.anchor = parse_local(args.anchor)
    deadline = [f"--deadline={args.deadline * 3600 * args.factor:g}s"] if args.deadline is not None else []
    args.sites = [FIRST_SITE + i for i in range(args.stores)]
    settings = gaps(args.factor)
    settings["window.initial_days"] = args.days
    means = mean_gaps()
    profile = SCALE_PROFILES[args.scale]
    f = args.factor
    when = (deadline[0] + (" (night 2 only)" if args.seeded else " (both nights)")) if deadline else "none"
    head = [f"command: python benchmarks/bench_night.py {shlex.join(sys.argv[1:])}".rstrip(),
            f"time scale: every gap × {f:g}: the simulator's G {UPSTREAM['gap_standard'] * f:g} s / "
            f"{UPSTREAM['gap_groupbuy'] * f:g} s (group-buy), a ban of {UPSTREAM['ban_seconds'] * f:g} s after 3 "
            f"violations in {UPSTREAM['violation_window'] * f:g} s; the connector's gaps "
            f"{settings['pipeline.rate_min']:g}-{settings['pipeline.rate_max']:g} s (group-buy "
            f"{settings.get('pipeline.ods_group_package.rate_min', 0):g}-"
            f"{settings.get('pipeline.ods_group_package.rate_max', 0):g} s), retry backoff "
            f"{settings['api.retry_backoff']:g} s, retryAfter in whole units of {f:g} s. Times marked 'scaled back' are "
            f"÷ {f:g}. Not scaled: the time a request takes (ms) and its HTTP timeout (a night that meets one is "
            f"refused).",
            f"simulator: {args.stores} {args.scale} store(s) on one token (members {profile.members}, "
            f"{profile.settlements_per_day} settlements/day, ...), {args.days} days of history up to "
            f"{fmt(args.anchor)}, seed {args.seed}, risk control on; then 24 h of trading "
            f"(POST /__sim/advance)",
            f"connector: its gap classes scaled too (standard {UPSTREAM['gap_standard'] * f:g} s, group-buy "
            f"{UPSTREAM['gap_groupbuy'] * f:g} s), lane.safety_margin_seconds {SAFETY_MARGIN_SECONDS * f:g} s; "
            f"extra run arguments: {args.run_arg or 'none'}; deadline: {when}; night 1 "
            f"{'is a seed: risk control off, no gaps' if args.seeded else 'at the gaps above'}", ""]
    print("\n".join(head), flush=True)
    env = {**os.environ, TOKEN_ENV: TOKEN}
    with tempfile.TemporaryDirectory(prefix="fq-bench-night-") as tmp, \
            temporary_server(prefix="fq-bench-night-pg-") as server:
        fleet = Path(tmp) / "fleet.yaml"
        fleet.write_text("lanes:\n  - name: night\n    token_env: FQ_NIGHT\n    stores:\n"
                         + "".join(f"      - {{site_id: {s}}}\n" for s in args.sites), encoding="utf-8")
        create_database(server.dsn("postgres"), "bench_night", drop_first=True)
        dsn = server.dsn("bench_night")
        args.connector = scaled_connector(Path(tmp) / "feiqiu.yaml", UPSTREAM["gap_standard"] * f,
                                          UPSTREAM["gap_groupbuy"] * f)
        sim, base, ADMIN["token"] = start_simulator(args, fleet, env, Path(tmp) / "simulator.log")
        nice = f"the simulator's priority: nice {os.getpriority(os.PRIO_PROCESS, sim.pid)} ({SIMULATOR_NICE} wanted)"
        head.insert(-1, nice)
        print(nice, flush=True)
        try:
            admin(base, "/__sim/risk", {"retry_after_unit": f})  # retryAfter in whole units of the scaled second
            if args.seeded:
                admin(base, "/__sim/risk", {"enabled": False})
                seed = {**settings, **{k: 0 for k in settings if k.endswith(("rate_min", "rate_max"))}}
                first = run_night(args, "night 1 (first load, a seed: risk control off, no gaps)", base, dsn, fleet,
                                  env, args.anchor, args.anchor - timedelta(days=args.days), seed, 0)
                admin(base, "/__sim/risk", {"enabled": True})
            else:
                first = run_night(args, "night 1 (first load)", base, dsn, fleet, env, args.anchor,
                                  args.anchor - timedelta(days=args.days), settings, 0, deadline)
            body = report(args, first, means)
            print("\n".join(body), flush=True)
            advanced = admin(base, "/__sim/advance", {"hours": 24})
            changes = advanced["sites"][str(args.sites[0])]
            summary = (f"24 h of trading (store {args.sites[0]}): settlements +{changes['ODS_SETTLEMENT']['inserted']} "
                       f"new, {changes['ODS_SETTLEMENT']['updated']} edited; members +{changes['ODS_MEMBER']['inserted']}"
                       f" new, {changes['ODS_MEMBER']['updated']} edited, {changes['ODS_MEMBER']['volatile_only']} only "
                       f"in points (Q11); goods {changes['ODS_GOODS']['updated']} edited, "
                       f"{changes['ODS_GOODS']['volatile_only']} only in stockQty")
            print(f"\n{summary}\n", flush=True)
            last_seq = max((e["seq"] for e in first.entries), default=0)
            inject_after = None
            if args.inject:
                half = args.deadline * 3600 * f / 2 if args.deadline is not None else 0.3 * args.stores * 3000 * f
                inject_after = half
            second = run_night(args, "night 2 (the next night)", base, dsn, fleet, env,
                               args.anchor + timedelta(hours=24), args.anchor, settings, last_seq, deadline,
                               inject_after)
            tail = report(args, second, means)
            if args.dump:
                dump(args.dump, second)
            print("\n".join(tail), flush=True)
        finally:
            sim.terminate()
            try:
                sim.wait(timeout=10)
            except subprocess.TimeoutExpired:
                sim.kill()
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text("\n".join([*head, *body, "", summary, "", *tail]) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
