"""The run registry: every run's record in ``etl_meta.run`` and its stored log in ``etl_meta.run_log``.

A run is recorded when it starts (command, redacted arguments, configuration snapshot, host, pid, version),
publishes a heartbeat and a live status snapshot about once a second while it runs, and is finished with
its status, exit code, per-lane/store/task results and one-line error. Another process — ``runs``,
``show``, ``status``, ``cancel``, the web page — reads the same rows. Nothing stays ``RUNNING`` forever:
:func:`sweep_interrupted` (called by every command that opens the database) turns a run whose process is
gone (same host, pid dead) or whose heartbeat is stale into ``INTERRUPTED``.

Cancel from another process: :func:`request_cancel` sets a durable flag and sends ``NOTIFY`` on
:data:`CANCEL_CHANNEL`; the running process listens (:mod:`.control`) and also sees the flag with its next
heartbeat if it missed the notification. Every function takes an open psycopg connection and commits.
Values are parameters; no identifier comes from outside.

This face only re-exports: writing a record is :mod:`.runs`, reading records back (frozen :class:`RunRecord`,
:class:`RunDetail`, :class:`LiveRun`) is :mod:`.records`. The registry imports nothing above it (no alerts: the
alerts about a run are added by :mod:`feiqiu_etl.app.reads`).
"""

from feiqiu_etl.registry.records import (RUN_ID_CHARACTERS, LiveRun, RunDetail, RunRecord, count_runs, get_run,
                                         jsonable, last_loaded, list_runs, matching_runs, redact_args,
                                         resolve_run_id, run_id_problem, run_requests, running)
from feiqiu_etl.registry.runs import (CANCEL_CHANNEL, HOST, REQUEST_COLUMNS, Invocation, append_log, append_requests,
                                      cancel_request, finish_run, heartbeat, new_run_id, os_user, process_started,
                                      request_cancel, start_run, sweep_interrupted)

__all__ = ["CANCEL_CHANNEL", "HOST", "REQUEST_COLUMNS", "RUN_ID_CHARACTERS", "Invocation", "LiveRun", "RunDetail",
           "RunRecord", "append_log", "append_requests", "cancel_request", "count_runs", "finish_run", "get_run",
           "heartbeat", "jsonable", "last_loaded", "list_runs", "matching_runs", "new_run_id", "os_user",
           "process_started", "redact_args", "request_cancel", "resolve_run_id", "run_id_problem", "run_requests",
           "running", "start_run", "sweep_interrupted"]
