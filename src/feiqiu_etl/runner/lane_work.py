"""What is left of a lane's work while it runs (:class:`~feiqiu_etl.runner.lane.LaneRunner` reads it for its ETA,
its pace and the order of its stores): every part of every open store not finished yet, the running one by what
its pages said it still needs, a part planned from the contract alone scaled by what its store's first pages
told. Pure: it reads the tasks' statistics snapshots, sends nothing and writes nothing."""

from __future__ import annotations

from typing import Any, Mapping

from feiqiu_etl.common.status import Status
from feiqiu_etl.plan.fit import Work
from feiqiu_etl.plan.model import TaskPlan
from feiqiu_etl.statistics import TaskStatistics


def _running(cur: Any) -> TaskStatistics | None:
    """The running task's statistics once it has started (None before, or without one)."""
    st = cur.statistics() if cur is not None else None
    return st if st is not None and st.state != "starting" else None


def remaining_work(states: list, safe_gaps: Mapping[str, float]) -> list[Work]:
    """The work left of ``states`` (the lane's ``(store, running task, finished runs, closed)``), one
    :class:`~feiqiu_etl.plan.fit.Work` per part not finished, with its gap and its class's safe floor
    (``safe_gaps``, s)."""
    work: list[Work] = []
    for store, cur, finished, closed in states:
        if closed:
            continue
        running = _running(cur)
        scale = contract_scale(store.schedule, finished, cur.task if cur is not None else None, running)
        for phase, task in store.schedule[len(finished):]:
            if running is not None and task is cur.task:
                left = running.requests_remaining
            elif task.estimate.basis == "contract" and scale is not None:
                left = max(least_requests(task), round(task.estimate.requests * scale))
            else:
                left = task.estimate.requests
            work.append(Work(task.site_id, task.code, phase, left, task.config.gap, safe_gaps.get(task.spec.gap_class)))
    return work


def unsized(states: list) -> list[int]:
    """Site ids of the open stores planned from the contract alone (``basis`` ``contract``) that have not told
    their size yet: none of their contract-planned lists finished or showed its first page."""
    out = []
    for store, cur, finished, closed in states:
        if closed or not any(t.estimate.basis == "contract" for _, t in store.schedule[len(finished):]):
            continue
        if contract_scale(store.schedule, finished, cur.task if cur is not None else None, _running(cur)) is None:
            out.append(store.plan.site_id)
    return out


def contract_scale(schedule: tuple[tuple[str, TaskPlan], ...], finished: list[TaskRun], current: TaskPlan | None,
                    running: TaskStatistics | None) -> float | None:
    """How this store compares with the contract's documented volumes: the requests its tasks planned from the
    contract (``basis`` ``contract``: no history) really needed — those finished, and the one running once its
    first pages told (``requests`` + ``requests_remaining``) — over what the plan expected of them. None before
    one of them ran. The live ETA scales the contract estimates of the store's tasks not started yet by it (a
    store is smaller or bigger than the contract's lower bound in all its lists alike, more or less)."""
    planned = needed = 0
    for (_, task), run in zip(schedule, finished):
        if task.estimate.basis == "contract" and run.skipped is None \
                and run.status in (Status.SUCCESS, Status.PARTIAL):
            planned += task.estimate.requests
            needed += run.result.total_requests
    if current is not None and running is not None and current.estimate.basis == "contract" and running.requests:
        planned += current.estimate.requests
        needed += running.requests + running.requests_remaining
    return needed / planned if planned > 0 else None


def least_requests(task: TaskPlan) -> int:
    """A part that lists sends at least one page per window (or its snapshot's one); an owed part may send none."""
    if task.phase == "owed":
        return 0
    return max(1, len(task.windows)) if task.spec.kind == "windowed" else 1
