"""``TaskExecutor`` (spec §3.5/§3.8): runs one planned task with its own pipeline settings and log.

Each line the task logs reaches stderr the moment it happens (with lane, store and task attached), and a
:class:`TaskLogBuffer` assembles the task's ordered block, which is stored with the run when the task ends
(Property 15). An unexpected error inside a task becomes that task's FAILED result with a one-line error —
never a traceback for the user (``-vv`` logs it at DEBUG).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from feiqiu_etl.logs import TASK_LOGGER, ContextFilter
from feiqiu_etl.pipeline.log_buffer import TaskLogBuffer
from feiqiu_etl.pipeline.models import PipelineResult
from feiqiu_etl.pipeline.request_scheduler import RequestScheduler
from feiqiu_etl.plan.model import TaskPlan
from feiqiu_etl.tasks.ods.task import BaseOdsTask, TaskRun


class TaskExecutor:
    """Runs tasks of one lane (``runtime`` is the lane's :class:`~feiqiu_etl.runner.lane.LaneRuntime`)."""

    def __init__(self, runtime: Any, lane_name: str):
        self.rt = runtime
        self.lane_name = lane_name

    def run(self, task: TaskPlan, lane: RequestScheduler, transport: Callable, *,
            observer: Callable | None = None, on_estimate: Callable | None = None) -> TaskRun:
        """Run ``task``. ``observer(pipeline | None)`` as in :class:`BaseOdsTask`; ``on_estimate(fn | None)``
        receives the task's ``live_estimate`` while it runs (the live ETA's requests), None when it ended."""
        code, site = task.code, task.site_id
        logger = logging.getLogger(f"{TASK_LOGGER}.{self.lane_name}.{site}.{code}")
        logger.setLevel(logging.DEBUG if logging.getLogger().level <= logging.DEBUG else logging.INFO)
        context = ContextFilter(lane=self.lane_name, site_id=site, task=code)
        logger.addFilter(context)
        buffer = TaskLogBuffer(code, logger)
        handler = buffer.handler()
        logger.addHandler(handler)
        try:
            ods = BaseOdsTask(
                task, transport=transport, lane=lane, dsn=self.rt.dsn, run_id=self.rt.run_id,
                cancel_token=self.rt.token, logger=logger, conventions=self.rt.conventions, observer=observer,
                tenant=site, abortable=self.rt.abortable, detail_max_attempts=self.rt.detail_max_attempts,
                lane_name=self.lane_name, connect=self.rt.connect, health=self.rt.health,
            )
            if on_estimate is not None:
                on_estimate(ods.live_estimate)
            try:
                run = ods.execute()
            except Exception as exc:  # noqa: BLE001 - one task's crash is that task's failure
                logger.error("task failed: %s", _one_line(exc))
                logger.debug("task traceback", exc_info=True)
                run = self._crashed(task, exc)
            r = run.result
            logger.info("done: %s requests=%d (attempts %d) fetched=%d (details %d) inserted=%d updated=%d "
                        "skipped=%d deleted=%d rate_limited=%d errors=%d", r.status, r.total_requests, r.attempts,
                        r.total_fetched, r.detail_fetched, r.total_inserted, r.total_updated, r.total_skipped,
                        r.total_deleted, r.rate_limited, len(r.errors))
            return run
        finally:
            if on_estimate is not None:
                on_estimate(None)
            logger.removeHandler(handler)
            logger.removeFilter(context)
            block = buffer.flush(emit=False)
            self.rt.store_log(block, self.lane_name, site, code)

    def _crashed(self, task: TaskPlan, exc: BaseException) -> TaskRun:
        spec = task.spec
        result = PipelineResult(status="FAILED")
        result.processing_failures = 1
        result.errors.append({"stage": "task", "error": _one_line(exc)})
        run = TaskRun(spec.code, task.site_id, spec.table, spec.detail.target_table if spec.detail else None, result,
                      lane=self.lane_name, first_load=task.first_load)
        return run


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__
