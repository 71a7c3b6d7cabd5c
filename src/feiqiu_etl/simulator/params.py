"""Request-body validation of the simulated API: each function returns a clean value or raises :class:`ApiError`
with the business code of upstream-api.md §2.1.

What it is for: the exact 40001/40002/40003 rules — ``siteId`` as a JSON number below 2^53 or a decimal string
(§1.1), ``page`` 1-based integer (default 1) and ``limit`` 1..200 (default 20) (§1.3), half-open windows of at
most 31×24 h in ``"YYYY-MM-DD HH:MM:SS"`` (§1.2), detail ids as number or decimal string (Q2).
What it must never do: touch data, risk control or HTTP; convert an id through ``float``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from feiqiu_etl.simulator.catalog import DetailEndpoint
from feiqiu_etl.simulator.config import MAX_SITE_ID
from feiqiu_etl.simulator.values import parse_time

DEFAULT_LIMIT = 20
MAX_LIMIT = 200
MAX_WINDOW = timedelta(days=31)

BAD_PARAM = 40001
BAD_WINDOW = 40002
BAD_LIMIT = 40003


class ApiError(Exception):
    """A business error answered as ``{"code": code, "msg": msg, "data": null}`` with HTTP 200."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(f"{code} {msg}")
        self.code = code
        self.msg = msg


def parse_body(raw: bytes) -> tuple[dict | None, str | None]:
    """The JSON object of a request body (exact integers), or ``(None, reason)``."""
    if not raw.strip():
        return {}, None
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, "请求体不是合法的JSON"
    if not isinstance(body, dict):
        return None, "请求体必须是JSON对象"
    return body, None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _decimal_int(value: Any) -> int | None:
    """An int from a JSON integer or a decimal string of digits; ``None`` otherwise."""
    if _is_int(value):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def site_id_of(body: dict | None) -> int | None:
    """The valid ``siteId`` of a body, or ``None`` if it is missing or malformed."""
    if not isinstance(body, dict):
        return None
    site_id = _decimal_int(body.get("siteId"))
    return site_id if site_id is not None and 0 < site_id < MAX_SITE_ID else None


def parse_site_id(body: dict) -> int:
    if "siteId" not in body:
        raise ApiError(BAD_PARAM, "参数错误: 缺少siteId")
    site_id = site_id_of(body)
    if site_id is None:
        raise ApiError(BAD_PARAM, "参数错误: siteId格式不正确")
    return site_id


def parse_page(body: dict) -> int:
    page = body.get("page", 1)
    if not _is_int(page) or page < 1:
        raise ApiError(BAD_PARAM, "参数错误: page必须是大于等于1的整数")
    return page


def parse_limit(body: dict) -> int:
    limit = body.get("limit", DEFAULT_LIMIT)
    if not _is_int(limit):
        raise ApiError(BAD_PARAM, "参数错误: limit必须是整数")
    if not 1 <= limit <= MAX_LIMIT:
        raise ApiError(BAD_LIMIT, "分页参数超限")
    return limit


def parse_window(body: dict) -> tuple[str, str]:
    """``(startTime, endTime)`` of a windowed request (upstream-api.md §1.2)."""
    start, end = parse_time(body.get("startTime")), parse_time(body.get("endTime"))
    if start is None or end is None:
        raise ApiError(BAD_WINDOW, "时间窗口无效: startTime/endTime缺失或格式错误")
    if end <= start:
        raise ApiError(BAD_WINDOW, "时间窗口无效: endTime必须晚于startTime")
    if end - start > MAX_WINDOW:
        raise ApiError(BAD_WINDOW, "时间窗口无效: 跨度超过31天")
    return body["startTime"], body["endTime"]


def parse_detail_id(body: dict, spec: DetailEndpoint) -> int | str:
    """The parent id of a detail request; ``40001`` if missing or of a wrong type.

    An id64 may come as a JSON integer, a decimal string, or an integral JSON float (what a lossy client sends;
    it is then most likely a corrupted id and answers 40401, Q2).
    """
    value = body.get(spec.id_param)
    if value is None or value == "":
        raise ApiError(BAD_PARAM, f"参数错误: 缺少{spec.id_param}")
    if spec.id_is_int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        parsed = _decimal_int(value)
        if parsed is None:
            raise ApiError(BAD_PARAM, f"参数错误: {spec.id_param}格式不正确")
        return parsed
    if _is_int(value):
        return str(value)
    if not isinstance(value, str):
        raise ApiError(BAD_PARAM, f"参数错误: {spec.id_param}格式不正确")
    return value
