"""Build a :class:`~feiqiu_etl.plan.model.RunPlan` from validated inputs and the warehouse's history.

Pure: no I/O, no clock except ``inputs.windows.now`` and ``started`` (or the times given). For every lane, store
and task it decides the window segments (explicit, or incremental: resume from the gaps plus a look-back,
docs/upstream-api.md Q13), the horizon to record, the owed details and an estimate of requests and lane seconds.
A lane with a deadline (``run.deadline``) runs recent data first: its incremental tasks are split into parts
(:func:`_with_parts`; recent, owed, history newest first), and the plan says what fits before the deadline
(:mod:`feiqiu_etl.plan.fit`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, time, timedelta, timezone

from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.connector.windows import (Window, local_now, plan_incremental, recent_and_history, split,
                                          split_back)
from feiqiu_etl.deadline import Deadline
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.plan.fit import fit_lane, safe_gaps
from feiqiu_etl.plan.history import EMPTY, PlanHistory, TaskHistory
from feiqiu_etl.plan.inputs import LaneInput, PlanInputs
from feiqiu_etl.plan.model import Estimate, LanePlan, RunPlan, TaskPlan

DEFAULT_REQUEST_SECONDS = 0.1
"""Assumed time a request holds the lane (latency) before any run measured it."""


def build_plan(inputs: PlanInputs, history: PlanHistory = EMPTY, *, now: datetime | None = None,
               started: datetime | None = None) -> RunPlan:
    """The run's plan. ``now`` (naive Asia/Shanghai) defaults to ``inputs.windows.now`` or the current time;
    ``started`` (aware; default: the current time) is the wall-clock start a deadline counts from."""
    now = now or inputs.windows.now or local_now()
    started = started or datetime.now(timezone.utc)
    share = inputs.settings.detail.recheck_share
    lanes = tuple(_with_deadline(inputs, lane, _with_rechecks(_lane(inputs, lane, history, now), share), history,
                                 started) for lane in inputs.lanes)
    return RunPlan(
        connector=inputs.connector, lanes=lanes, load_ods=inputs.load_ods, dwd=inputs.dwd, now=now,
        incremental=inputs.windows.explicit is None, timeout=inputs.timeout, wait_for_lane=inputs.wait_for_lane,
        unsafe_gaps=inputs.unsafe_gaps, detail_max_attempts=inputs.settings.detail.max_attempts,
        db_unavailable_limit=inputs.settings.db.unavailable_limit,
        settings=settings_snapshot(inputs), started=started,
    )


def _lane(inputs: PlanInputs, lane: LaneInput, history: PlanHistory, now: datetime) -> LanePlan:
    latency = history.request_seconds if history.request_seconds is not None else DEFAULT_REQUEST_SECONDS
    phased = lane.settings.run.deadline is not None and inputs.windows.explicit is None
    tasks = []
    for store in lane.stores:
        for spec in lane.specs:
            past = history.of(spec.code, store.site_id)
            recent = None
            if phased:
                windows, recent, horizon = phased_windows(inputs, spec, past, now)
            else:
                windows, horizon = plan_windows(inputs, spec, past, now)
            cfg = lane.configs[spec.code]
            tasks.append(TaskPlan(spec=spec, site_id=store.site_id, config=cfg, windows=windows, horizon=horizon,
                                  owed_details=past.owed_details if spec.detail else 0,
                                  estimate=estimate(spec, cfg, windows, past, latency), first_load=past.last is None,
                                  recent_windows=recent))
    return LanePlan(
        name=lane.name, token=lane.token, token_source=lane.token_source, api_base=lane.api_base,
        stores=lane.stores, tasks=tuple(tasks), connector=inputs.connector.name, timeout=inputs.api_timeout,
        connect_timeout=inputs.connect_timeout, retry=inputs.retry,
        max_transport_failures=inputs.settings.lane.max_transport_failures,
        max_active_stores=inputs.settings.lane.max_active_stores, request_seconds=latency,
    )


def _with_deadline(inputs: PlanInputs, lane: LaneInput, plan: LanePlan, history: PlanHistory,
                   started: datetime) -> LanePlan:
    """A lane with a deadline: its tasks in parts (recent data first), the instant it stops, the narrowest safe
    gap per class (documented minimum plus the margin, or a floor the token learnt) and what fits by then."""
    text = lane.settings.run.deadline
    if text is None:
        return plan
    deadline = Deadline.parse(text)
    at = deadline.at(started)
    margins = lane.settings.lane
    documented = {name: c.min_gap for name, c in inputs.connector.api.gap_classes.items()}
    plan = replace(_with_parts(plan, history), deadline=deadline, deadline_at=at,
                   safe_gaps=safe_gaps(documented, share=margins.safety_margin, seconds=margins.safety_margin_seconds,
                                       learnt=history.floors.get(plan.key)))
    return replace(plan, fit=fit_lane(plan, (at - started).total_seconds()))


def _with_rechecks(lane: LanePlan, share: float) -> LanePlan:
    """Spread ``share`` of the lane's estimated requests over its tasks with details (each gets its part,
    at least one while the share is above 0): that many details checked longest ago are fetched again."""
    detailed = [i for i, t in enumerate(lane.tasks) if t.spec.detail is not None and not t.first_load]
    if share <= 0 or not detailed:
        return lane
    budget = max(len(detailed), math.ceil(share * lane.estimate_requests))
    tasks = list(lane.tasks)
    for n, i in enumerate(detailed):
        part = budget // len(detailed) + (1 if n < budget % len(detailed) else 0)
        tasks[i] = replace(tasks[i], recheck_budget=part)
    return replace(lane, tasks=tuple(tasks))


def plan_windows(inputs: PlanInputs, spec: OdsTaskSpec, past: TaskHistory,
                 now: datetime) -> tuple[tuple[Window, ...], datetime | None]:
    """Window segments of a task (none for snapshots) and the incremental horizon to record (or None)."""
    if spec.kind != "windowed":
        return (), None
    ws = inputs.windows
    max_segment = min(ws.segment, timedelta(days=inputs.connector.api.window.max_days))
    if ws.explicit is not None:
        return tuple(split(ws.explicit, max_segment)), None
    planned = plan_incremental(now, list(past.done), lookback=ws.lookback, initial=ws.initial, horizon=past.horizon)
    horizon = planned[0].start if planned else None
    return tuple(seg for w in planned for seg in split(w, max_segment)), horizon


def phased_windows(inputs: PlanInputs, spec: OdsTaskSpec, past: TaskHistory,
                   now: datetime) -> tuple[tuple[Window, ...], int, datetime | None]:
    """A windowed task's segments for a lane with a deadline, newest first: the recent ones (the look-back tail, or
    on a first load the part since yesterday 00:00), then the history (older gaps, split back from their newest
    end); how many are recent; the horizon to record. A snapshot has none."""
    if spec.kind != "windowed":
        return (), 0, None
    ws = inputs.windows
    max_segment = min(ws.segment, timedelta(days=inputs.connector.api.window.max_days))
    yesterday = datetime.combine(now.date() - timedelta(days=1), time())
    recent, older = recent_and_history(now, list(past.done), lookback=ws.lookback, initial=ws.initial,
                                       horizon=past.horizon, recent_from=yesterday)
    planned = plan_incremental(now, list(past.done), lookback=ws.lookback, initial=ws.initial, horizon=past.horizon)
    horizon = planned[0].start if planned else None
    first = [seg for w in reversed(recent) for seg in split_back(w, max_segment)]
    rest = [seg for w in older for seg in split_back(w, max_segment)]
    return tuple(first + rest), len(first), horizon


def _with_parts(lane: LanePlan, history: PlanHistory) -> LanePlan:
    """Split each task planned with ``recent_windows`` into its parts (see :class:`TaskPlan`), each with its own
    estimate; the task's estimate becomes their sum."""
    tasks = []
    for task in lane.tasks:
        if task.recent_windows is None:
            tasks.append(task)
            continue
        past = history.of(task.code, task.site_id)
        parts = _parts(task, past, lane.request_seconds)
        total = Estimate(sum(p.estimate.list_requests for p in parts), sum(p.estimate.detail_requests for p in parts),
                         sum(p.estimate.seconds for p in parts), task.estimate.basis)
        tasks.append(replace(task, parts=parts, estimate=total))
    return replace(lane, tasks=tuple(tasks))


def _parts(task: TaskPlan, past: TaskHistory, latency: float) -> tuple[TaskPlan, ...]:
    spec, cfg = task.spec, task.config
    recent_windows, history = task.windows[:task.recent_windows], task.windows[task.recent_windows:]
    owed_past = replace(past, owed_details=0)
    days = sum(w.length.total_seconds() for w in task.windows) / 86400

    def part_estimate(windows: tuple[Window, ...]) -> Estimate:
        e = estimate(spec, cfg, windows, owed_past, latency)
        if spec.kind == "windowed" and spec.detail is not None and e.basis == "history" and days > 0:
            share = sum(w.length.total_seconds() for w in windows) / 86400 / days  # the run's details, by length
            e = _estimate_of(e.list_requests, round(e.detail_requests * share), cfg, latency, e.basis)
        return e

    recent = part_estimate(recent_windows)
    deferred = recent.detail_requests if spec.is_snapshot and spec.detail is not None else 0
    parts = [replace(task, phase="recent", windows=recent_windows, owed_details=0, recheck_budget=0, parts=(),
                     estimate=_estimate_of(recent.list_requests, recent.detail_requests - deferred, cfg, latency,
                                           recent.basis))]
    if spec.detail is not None:
        details = task.owed_details + task.recheck_budget + deferred
        parts.append(replace(task, phase="owed", windows=(), parts=(),
                             estimate=_estimate_of(0, details, cfg, latency, recent.basis)))
    for window in history:
        parts.append(replace(task, phase="history", windows=(window,), owed_details=0, recheck_budget=0, parts=(),
                             estimate=part_estimate((window,))))
    return tuple(parts)


def _estimate_of(pages: int, details: int, cfg: PipelineConfig, latency: float, basis: str) -> Estimate:
    return Estimate(pages, details, (pages + details) * (cfg.gap.mean + latency), basis)


def estimate(spec: OdsTaskSpec, cfg: PipelineConfig, windows: tuple[Window, ...], past: TaskHistory,
             request_seconds: float) -> Estimate:
    """Requests and lane seconds of a task: from the last run of the same task and store when there is one
    (list rows per day of window, pages of the snapshot, details of a steady run), else from the catalog."""
    last = past.last
    owed = past.owed_details if spec.detail else 0
    segments = max(1, len(windows)) if spec.kind == "windowed" else 1
    if last is None:
        pages, details, basis = segments, owed, "catalog"
    else:
        detail_sent = int(last.get("detail_success", 0)) + int(last.get("detail_failure", 0))
        list_requests = max(1, int(last.get("total_requests", 0)) - detail_sent)
        if spec.kind == "windowed":
            days = _days(last.get("windows") or [])
            list_rows = int(last.get("total_fetched", 0)) - int(last.get("detail_fetched", 0))
            per_day = list_rows / days if days > 0 else 0.0
            pages = sum(math.floor(per_day * w.length.total_seconds() / 86400 / spec.page_size) + 1 for w in windows)
            pages = max(pages, 1 if windows else 0)
        else:
            pages = list_requests
        steady = 0 if last.get("first_load", False) else detail_sent - int(last.get("owed_details", 0))
        details = owed + max(0, steady) if spec.detail else 0
        basis = "history"
    seconds = (pages + details) * (cfg.gap.mean + request_seconds)
    return Estimate(pages, details, seconds, basis)


def _days(windows: list) -> float:
    from feiqiu_etl.connector.windows import parse_local

    total = 0.0
    for start, end in windows:
        try:
            total += (parse_local(end) - parse_local(start)).total_seconds() / 86400
        except (TypeError, ValueError):
            continue
    return total


def settings_snapshot(inputs: PlanInputs) -> dict:
    """Every effective setting with its source (for the run record): the global keys, and each lane's task
    settings that a layer set (``lane:pipeline.<task>.<key>`` for a fleet lane). No secrets."""
    out = {key: {"value": value, "source": source} for key, (value, source) in inputs.settings.effective().items()}
    for lane in inputs.lanes:
        for spec in lane.specs:
            for key in PipelineConfig.keys():
                found = lane.settings.resolve(spec.code, key)
                if found.source != "default":
                    name = f"pipeline.{spec.code.lower()}.{key}"
                    out[name if lane.name == "default" else f"{lane.name}:{name}"] = {
                        "value": getattr(lane.configs[spec.code], key), "source": found.source}
    return out
