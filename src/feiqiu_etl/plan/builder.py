"""Build a :class:`~feiqiu_etl.plan.model.RunPlan` from validated inputs and the warehouse's history.

Pure: no I/O, no clock except ``inputs.windows.now`` (or the time given). For every lane, store and task it
decides the window segments (explicit, or incremental: resume from the gaps plus a look-back, docs/upstream-
api.md Q13), the horizon to record, the owed details and an estimate of requests and lane seconds.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta

from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.connector.windows import Window, local_now, plan_incremental, split
from feiqiu_etl.db.connection import DbLimits
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.plan.history import EMPTY, PlanHistory, TaskHistory
from feiqiu_etl.plan.inputs import LaneInput, PlanInputs
from feiqiu_etl.plan.model import Estimate, LanePlan, RunPlan, TaskPlan

DEFAULT_REQUEST_SECONDS = 0.1
"""Assumed time a request holds the lane (latency) before any run measured it."""


def build_plan(inputs: PlanInputs, history: PlanHistory = EMPTY, *, now: datetime | None = None) -> RunPlan:
    """The run's plan. ``now`` (naive Asia/Shanghai) defaults to ``inputs.windows.now`` or the current time."""
    now = now or inputs.windows.now or local_now()
    share = inputs.settings.detail.recheck_share
    lanes = tuple(_with_rechecks(_lane(inputs, lane, history, now), share) for lane in inputs.lanes)
    return RunPlan(
        connector=inputs.connector, lanes=lanes, load_ods=inputs.load_ods, dwd=inputs.dwd, now=now,
        incremental=inputs.windows.explicit is None, timeout=inputs.timeout, wait_for_lane=inputs.wait_for_lane,
        unsafe_gaps=inputs.unsafe_gaps, detail_max_attempts=inputs.settings.detail.max_attempts,
        db=DbLimits.of(inputs.settings.db), stall_after=inputs.settings.run.stall_after,
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
            tasks.append(TaskPlan(spec=spec, site_id=store.site_id, config=cfg, windows=windows, horizon=horizon,
                                  owed_details=past.owed_details if spec.detail else 0,
                                  estimate=estimate(spec, cfg, windows, past, latency), first_load=past.last is None))
    return LanePlan(
        name=lane.name, token=lane.token, token_source=lane.token_source, api_base=lane.api_base,
        stores=lane.stores, tasks=tuple(tasks), connector=inputs.connector.name, timeout=inputs.api_timeout,
        connect_timeout=inputs.connect_timeout, retry=inputs.retry,
        max_transport_failures=inputs.settings.lane.max_transport_failures,
        max_active_stores=inputs.settings.lane.max_active_stores,
    )


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
