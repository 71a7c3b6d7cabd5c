"""``feiqiu-etl check``: the first contact with an upstream, bounded in time and requests (issue 27).

For every lane (token) and store of the configuration it sends **one request per list endpoint**: page 1 at the
connector's ``page_size`` (200, upstream-api.md §1.3), for a windowed list over the window a first load would
start with (the last ``window.initial_days``, at most ``api.window.max_days``). Every request goes through the
lane as a run's would: the lane's cross-process guard (:class:`~feiqiu_etl.registry.lane_guard.LaneGuard`; a
lane held by a run is not touched), one :class:`~feiqiu_etl.pipeline.request_scheduler.RequestScheduler` per token
at each task's configured gap, its class floor and the retry policy (at most :data:`MAX_ATTEMPTS` attempts). So
``N requests × the gap`` is known before it starts (:func:`planned`) and said first.

What it tells per token and store: whether the token authenticates (the first answer that is not 40101), whether
each store is granted (40103 refuses it), and per task the envelope (``code``, the list under ``data_path`` /
``list_key``, an integer ``total``), the page's fields against the connector's declaration (``fields``:
missing, new, of another type, each with the count of records), the latency and the gap waited (with its class).
Each task's page-1 ``total`` is the store's **measured size** (``etl_meta.store_size``,
:mod:`feiqiu_etl.registry.sizes`): a plan without history uses it instead of the contract's lower bound.

A token refused, a store not granted or an upstream not reached is what a run would meet: the check says it in
one line and ends with its own exit code (:data:`feiqiu_etl.common.exitcodes.CHECK_TOKEN` …). A lane stops at its first
40101 or unreachable attempt (nothing else of it can answer); a store stops at its 40103.
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

from feiqiu_etl.common import exitcodes
from feiqiu_etl.api.client import APIClient, EnvelopeRules, RetryPolicy
from feiqiu_etl.api.errors import ApiError, AuthError, SiteForbiddenError, TransportFailure
from feiqiu_etl.connector.spec import OdsTaskSpec, json_type
from feiqiu_etl.connector.windows import Window, fmt, local_now
from feiqiu_etl.errortext import one_line
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.errors import Cancelled, LaneTripped
from feiqiu_etl.pipeline.models import PipelineRequest
from feiqiu_etl.pipeline.rate_limiter import RateLimiter
from feiqiu_etl.pipeline.request_scheduler import AttemptRecord, RequestScheduler

log = logging.getLogger("feiqiu_etl.check")

MAX_ATTEMPTS = 2
"""Attempts per check request at most (a 5xx or a throttle is retried once, paced by the lane)."""
BOUND_GRACE = 10.0
"""Seconds a check may take beyond its requests' widest gaps and one timeout per lane before it is cancelled."""


@dataclass
class FieldReport:
    """The page's records against the connector's declared fields (upstream-api.md §3): ``missing`` ``{field:
    records without it}``, ``new`` ``{field: records with it}`` (not declared), ``other_type`` ``{field: {JSON type:
    records}}`` (a type the declaration does not allow; null is always allowed)."""

    missing: dict[str, int] = field(default_factory=dict)
    new: dict[str, int] = field(default_factory=dict)
    other_type: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not (self.missing or self.new or self.other_type)

    def to_dict(self) -> dict:
        return {"missing": self.missing, "new": self.new, "other_type": self.other_type}


def compare_fields(records: list, declared: dict[str, tuple[str, ...]]) -> FieldReport:
    """:class:`FieldReport` of ``records`` (dicts; others are skipped) against ``declared`` (``{field: JSON
    types}``; ``number`` admits an integer). An empty declaration reports nothing."""
    out = FieldReport()
    if not declared:
        return out
    for record in records:
        if not isinstance(record, dict):
            continue
        for name in declared:
            if name not in record:
                out.missing[name] = out.missing.get(name, 0) + 1
        for name, value in record.items():
            if name not in declared:
                out.new[name] = out.new.get(name, 0) + 1
                continue
            kind = json_type(value)
            allowed = declared[name]
            if kind is None or kind in allowed or (kind == "integer" and "number" in allowed):
                continue
            seen = out.other_type.setdefault(name, {})
            seen[kind] = seen.get(kind, 0) + 1
    return out


@dataclass
class TaskCheck:
    """One list endpoint of one store: ``outcome`` ``ok`` (answered, envelope valid), ``invalid`` (answered, the
    envelope is not what the connector says), ``refused`` (40101/40103), ``error`` (any other failure),
    ``not run`` (its lane or store stopped before it). ``total`` is page 1's total; ``latency`` the seconds
    the answer took, ``gap`` the seconds waited before it (None for a lane's first request)."""

    task: str
    endpoint: str
    gap_class: str
    outcome: str = "not run"
    total: int | None = None
    records: int = 0
    window: tuple[str, str] | None = None
    latency: float | None = None
    gap: float | None = None
    attempts: int = 0
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    fields: FieldReport = field(default_factory=FieldReport)

    def to_dict(self) -> dict:
        return {"task": self.task, "endpoint": self.endpoint, "gap_class": self.gap_class, "outcome": self.outcome,
                "total": self.total, "records": self.records, "window": list(self.window) if self.window else None,
                "latency_s": None if self.latency is None else round(self.latency, 4),
                "gap_s": None if self.gap is None else round(self.gap, 4), "attempts": self.attempts,
                "error": self.error, "problems": self.problems, "fields": self.fields.to_dict()}


@dataclass
class StoreCheck:
    site_id: int
    name: str | None
    granted: bool | None = None
    tasks: list[TaskCheck] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"site_id": self.site_id, "name": self.name, "granted": self.granted,
                "tasks": [t.to_dict() for t in self.tasks]}


@dataclass
class LaneCheck:
    """One token: ``authenticated`` (None: nothing answered), ``reachable`` (False: no attempt reached a
    server), ``busy`` (another run holds its lane: nothing sent), its stores, requests sent, 42901/42902 seen."""

    name: str
    key: str
    token_source: str
    api_base: str
    authenticated: bool | None = None
    reachable: bool | None = None
    busy: str | None = None
    reason: str | None = None
    stores: list[StoreCheck] = field(default_factory=list)
    requests_sent: int = 0
    throttled: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"lane": self.name, "key": self.key, "token_source": self.token_source, "api_base": self.api_base,
                "authenticated": self.authenticated, "reachable": self.reachable, "busy": self.busy,
                "reason": self.reason, "requests_sent": self.requests_sent, "throttled": self.throttled,
                "seconds": round(self.seconds, 3), "stores": [s.to_dict() for s in self.stores]}


@dataclass
class CheckResult:
    """The whole check: its lanes, what was planned (``requests``, ``seconds`` at the mean gaps), the exit code
    and, on a failure, the one line that says it (:meth:`verdict`)."""

    lanes: list[LaneCheck]
    requests: int
    seconds: float
    bound: float
    started: float = 0.0
    finished: float = 0.0
    sizes_recorded: int = 0
    cancelled: str | None = None

    def verdict(self) -> tuple[int, str | None]:
        """``(exit code, one line)``: the first of an unreachable upstream (12), a refused token (10), a store
        not granted (11), a lane busy (6), another failed request (4), a cancel or the time bound (5); else
        ``(0, None)``."""
        for lane in self.lanes:
            if lane.reachable is False:
                return exitcodes.CHECK_UNREACHABLE, (f"lane {lane.name}: cannot reach the API at {lane.api_base}: "
                                                     f"{lane.reason}")
        for lane in self.lanes:
            if lane.authenticated is False:
                return exitcodes.CHECK_TOKEN, (f"lane {lane.name}: the token ({lane.token_source}) was refused: "
                                               f"{lane.reason}")
        for lane in self.lanes:
            refused = [s.site_id for s in lane.stores if s.granted is False]
            if refused:
                return exitcodes.CHECK_STORE, (f"lane {lane.name}: store(s) {', '.join(map(str, refused))} not "
                                               f"granted to the token ({lane.token_source}) (40103)")
        for lane in self.lanes:
            if lane.busy:
                return exitcodes.LANE_BUSY, f"lane {lane.name}: {lane.busy}; nothing was sent (try again later)"
        if self.cancelled:
            return exitcodes.CANCELLED, f"check stopped: {self.cancelled}"
        for lane in self.lanes:
            for store in lane.stores:
                bad = [t for t in store.tasks if t.outcome in ("error", "invalid")]
                if bad:
                    t = bad[0]
                    return exitcodes.FAILED, (f"lane {lane.name}, store {store.site_id}: {len(bad)} endpoint(s) "
                                              f"failed, first {t.task} ({t.endpoint}): {t.error or '; '.join(t.problems)}")
        return exitcodes.SUCCESS, None

    def to_dict(self) -> dict:
        code, line = self.verdict()
        return {"command": "check", "exit_code": code, "error": line, "planned_requests": self.requests,
                "planned_seconds": round(self.seconds, 1), "bound_seconds": round(self.bound, 1),
                "seconds": round(self.finished - self.started, 3), "sizes_recorded": self.sizes_recorded,
                "lanes": [lane.to_dict() for lane in self.lanes]}


def check_window(inputs, spec: OdsTaskSpec) -> Window | None:
    """The window page 1 of a windowed task is asked for: the last ``window.initial_days`` (what a first load
    starts with, :func:`feiqiu_etl.plan.builder.plan_windows`), at most ``api.window.max_days``, ending now
    (``--now``, else the current Asia/Shanghai time). None for a snapshot."""
    if spec.kind != "windowed":
        return None
    now = (inputs.windows.now or local_now()).replace(microsecond=0)
    span = min(inputs.windows.initial, timedelta(days=inputs.connector.api.window.max_days))
    return Window(now - span, now)


def planned(inputs) -> tuple[int, float, float]:
    """``(requests, seconds, bound)`` of a check of ``inputs``: one request per task and store; seconds at each
    task's mean gap for the slowest lane (lanes run at once); the bound: the widest gaps, the lane's retries
    and one API timeout per lane, plus :data:`BOUND_GRACE`."""
    requests, slowest, widest = 0, 0.0, 0.0
    for lane in inputs.lanes:
        n = len(lane.stores) * len(lane.specs)
        requests += n
        mean = sum(lane.configs[s.code].gap.mean for s in lane.specs) * len(lane.stores)
        high = sum(lane.configs[s.code].gap.max for s in lane.specs) * len(lane.stores)
        slowest, widest = max(slowest, mean), max(widest, high)
    bound = widest + MAX_ATTEMPTS * inputs.api_timeout + inputs.settings.api.retry_backoff + BOUND_GRACE
    return requests, slowest, bound


def _envelope(payload: Any, spec: OdsTaskSpec) -> tuple[int | None, list, list[str]]:
    """``(total, records, problems)`` of a list answer: the list under ``data_path``/``list_key``, an integer
    ``total`` (upstream-api.md §1.3-§1.4)."""
    problems: list[str] = []
    node: Any = payload
    for step in spec.data_path:
        node = node.get(step) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        return None, [], [f"no object at {'.'.join(spec.data_path)}"]
    records = node.get(spec.list_key)
    if not isinstance(records, list):
        problems.append(f"no list at {'.'.join(spec.data_path)}.{spec.list_key}")
        records = []
    total = node.get("total")
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        problems.append(f"total is not a non-negative integer: {str(total)[:40]!r}")
        total = None
    elif total < len(records):
        problems.append(f"total {total} is less than the {len(records)} records of page 1")
    if len(records) > spec.page_size:
        problems.append(f"page 1 has {len(records)} records, more than the limit {spec.page_size}")
    return total, records, problems


class _LaneCheckRunner:
    """One lane of a check (see the module docstring)."""

    def __init__(self, inputs, lane, cancellation: CancellationToken, client_factory: Callable[..., APIClient],
                 progress: Callable[[str, int, TaskCheck], None] | None = None):
        from feiqiu_etl.textsafe import redact_url

        self.inputs, self.lane, self.cancellation, self.progress = inputs, lane, cancellation, progress
        key = f"{inputs.connector.name}:{lane.token.fingerprint()}"
        self.result = LaneCheck(lane.name, key, lane.token_source, redact_url(lane.api_base),
                                stores=[StoreCheck(s.site_id, s.name) for s in lane.stores])
        self._last: AttemptRecord | None = None
        self._attempts = 0
        policy = inputs.retry
        self.scheduler = RequestScheduler(name=lane.name, max_transport_failures=1, observer=self._observe,
                                          logger=logging.getLogger(f"feiqiu_etl.lane.{lane.name}"))
        self.client = client_factory(lane.api_base, lane.token.value, timeout=inputs.api_timeout,
                                     retry=RetryPolicy(attempts=min(MAX_ATTEMPTS, policy.attempts), base=policy.base),
                                     rules=_rules(inputs.connector),
                                     connect_timeout=inputs.connect_timeout)
        self.limiters = {s.code: RateLimiter(gap=lane.configs[s.code].gap) for s in lane.specs}

    def _observe(self, record: AttemptRecord) -> None:
        self._last = record
        self._attempts += 1

    def run(self) -> LaneCheck:
        t0 = time.monotonic()
        try:
            for store in self.result.stores:
                for spec in self.lane.specs:
                    task = TaskCheck(spec.code, spec.endpoint, spec.gap_class)
                    store.tasks.append(task)
                    self._task(store, spec, task)
                    if self.progress is not None:
                        self.progress(self.lane.name, store.site_id, task)
        finally:
            self.client.close()
            s = self.scheduler.statistics()
            self.result.requests_sent, self.result.throttled = s.requests_sent, s.throttled
            self.result.seconds = time.monotonic() - t0
        return self.result

    def _task(self, store: StoreCheck, spec: OdsTaskSpec, task: TaskCheck) -> None:
        """Check one endpoint of one store, or say why it is not sent (the lane or the store stopped before it)."""
        if self.result.reason and (self.result.authenticated is False or self.result.reachable is False):
            task.error = self.result.reason
        elif store.granted is False:
            task.error = "store not granted (40103)"
        elif self.cancellation.is_cancelled:
            task.error = f"cancelled ({self.cancellation.reason})"
        else:
            self._one(store, spec, task)

    def _one(self, store: StoreCheck, spec: OdsTaskSpec, task: TaskCheck) -> None:
        api = self.inputs.connector.api
        params = {api.site_param: store.site_id, api.pagination.page_param: api.pagination.first_page,
                  api.pagination.limit_param: spec.page_size}
        window = check_window(self.inputs, spec)
        if window is not None:
            params[api.window.start_param], params[api.window.end_param] = fmt(window.start), fmt(window.end)
            task.window = (fmt(window.start), fmt(window.end))
        request = PipelineRequest(endpoint=spec.endpoint, params=params, page_size=spec.page_size,
                                  data_path=spec.data_path, list_key=spec.list_key, gap_class=spec.gap_class)
        limiter, label = self.limiters[spec.code], f"{spec.endpoint} page 1"
        gaps: list[float] = []

        def send(fn, min_wait: float = 0.0):
            try:
                return self.scheduler.send(fn, limiter, self.cancellation.event, min_wait=min_wait,
                                           gap_class=spec.gap_class, tenant=store.site_id, label=label,
                                           abortable=True)
            finally:
                if self._last is not None and self._last.gap is not None:
                    gaps.append(self._last.gap)

        before = self._attempts
        try:
            payload = self.client.fetch(request, send)
        except AuthError as exc:
            task.outcome, task.error = "refused", one_line(exc, 200)
            self.result.authenticated, self.result.reachable = False, True
            self.result.reason = "invalid or expired token (40101)"
            self.scheduler.trip(self.result.reason)
        except SiteForbiddenError as exc:
            task.outcome, task.error = "refused", one_line(exc, 200)
            store.granted, self.result.authenticated, self.result.reachable = False, True, True
        except TransportFailure as exc:
            task.outcome, task.error = "error", one_line(exc, 200)
            if exc.transport_failure and self.result.reachable is None:
                self.result.reachable, self.result.reason = False, one_line(exc, 200)
        except LaneTripped as exc:
            task.outcome, task.error = "error", one_line(exc, 200)
            if self.result.reachable is None:
                self.result.reachable, self.result.reason = False, one_line(exc, 200)
        except Cancelled:
            task.outcome, task.error = "not run", f"cancelled ({self.cancellation.reason})"
        except ApiError as exc:
            task.outcome, task.error = "error", one_line(exc, 200)
            self.result.reachable = True
            if getattr(exc, "code", None) is not None:  # a business answer: the token got past authentication
                self.result.authenticated = True
        else:
            self.result.reachable = self.result.authenticated = True
            store.granted = True
            task.total, records, task.problems = _envelope(payload, spec)
            task.records = len(records)
            task.fields = compare_fields(records, dict(spec.fields))
            task.outcome = "invalid" if task.problems else "ok"
        finally:
            task.attempts = self._attempts - before
            if self._last is not None and task.attempts:
                task.latency = self._last.ended - self._last.started
            task.gap = gaps[0] if gaps else None


def _rules(connector) -> EnvelopeRules:
    """The connector's envelope rules, as a run builds them."""
    from feiqiu_etl.runner.flow_runner import envelope_rules

    return envelope_rules(connector)


def run_check(inputs, dsn: str, *, connect, cancellation: CancellationToken | None = None,
              wait_for_lane: float | None = None, client_factory: Callable[..., APIClient] = APIClient,
              announce: Callable[[int, float, float], None] | None = None,
              progress: Callable[[str, int, TaskCheck], None] | None = None) -> CheckResult:
    """Check every lane of ``inputs`` (at once, each strictly serial) against the upstream, record the measured
    sizes in the warehouse at ``dsn`` and return the :class:`CheckResult`. ``announce(requests, seconds,
    bound)`` is told the plan before the first request; ``progress(lane name, site id, task)`` each endpoint as it
    is answered (from the lane's thread: lanes run at once). A lane another process holds is not touched
    (``busy``)."""
    from feiqiu_etl.registry.lane_guard import LaneBusy, LaneGuard
    from feiqiu_etl.registry.sizes import record_sizes

    requests, seconds, bound = planned(inputs)
    if announce is not None:
        announce(requests, seconds, bound)
    result = CheckResult([], requests, seconds, bound, started=time.monotonic())
    parent = cancellation or CancellationToken()
    cancellation = parent.child()  # the caller's cancel (a signal), and the check's own time bound
    cancellation.cancel_after(bound, f"not done within its bound of {bound:.0f} s")
    guard = LaneGuard(dsn, f"check-{uuid.uuid4().hex[:12]}", connect=connect)
    try:
        runners = [_LaneCheckRunner(inputs, lane, cancellation, client_factory, progress) for lane in inputs.lanes]
        outcome = guard.acquire_all([(r.lane.name, r.result.key) for r in runners], wait=wait_for_lane,
                                    cancel_event=cancellation.event)
        active = []
        for r in runners:
            refused = outcome.get(r.lane.name)
            if isinstance(refused, LaneBusy):
                r.result.busy = one_line(refused, 300)
                r.client.close()
            elif refused is not None:
                r.result.busy = f"lane not taken: {one_line(refused, 200)}"
                r.client.close()
            else:
                active.append(r)
        with ThreadPoolExecutor(max_workers=max(1, len(active)), thread_name_prefix="check-lane") as pool:
            list(pool.map(lambda r: r.run(), active))
        result.lanes = [r.result for r in runners]
        if cancellation.is_cancelled:
            result.cancelled = cancellation.reason
    finally:
        guard.release()
        cancellation.dispose()
    conn = connect(dsn)
    try:
        result.sizes_recorded = record_sizes(conn, inputs.connector.name, result.lanes)
    finally:
        conn.close()
    result.finished = time.monotonic()
    return result
