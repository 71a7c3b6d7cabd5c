"""The simulated Feiqiu service behind the HTTP server: routing, authentication, risk control, faults, validation,
pagination and JSON rendering (upstream-api.md §1–§5).

Order of checks for a request to an API path, which decides what it costs the caller:

1. gateway fault ``http429`` (never reaches the service);
2. ``Authorization: Bearer <token>`` → ``40101``; a well-formed ``siteId`` the token may not read → ``40103``
   (neither touches risk control);
3. risk control (§2.2) → ``42901``/``42902``;
4. the request is now *accepted*: injected service faults, ``processing_delay``, then validation (40001, 40002,
   40003), the lookup (40401) and the answer. Its completion (after the server wrote the response) starts the
   next gap.

Paths under ``/__sim/`` are the simulator's own (``admin``): no risk control, no faults.

What it must never do: write to sockets (the server does), log tokens, or answer ``null`` where a list belongs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from feiqiu_etl.simulator.admin import PREFIX as ADMIN_PREFIX
from feiqiu_etl.simulator.admin import Admin
from feiqiu_etl.simulator.catalog import (
    DETAIL_BY_PATH,
    LIST_BY_PATH,
    DetailEndpoint,
    ListEndpoint,
)
from feiqiu_etl.simulator.config import SimulatorConfig
from feiqiu_etl.simulator.dataset import Dataset
from feiqiu_etl.simulator.faults import BODY_KINDS, DATA_KINDS, EMPTY_KINDS, Fault, FaultInjector, ListingRequest
from feiqiu_etl.simulator.params import (
    ApiError,
    parse_body,
    parse_detail_id,
    parse_limit,
    parse_page,
    parse_site_id,
    parse_window,
    site_id_of,
)
from feiqiu_etl.simulator.requestlog import RequestLog
from feiqiu_etl.simulator.risk import RiskController

MESSAGES = {
    40101: "令牌无效或已过期",
    40103: "无该门店权限",
    40401: "记录不存在",
    42901: "请求过于频繁，请稍后再试",
    42902: "访问受限，请稍后再试",
    50001: "系统繁忙",
}
HTML_ERRORS = {
    404: "<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center>"
         "<hr><center>fq-gateway</center></body></html>",
    405: "<html><head><title>405 Method Not Allowed</title></head><body><center><h1>405 Not Allowed</h1>"
         "</center><hr><center>fq-gateway</center></body></html>",
    500: "<html><body><h1>500 Internal Server Error</h1></body></html>",
    502: "",
    503: "<html><head><title>503 Service Temporarily Unavailable</title></head><body><center>"
         "<h1>503 Service Temporarily Unavailable</h1></center></body></html>",
    504: "<html><head><title>504 Gateway Time-out</title></head><body><center><h1>504 Gateway Time-out</h1>"
         "</center></body></html>",
}
JSON_TYPE = "application/json; charset=utf-8"
HTML_TYPE = "text/html; charset=utf-8"


@dataclass(frozen=True)
class Reply:
    """A response to write, plus what the request log needs to know about it."""

    http_status: int
    body: bytes
    content_type: str = JSON_TYPE
    headers: tuple[tuple[str, str], ...] = ()
    code: int | None = None
    outcome: str = "accepted"
    record_count: int = 0
    accepted: bool = False
    fault: str | None = None
    site_id: int | None = None
    parsed_body: dict | None = None
    on_complete: Callable[[], None] = field(default=lambda: None, compare=False, repr=False)


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("Authorization") or headers.get("authorization") or ""
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def html_reply(status: int, outcome: str, **extra: Any) -> Reply:
    return Reply(status, HTML_ERRORS.get(status, "").encode(), HTML_TYPE, code=None, outcome=outcome, **extra)


class Service:
    """Answers requests to the simulated API (see the module docstring for the order of checks)."""

    def __init__(self, config: SimulatorConfig, dataset: Dataset, risk: RiskController, faults: FaultInjector,
                 log: RequestLog, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self.dataset = dataset
        self.risk = risk
        self.faults = faults
        self.log = log
        self._sleep = sleep
        self._token_sites = config.token_sites()
        self._trace = 0
        self._trace_lock = threading.Lock()
        self._extra: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (config.extra_fields or {}).items()}
        self._extra_lock = threading.Lock()
        self._revoked: dict[str, int] = {}  # token -> requests it may still send before it answers 40101
        self.admin = Admin(config, dataset, log, risk, faults)

    def add_field(self, name: str, value: Any, task_code: str = "*") -> None:
        """From now on every list record of ``task_code`` (``"*"``: every task) carries ``name: value``."""
        with self._extra_lock:
            self._extra.setdefault(task_code, {})[name] = value

    def remove_field(self, name: str, task_code: str = "*") -> None:
        """Undo :meth:`add_field` (or a configured ``extra_fields`` entry) for ``task_code``."""
        with self._extra_lock:
            self._extra.get(task_code, {}).pop(name, None)

    def revoke(self, token: str, after: int = 0) -> None:
        """After ``after`` more requests that reach the token check, ``token`` answers ``40101`` (revoked in the
        back office, upstream-api.md §2.1) until :meth:`reinstate`."""
        with self._extra_lock:
            self._revoked[token] = max(0, after)

    def reinstate(self, token: str) -> None:
        """Undo :meth:`revoke`: the token is valid again."""
        with self._extra_lock:
            self._revoked.pop(token, None)

    def _is_revoked(self, token: str) -> bool:
        with self._extra_lock:
            left = self._revoked.get(token)
            if left is None:
                return False
            if left > 0:
                self._revoked[token] = left - 1
                return False
            return True

    def _extra_fields(self, task_code: str) -> dict[str, Any]:
        with self._extra_lock:
            return {**self._extra.get("*", {}), **self._extra.get(task_code, {})}

    # --- entry point -------------------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: Mapping[str, str], raw: bytes) -> Reply:
        if path.startswith(ADMIN_PREFIX):
            return self._admin(method, path, headers, raw)
        endpoint = LIST_BY_PATH.get(path) or DETAIL_BY_PATH.get(path)
        if endpoint is None:
            return html_reply(404, "not_found")
        if method != "POST":
            return html_reply(405, "not_found", headers=(("Allow", "POST"),))
        body, body_error = parse_body(raw)
        site_hint = site_id_of(body)
        context = {"site_id": site_hint, "parsed_body": body}
        gateway = self.faults.take_gateway(path)
        if gateway is not None:
            headers_429 = (("Retry-After", str(gateway.retry_after)),)
            return Reply(429, b"Too Many Requests", "text/plain; charset=utf-8", headers_429, None, "fault",
                         fault=gateway.kind, **context)
        escaped = endpoint.ensure_ascii
        token = _bearer(headers)
        if token is None or token not in self._token_sites or self._is_revoked(token):
            return self._envelope(40101, MESSAGES[40101], None, escaped, outcome="auth", **context)
        if site_hint is not None and site_hint not in self._token_sites[token]:
            return self._envelope(40103, MESSAGES[40103], None, escaped, outcome="auth", **context)
        decision = self.risk.admit(token, endpoint.gap_class)
        if not decision.accepted:
            return self._envelope(decision.code, MESSAGES[decision.code], {"retryAfter": decision.retry_after},
                                  escaped, outcome="rejected", **context)
        return self._accepted(token, endpoint, body, body_error, context)

    def _admin(self, method: str, path: str, headers: Mapping[str, str], raw: bytes) -> Reply:
        answer = self.admin.handle(method, path, _bearer(headers), raw)
        if answer is None:
            return html_reply(404, "not_found")
        if answer.raw is not None:
            return Reply(200, answer.raw, outcome="accepted")
        return self._envelope(answer.code, answer.msg, answer.data, False)

    # --- accepted requests ----------------------------------------------------------------------------------------
    def _accepted(self, token: str, endpoint: ListEndpoint | DetailEndpoint, body: dict | None,
                  body_error: str | None, context: dict) -> Reply:
        complete = {"accepted": True, "on_complete": lambda: self.risk.complete(token)}
        try:
            listing = None
            if isinstance(endpoint, ListEndpoint):
                start = body.get("startTime") if isinstance(body, dict) else None
                page = body.get("page") if isinstance(body, dict) else None
                listing = ListingRequest(endpoint.windowed, start if isinstance(start, str) else None,
                                         page if isinstance(page, int) and not isinstance(page, bool) else None)
            fault = self.faults.take_service(endpoint.path, listing)
            if fault is not None and fault.kind == "code42901":
                self.risk.abandon(token)
                unit = self.risk.config.retry_after_unit  # a time-scaled simulator scales the hint too
                hint = fault.retry_after if unit == 1.0 else round(fault.retry_after * unit, 9)
                return self._envelope(42901, MESSAGES[42901], {"retryAfter": hint},
                                      endpoint.ensure_ascii, outcome="fault", fault=fault.kind, **context)
            if self.config.processing_delay > 0:
                self._sleep(self.config.processing_delay)
            if fault is not None and fault.kind == "stall":
                self._sleep(fault.stall_seconds)
            if fault is not None and fault.kind not in ("stall", *BODY_KINDS, *DATA_KINDS):
                return self._fault_reply(fault, endpoint, context, complete)
            data_fault = fault.kind if fault is not None and fault.kind in DATA_KINDS else None
            reply = self._business(endpoint, body, body_error, context, complete, data_fault)
            if fault is not None and fault.kind == "truncated":
                return replace(reply, body=reply.body[: max(1, len(reply.body) // 2)], fault=fault.kind,
                               outcome="fault", record_count=0)
            if fault is not None and fault.kind == "non_utf8":
                return replace(reply, body=reply.body[:-1] + b"\xff\xfe\x80" + reply.body[-1:], fault=fault.kind,
                               outcome="fault", record_count=0)
            return reply if fault is None else _with_fault(reply, fault)
        except BaseException:
            self.risk.complete(token)
            raise

    def _fault_reply(self, fault: Fault, endpoint, context: dict, complete: dict) -> Reply:
        if fault.kind.startswith("http"):
            return html_reply(fault.http_status, "fault", fault=fault.kind, **context, **complete)
        code = int(fault.kind[4:])
        return self._envelope(code, MESSAGES[code], None, endpoint.ensure_ascii, outcome="fault", fault=fault.kind,
                              **context, **complete)

    def _business(self, endpoint, body: dict | None, body_error: str | None, context: dict,
                  complete: dict, data_fault: str | None = None) -> Reply:
        escaped = endpoint.ensure_ascii
        try:
            if body is None:
                raise ApiError(40001, f"参数错误: {body_error}")
            site_id = parse_site_id(body)
            if isinstance(endpoint, ListEndpoint):
                data, count = self._list(endpoint, site_id, body, data_fault)
            else:
                data, count = self._detail(endpoint, site_id, body)
        except ApiError as error:
            return self._envelope(error.code, error.msg, None, escaped, **context, **complete)
        return self._envelope(0, "ok", data, escaped, record_count=count, **context, **complete)

    def _list(self, endpoint: ListEndpoint, site_id: int, body: dict,
              data_fault: str | None = None) -> tuple[dict, int]:
        """One page of a list endpoint in its §1.4 shape; ``data_fault`` (``faults.DATA_KINDS``) bends it."""
        page, limit = parse_page(body), parse_limit(body)
        start, end = parse_window(body) if endpoint.windowed else (None, None)
        if self.config.churn_between_pages and page > 1:
            self.dataset.churn(endpoint.task_code, site_id)
        records = self.dataset.select(endpoint, site_id, start, end)
        chunk = records[(page - 1) * limit: page * limit]
        total = len(records)
        if data_fault == "short_page":
            chunk = chunk[:-1]
        elif data_fault in EMPTY_KINDS:
            chunk, total = [], 0
        elif data_fault == "total_moves":
            total += 1
        extra = self._extra_fields(endpoint.task_code)
        if extra:  # schema drift: fields the records did not have before
            chunk = [{**record, **extra} for record in chunk]
        return shape_list(endpoint, chunk, total, page, limit), len(chunk)

    def _detail(self, endpoint: DetailEndpoint, site_id: int, body: dict) -> tuple[dict, int]:
        parent_id = parse_detail_id(body, endpoint)
        data = self.dataset.detail_data(endpoint.parent_task, site_id, parent_id)
        if data is None:
            raise ApiError(40401, MESSAGES[40401])
        node = data
        for key in endpoint.data_path[1:]:
            node = node[key]
        return data, len(node[endpoint.list_key])

    # --- rendering ---------------------------------------------------------------------------------------------
    def _envelope(self, code: int, msg: str, data: Any, escaped: bool, **reply: Any) -> Reply:
        with self._trace_lock:
            self._trace += 1
            trace = f"sim{self._trace:010x}"
        text = json.dumps({"code": code, "msg": msg, "data": data, "traceId": trace}, ensure_ascii=escaped)
        return Reply(200, text.encode("utf-8"), JSON_TYPE, code=code, **reply)


def _with_fault(reply: Reply, fault: Fault) -> Reply:
    return replace(reply, fault=fault.kind)


def shape_list(endpoint: ListEndpoint, chunk: list, total: int, page: int, limit: int) -> dict:
    """``data`` of a list response in the endpoint's shape A/B/C/D (upstream-api.md §1.4)."""
    if endpoint.shape.name == "D":
        return {"page": {"pageNo": page, "pageSize": limit, "total": total, "list": chunk}}
    return {"total": total, endpoint.shape.list_key: chunk}
