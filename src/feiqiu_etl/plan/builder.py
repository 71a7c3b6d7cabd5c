"""Build a :class:`~feiqiu_etl.plan.model.RunPlan` from validated inputs and the warehouse's history.

Pure: no I/O, no clock except ``inputs.windows.now`` (or the time given). For every lane, store and task it
decides the window segments (explicit, or incremental: resume from the holes plus the task's look-back,
docs/upstream-api.md Q13), the horizon to record, the owed details, the re-check budget and an estimate of
requests and lane seconds (:mod:`.estimates`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta

from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.connector.windows import Window, local_now, plan_incremental, split
from feiqiu_etl.db.connection import DbLimits
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.estimates import plan_estimate
from feiqiu_etl.plan.history import EMPTY, PlanHistory, TaskHistory
from feiqiu_etl.plan.inputs import LaneInput, PlanInputs
from feiqiu_etl.plan.model import LanePlan, RunPlan, TaskPlan

DEFAULT_REQUEST_SECONDS = 0.1
"""Assumed time a request holds the lane (latency) before any run measured it."""


def build_plan(inputs: PlanInputs, history: PlanHistory = EMPTY, *, now: datetime | None = None) -> RunPlan:
    """The run's plan. ``now`` (naive Asia/Shanghai) defaults to ``inputs.windows.now`` or the current time."""
    now = now or inputs.windows.now or local_now()
    share = inputs.settings.detail.recheck_share
    lanes = tuple(_with_rechecks(_lane(inputs, lane, history, now), share, history) for lane in inputs.lanes)
    return RunPlan(
        connector=inputs.connector, lanes=lanes, load_ods=inputs.load_ods, dwd=inputs.dwd, now=now,
        incremental=inputs.windows.explicit is None, timeout=inputs.timeout, wait_for_lane=inputs.wait_for_lane,
        unsafe_gaps=inputs.unsafe_gaps, detail_max_attempts=inputs.settings.detail.max_attempts,
        db=DbLimits.of(inputs.settings.db), stall_after=inputs.settings.run.stall_after,
        retention_days=inputs.settings.run.retention_days,
        settings=settings_snapshot(inputs),
    )


def _lane(inputs: PlanInputs, lane: LaneInput, history: PlanHistory, now: datetime) -> LanePlan:
    latency = history.request_seconds if history.request_seconds is not None else DEFAULT_REQUEST_SECONDS
    tasks = []
    for store in lane.stores:
        for spec in lane.specs:
            past = history.of(spec.code, store.site_id)
            windows, horizon = plan_windows(inputs, spec, past, now)
            cfg = lane.configs[spec.code]
            owed = past.owed_details if spec.detail else 0
            tasks.append(TaskPlan(spec=spec, site_id=store.site_id, config=cfg, windows=windows, horizon=horizon,
                                  owed_details=owed,
                                  estimate=plan_estimate(spec, cfg, windows, past.runs, owed, latency, past.done),
                                  first_load=past.last is None))
    return LanePlan(
        name=lane.name, token=lane.token, token_source=lane.token_source, api_base=lane.api_base,
        stores=lane.stores, tasks=tuple(tasks), connector=inputs.connector.name, timeout=inputs.api_timeout,
        connect_timeout=inputs.connect_timeout, retry=inputs.retry,
        max_transport_failures=inputs.settings.lane.max_transport_failures,
        max_active_stores=inputs.settings.lane.max_active_stores,
    )


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
