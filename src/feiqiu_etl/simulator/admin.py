"""The simulator's own endpoints under ``/__sim/``: what tests and benchmarks ask a running simulator, over HTTP.

| endpoint | body | answer (``data`` of the usual envelope unless said) |
|---|---|---|
| ``GET /__sim/log`` | – | the request log: a JSON **array** of entries (``RequestLogEntry.to_json``), no envelope |
| ``GET /__sim/clock`` | – | ``{"now", "anchor", "marks": [...]}``: the simulator's time and the states it keeps |
| ``POST /__sim/advance`` | ``{"hours": N}`` | moves the clock N hours (0 < N ≤ 744) and generates that time's trading and edits (``trading``); ``{"from", "now", "hours", "sites": {site: {task: {inserted, updated, volatile_only, deleted}}}}`` |
| ``POST /__sim/minimum`` | ``{"siteId", "startTime", "endTime", "limit"?}`` | the fewest requests a perfect connector needs for the store over ``[startTime, endTime)`` (``minimum``): ``{"requests", "firstLoad", "tasks": [{task_code, kind, rows, segments, pages, details, volatile_only, requests}]}`` |
| ``GET /__sim/faults`` | – | the pending faults: ``[{"kind", "path", "count", "day", "page"}]`` |
| ``POST /__sim/faults`` | ``{"kind", "path"?, "count"?, "day"?, "page"?}`` or ``{"clear": true}`` | queues a fault for the next ``count`` (default 1) matching requests, as ``Simulator.inject`` (kinds in ``faults``; the data faults ``short_page``, ``total_zero``/``empty_page``, ``total_moves``, ``zero_day`` of issue 25), or drops every pending fault; the pending faults |
| ``POST /__sim/risk`` | any of ``{"enabled", "gap_standard", "gap_groupbuy", "violations_to_ban", "violation_window", "ban_seconds"}`` | risk control from the next request on (e.g. off while a benchmark seeds its first load, on again for the night it measures); the whole new ``RiskControlConfig`` |

The ``POST`` endpoints change or compute data, so they demand the simulator's own token
(``Authorization: Bearer <SimulatorConfig.token>``, else ``40101``); a bad body answers ``40001`` (``40002`` for a bad
range). None of them passes risk control, and none appears in the request log: they are not API traffic.

What it must never do: answer a ``/__sim/`` path that is not listed (404), or print the token.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from feiqiu_etl.simulator.config import RiskControlConfig, SimulatorConfig
from feiqiu_etl.simulator.dataset import MAX_ADVANCE_HOURS, Dataset
from feiqiu_etl.simulator.faults import FaultInjector
from feiqiu_etl.simulator.params import MAX_LIMIT, ApiError, parse_body, parse_site_id
from feiqiu_etl.simulator.requestlog import RequestLog
from feiqiu_etl.simulator.risk import RiskController
from feiqiu_etl.simulator.values import fmt_time, parse_time

PREFIX = "/__sim/"


@dataclass(frozen=True)
class AdminAnswer:
    """What to answer: an envelope ``{code, msg, data}``, or ``raw`` JSON bytes as they are."""

    code: int = 0
    msg: str = "ok"
    data: Any = None
    raw: bytes | None = None


class Admin:
    """Answers the ``/__sim/`` endpoints (module docstring)."""

    def __init__(self, config: SimulatorConfig, dataset: Dataset, log: RequestLog,
                 risk: RiskController | None = None, faults: FaultInjector | None = None) -> None:
        self.config = config
        self.dataset = dataset
        self.log = log
        self.risk = risk
        self.faults = faults

    def handle(self, method: str, path: str, token: str | None, raw: bytes) -> AdminAnswer | None:
        """The answer to ``method path`` with ``raw`` body from a caller holding ``token``; ``None``: no such
        endpoint (404)."""
        route = {("GET", "/__sim/log"): self._log, ("GET", "/__sim/clock"): self._clock,
                 ("POST", "/__sim/advance"): self._advance, ("POST", "/__sim/minimum"): self._minimum,
                 ("POST", "/__sim/risk"): self._risk, ("GET", "/__sim/faults"): self._pending_faults,
                 ("POST", "/__sim/faults"): self._inject}.get((method, path))
        if route is None:
            return None
        if method == "GET":
            return route()
        if token != self.config.token:
            return AdminAnswer(40101, "令牌无效或已过期")
        body, error = parse_body(raw)
        try:
            if body is None:
                raise ApiError(40001, f"参数错误: {error}")
            return AdminAnswer(data=route(body))
        except ApiError as exc:
            return AdminAnswer(exc.code, exc.msg)

    def _log(self) -> AdminAnswer:
        return AdminAnswer(raw=json.dumps([e.to_json() for e in self.log.snapshot()], ensure_ascii=False).encode())

    def _clock(self) -> AdminAnswer:
        return AdminAnswer(data={"now": self.dataset.now(), "anchor": fmt_time(self.dataset.anchor),
                                 "marks": [fmt_time(at) for at in self.dataset.marks()]})

    def _advance(self, body: dict) -> dict:
        hours = body.get("hours")
        if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not 0 < hours <= MAX_ADVANCE_HOURS:
            raise ApiError(40001, f"参数错误: hours must be a number > 0 and <= {MAX_ADVANCE_HOURS}")
        try:
            return self.dataset.advance_trading(hours).to_json()
        except ValueError as exc:
            raise ApiError(40001, f"参数错误: {exc}") from None

    def _pending_faults(self) -> AdminAnswer:
        return AdminAnswer(data=[f.to_json() for f in self.faults.pending()] if self.faults else [])

    def _inject(self, body: dict) -> list:
        if self.faults is None:
            raise ApiError(40001, "参数错误: this simulator injects no faults")
        if body.get("clear") is True and set(body) == {"clear"}:
            self.faults.clear()
            return []
        unknown = sorted(set(body) - {"kind", "path", "count", "day", "page"})
        if unknown:
            raise ApiError(40001, f"参数错误: unknown fault key {unknown[0]!r}")
        path = body.get("path")
        if path is not None and not isinstance(path, str):
            raise ApiError(40001, "参数错误: path must be a string")
        try:
            self.faults.inject(path, str(body.get("kind")), body.get("count", 1), day=body.get("day"),
                               page=body.get("page"))
        except ValueError as exc:
            raise ApiError(40001, f"参数错误: {exc}") from None
        return [f.to_json() for f in self.faults.pending()]

    def _risk(self, body: dict) -> dict:
        if self.risk is None:
            raise ApiError(40001, "参数错误: this simulator has no risk control to change")
        known = {f.name: f.type for f in fields(RiskControlConfig)}
        unknown = sorted(set(body) - set(known))
        if unknown:
            raise ApiError(40001, f"参数错误: unknown risk-control key {unknown[0]!r}")
        for key, value in body.items():
            wanted = bool if key == "enabled" else int if key == "violations_to_ban" else float
            if isinstance(value, bool) != (wanted is bool) or not isinstance(value, (int, float)):
                raise ApiError(40001, f"参数错误: {key} must be a {wanted.__name__}")
        try:
            config = replace(self.risk.config, **body)
        except ValueError as exc:
            raise ApiError(40001, f"参数错误: {exc}") from None
        self.risk.reconfigure(config)
        return asdict(config)

    def _minimum(self, body: dict) -> dict:
        site_id = parse_site_id(body)
        if not self.dataset.has_site(site_id):
            raise ApiError(40001, f"参数错误: unknown siteId {site_id}")
        start, end = parse_time(body.get("startTime")), parse_time(body.get("endTime"))
        if start is None or end is None or end <= start:
            raise ApiError(40002, "时间窗口无效: startTime/endTime missing, malformed or not increasing")
        limit = body.get("limit", MAX_LIMIT)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ApiError(40003, "分页参数超限")
        return self.dataset.minimum_requests(site_id, start, end, limit).to_json()
