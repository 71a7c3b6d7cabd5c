"""Build a :class:`~feiqiu_etl.plan.model.RunPlan` from validated inputs and the warehouse's history.

Pure: no I/O, no clock except ``inputs.windows.now`` and ``started`` (or the times given). For every lane, store
and task it decides the window segments (explicit, or incremental: resume from the holes plus the task's look-back,
docs/upstream-api.md Q13), the horizon to record, the owed details, the re-check budget and an estimate of
requests and lane seconds (:mod:`.estimates`). A lane with a deadline (``run.deadline``) runs recent data first:
its incremental tasks are split into parts (:func:`_with_parts`: recent, owed, history newest first), and the
plan says what fits before the deadline (:mod:`feiqiu_etl.plan.fit`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, time, timedelta, timezone

from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.connector.windows import (Window, local_now, plan_incremental, recent_and_history, split,
                                          split_back)
from feiqiu_etl.deadline import Deadline, display_zone
from feiqiu_etl.estimates import Estimate, plan_estimate
from feiqiu_etl.db.connection import DbLimits
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.plan.fit import fit_lane, safe_gaps
from feiqiu_etl.plan.history import EMPTY, PlanHistory, TaskHistory
from feiqiu_etl.plan.inputs import LaneInput, PlanInputs
from feiqiu_etl.plan.model import LanePlan, RunPlan, TaskPlan

DEFAULT_REQUEST_SECONDS = 0.1
"""Assumed time a request holds the lane (latency) before any run measured it."""


def build_plan(inputs: PlanInputs, history: PlanHistory = EMPTY, *, now: datetime | None = None,
               started: datetime | None = None) -> RunPlan:
    """The run's plan. ``now`` (naive Asia/Shanghai) defaults to ``inputs.windows.now`` or the current time;
    ``started`` (aware; default: the current time) is the wall-clock start a deadline counts from."""
    now = now or inputs.windows.now or local_now()
    started = started or datetime.now(timezone.utc)
    share = inputs.settings.detail.recheck_share
    lanes = tuple(_with_deadline(inputs, lane, _with_rechecks(_lane(inputs, lane, history, now), share, history),
                                 history, started) for lane in inputs.lanes)
    return RunPlan(
        connector=inputs.connector, lanes=lanes, load_ods=inputs.load_ods, dwd=inputs.dwd, now=now,
        incremental=inputs.windows.explicit is None, timeout=inputs.timeout, wait_for_lane=inputs.wait_for_lane,
        unsafe_gaps=inputs.unsafe_gaps, detail_max_attempts=inputs.settings.detail.max_attempts,
        integrity=inputs.settings.integrity.model_dump(),
        db=DbLimits.of(inputs.settings.db), stall_after=inputs.settings.run.stall_after,
        retention_days=inputs.settings.run.retention_days,
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
            owed = past.owed_details if spec.detail else 0
            tasks.append(TaskPlan(spec=spec, site_id=store.site_id, config=cfg, windows=windows, horizon=horizon,
                                  owed_details=owed,
                                  estimate=plan_estimate(spec, cfg, windows, past.runs, owed, latency, past.done,
                                                         past.measured),
                                  first_load=past.last is None, recent_windows=recent))
    return LanePlan(
        name=lane.name, token=lane.token, token_source=lane.token_source, api_base=lane.api_base,
        stores=lane.stores, tasks=tuple(tasks), connector=inputs.connector.name, timeout=inputs.api_timeout,
        connect_timeout=inputs.connect_timeout, retry=inputs.retry,
        max_transport_failures=inputs.settings.lane.max_transport_failures,
        max_active_stores=inputs.settings.lane.max_active_stores, request_seconds=latency,
        documented_gaps={name: c.min_gap for name, c in inputs.connector.api.gap_classes.items()},
        floor_margin=lane.settings.lane.safety_margin_seconds,
        store_staleness=stalest_first(lane.stores, tasks),
    )


def stalest_first(stores, tasks) -> dict[int, int]:
    """Per site id its staleness rank, 0 the stalest: by the oldest horizon (the earliest start planned) of its
    windowed tasks — a store never loaded first of all; stores with the same horizon share a rank (issue 30: a store
    that a deadline cut last night is the first one whole tonight, instead of the same stores being cut every
    night)."""
    oldest: dict[int, datetime | None] = {}
    for t in tasks:
        if t.spec.kind != "windowed":
            continue
        horizon = t.horizon if not t.first_load else None
        known = oldest.get(t.site_id, datetime.max)
        oldest[t.site_id] = None if horizon is None or known is None else min(known, horizon)
    key = {s.site_id: oldest.get(s.site_id, datetime.max) or datetime.min for s in stores}
    distinct = sorted(set(key.values()))
    return {site: distinct.index(k) for site, k in key.items()}


def _with_deadline(inputs: PlanInputs, lane: LaneInput, plan: LanePlan, history: PlanHistory,
                   started: datetime) -> LanePlan:
    """A lane with a deadline: its tasks in parts (recent data first), the instant it stops, the narrowest safe
    gap per class (documented minimum plus the margin, or a floor the token learnt) and what fits by then."""
    text = lane.settings.run.deadline
    if text is None:
        return plan
    deadline = Deadline.parse(text)
    at = deadline.at(started, display_zone(lane.settings.display.timezone))  # read in display.timezone (issue 28)
    margins = lane.settings.lane
    documented = {name: c.min_gap for name, c in inputs.connector.api.gap_classes.items()}
    plan = replace(_with_parts(plan, history), deadline=deadline, deadline_at=at,
                   safe_gaps=safe_gaps(documented, share=margins.safety_margin, seconds=margins.safety_margin_seconds,
                                       learnt=history.floors.get(plan.key)))
    return replace(plan, fit=fit_lane(plan, (at - started).total_seconds()))


def _with_rechecks(lane: LanePlan, share: float, history: PlanHistory = EMPTY) -> LanePlan:
    """Give each task with details (not on its first load) its part of ``share`` of the lane's estimated
    requests as a re-check budget: that many details checked longest ago are fetched again.

    A budget is a share, so it rounds **down**: a run never spends more on re-checks than ``share`` of its
    requests (the excess of issue 20: a small store re-checked 3 details every night, one per task, at a
    2 % share of ~100 requests). The fraction left is carried to the task's next run (``recheck.credit`` in its
    run entry), so a small store still re-checks one detail every ``1 / (share × requests)`` runs and a
    corrupted detail is repaired within a bounded number of runs, at exactly the configured share over time.
    The budget's requests are added to the task's estimate.
    """
    detailed = [i for i, t in enumerate(lane.tasks) if t.spec.detail is not None and not t.first_load]
    if share <= 0 or not detailed:
        return lane
    part = share * lane.estimate_requests / len(detailed)
    tasks = list(lane.tasks)
    for i in detailed:
        task = tasks[i]
        last = history.of(task.code, task.site_id).last or {}
        carried = float((last.get("recheck") or {}).get("credit") or 0.0)
        available = part + min(max(carried, 0.0), 1.0)
        budget = math.floor(available + 1e-9)
        e = task.estimate
        per_request = e.seconds / e.requests if e.requests else 0.0
        tasks[i] = replace(task, recheck_budget=budget, recheck_credit=max(0.0, available - budget),
                           estimate=replace(e, detail_requests=e.detail_requests + budget,
                                            seconds=e.seconds + budget * per_request))
    return replace(lane, tasks=tuple(tasks))


def plan_windows(inputs: PlanInputs, spec: OdsTaskSpec, past: TaskHistory,
                 now: datetime) -> tuple[tuple[Window, ...], datetime | None]:
    """Window segments of a task (none for snapshots) and the incremental horizon to record (or None).

    Segments are as long as the API allows (``api.window.max_days``, 31) unless ``window.segment_days`` is
    shorter. The look-back before the high-water mark is the task's own (connector ``lookback_minutes``:
    a short overlap for lists windowed by ``updateTime``), else ``window.lookback_hours`` (upstream-api.md Q13).
    """
    if spec.kind != "windowed":
        return (), None
    ws = inputs.windows
    max_segment = min(ws.segment, timedelta(days=inputs.connector.api.window.max_days))
    if ws.explicit is not None:
        return tuple(split(ws.explicit, max_segment)), None
    lookback = spec.lookback if spec.lookback is not None else ws.lookback
    planned = plan_incremental(now, list(past.done), lookback=lookback, initial=ws.initial, horizon=past.horizon)
    horizon = planned[0].start if planned else None
    return tuple(seg for w in planned for seg in split(w, max_segment)), horizon


def phased_windows(inputs: PlanInputs, spec: OdsTaskSpec, past: TaskHistory,
                   now: datetime) -> tuple[tuple[Window, ...], int, datetime | None]:
    """A windowed task's segments for a lane with a deadline, newest first: the recent ones (the look-back tail, or
    on a first load the part since yesterday 00:00), then the history (older gaps, split back from their newest
    end); how many are recent; the horizon to record. A snapshot has none. The same windows as
    :func:`plan_windows`, in another order (a first load's yesterday its own segment)."""
    if spec.kind != "windowed":
        return (), 0, None
    ws = inputs.windows
    max_segment = min(ws.segment, timedelta(days=inputs.connector.api.window.max_days))
    lookback = spec.lookback if spec.lookback is not None else ws.lookback
    yesterday = datetime.combine(now.date() - timedelta(days=1), time())
    recent, older = recent_and_history(now, list(past.done), lookback=lookback, initial=ws.initial,
                                       horizon=past.horizon, recent_from=yesterday)
    planned = plan_incremental(now, list(past.done), lookback=lookback, initial=ws.initial, horizon=past.horizon)
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
        parts = _parts(task, history.of(task.code, task.site_id), lane.request_seconds)
        total = Estimate(sum(p.estimate.list_requests for p in parts), sum(p.estimate.detail_requests for p in parts),
                         sum(p.estimate.seconds for p in parts), task.estimate.basis,
                         rows=sum(p.estimate.rows for p in parts))
        tasks.append(replace(task, parts=parts, estimate=total))
    return replace(lane, tasks=tuple(tasks))


def _parts(task: TaskPlan, past: TaskHistory, latency: float) -> tuple[TaskPlan, ...]:
    """The recent part (with the task's few re-checks; on a first load the snapshot's details moved to the owed
    part), the owed part (tasks with details owed: by earlier runs, or those the recent part defers; none when
    nothing is owed, so that a store whose recent part is done is done), one history part per older segment —
    each estimated on its own windows (:func:`feiqiu_etl.estimates.plan_estimate`)."""
    spec, cfg = task.spec, task.config

    def estimate(windows: tuple[Window, ...]) -> Estimate:
        return plan_estimate(spec, cfg, windows, past.runs, 0, latency, past.done, past.measured)

    recent_windows, history = task.windows[:task.recent_windows], task.windows[task.recent_windows:]
    recent = estimate(recent_windows)
    deferred = recent.detail_requests if replace(task, phase="recent").defers_details else 0
    per_request = cfg.gap.mean + latency
    details = recent.detail_requests - deferred + task.recheck_budget
    parts = [replace(task, phase="recent", windows=recent_windows, owed_details=0, parts=(),
                     estimate=replace(recent, detail_requests=details,
                                      seconds=(recent.list_requests + details) * per_request))]
    owed = task.owed_details + deferred
    if spec.detail is not None and owed:
        parts.append(replace(task, phase="owed", windows=(), recheck_budget=0, parts=(),
                             estimate=Estimate(0, owed, owed * per_request, recent.basis)))
    for window in history:
        parts.append(replace(task, phase="history", windows=(window,), owed_details=0, recheck_budget=0, parts=(),
                             estimate=estimate((window,))))
    return tuple(parts)


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
