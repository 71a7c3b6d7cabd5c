"""``TaskExecutor`` (spec §3.5/§3.8): runs one planned task with its own pipeline settings and log.

Each line the task logs reaches stderr the moment it happens (with lane, store and task attached), and a
:class:`TaskLogBuffer` assembles the task's ordered block, which is stored with the run when the task ends
(Property 15). An unexpected error inside a task becomes that task's FAILED result with a one-line error —
never a traceback for the user (``-vv`` logs it at DEBUG).
"""

from __future__ import annotations

import logging
from typing import Callable

from feiqiu_etl.errortext import one_line
from feiqiu_etl.logs import TASK_LOGGER, ContextFilter
from feiqiu_etl.pipeline.log_buffer import TaskLogBuffer
from feiqiu_etl.pipeline.models import PipelineResult
from feiqiu_etl.plan.model import TaskPlan
from feiqiu_etl.tasks.ods.task import BaseOdsTask, LaneAccess, TaskContext, TaskRun
from feiqiu_etl.common.status import Status


StoreLog = Callable[[list, str, int, str], None]
"""``store_log(block, lane, site_id, task)``: keep a finished task's ordered log block with the run."""


class TaskExecutor:
    """Runs the tasks of one lane within the run's :class:`TaskContext`; each task's log block goes to
    ``store_log``."""

    def __init__(self, context: TaskContext, lane_name: str, store_log: StoreLog):
        self.context = context
        self.lane_name = lane_name
        self.store_log = store_log

    def run(self, task: TaskPlan, lane: LaneAccess, *,
            observer: Callable[[BaseOdsTask], None] | None = None) -> TaskRun:
        """Run ``task`` on ``lane``; ``observer`` is handed the task before it starts (to read its
        :meth:`~BaseOdsTask.statistics` while it runs)."""
        code, site = task.code, task.site_id
        logger = logging.getLogger(f"{TASK_LOGGER}.{self.lane_name}.{site}.{code}")
        logger.setLevel(logging.DEBUG if logging.getLogger().level <= logging.DEBUG else logging.INFO)
        context = ContextFilter(lane=self.lane_name, site_id=site, task=code)
        logger.addFilter(context)
        buffer = TaskLogBuffer(code, logger)
        handler = buffer.handler()
        logger.addHandler(handler)
        try:
            ods = BaseOdsTask(task, lane, self.context, logger)
            if observer is not None:
                observer(ods)
            try:
                run = ods.execute()
            except Exception as exc:  # noqa: BLE001 - one task's crash is that task's failure
                logger.error("task failed: %s", one_line(exc))
                logger.debug("task traceback", exc_info=True)
                run = self._crashed(task, exc)
            r = run.result
            logger.info("done: %s requests=%d (attempts %d) fetched=%d (details %d) inserted=%d updated=%d "
                        "skipped=%d failed=%d not_written=%d deleted=%d details=%d/%d/%d of %d asked "
                        "rate_limited=%d errors=%d", r.status, r.total_requests, r.attempts, r.total_fetched,
                        r.detail_fetched, r.total_inserted, r.total_updated, r.total_skipped, r.rows_failed,
                        r.rows_not_written, r.total_deleted, r.detail_success, r.detail_failure, r.detail_skipped,
                        r.detail_asked, r.rate_limited, len(r.errors))
            return run
        finally:
            logger.removeHandler(handler)
            logger.removeFilter(context)
            block = buffer.flush(emit=False)
            self.store_log(block, self.lane_name, site, code)

    def _crashed(self, task: TaskPlan, exc: BaseException) -> TaskRun:
        spec = task.spec
        result = PipelineResult(status=Status.FAILED)
        result.processing_failures = 1
        result.errors.append({"stage": "task", "error": one_line(exc)})
        run = TaskRun(spec.code, task.site_id, spec.table, spec.detail.target_table if spec.detail else None, result,
                      lane=self.lane_name, first_load=task.first_load)
        return run
