"""Properties of ``feiqiu_etl.jsonfast``: orjson's speed without changing a single byte or value.

* ``canonical_bytes(v)`` is byte-identical to the standard library's canonical form (warehouse-model §2.2:
  sorted keys, compact, UTF-8 unescaped) for every JSON value, floats of every magnitude, integers beyond
  64 bits (ids above 2^53, upstream-api.md Q2), any Unicode; where the standard library raises, so does it.
* ``loads(text)`` returns exactly what ``json.loads`` returns, and raises where it raises.
"""

from __future__ import annotations

import json
import math
import sys

from hypothesis import example, given
from hypothesis import strategies as st

from feiqiu_etl import jsonfast
from feiqiu_etl.pipeline.gil_switch import GIL_SWITCH_INTERVAL, short_gil_switch

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.integers(min_value=-2**70, max_value=2**70), st.sampled_from([2**53 + 1, 2**63, 2**64, -2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-5, 1.5e-7, 1e16, 1e22, 0.1, -0.0, 5e-324, 1e-4, 123456789.125]),
    st.text(), st.sampled_from(["\x00", "\u2028", "\x7f", "\ud800", "é🎱", '"\\/']),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=5), inner, max_size=4)),
                      max_leaves=12)


def _reference(value):
    try:
        return jsonfast.canonical_text(value).encode("utf-8")
    except (ValueError, TypeError) as exc:
        return type(exc)


@given(values)
@example({"b": 1, "a": [1e-05, 2**64]})
@example({"x": math.nan})
def test_canonical_bytes_equal_the_standard_library(value):
    expected = _reference(value)
    if isinstance(expected, type):
        try:
            jsonfast.canonical_bytes(value)
        except expected:
            return
        raise AssertionError(f"expected {expected.__name__}")
    assert jsonfast.canonical_bytes(value) == expected


@given(values)
@example(-2**63 - 1)  # orjson alone reads these two as floats
@example({"id": [2**64, 1872950412356812801]})
def test_loads_equals_json_loads(value):
    try:
        text = json.dumps(value, ensure_ascii=False)
        data = text.encode("utf-8", "surrogatepass")
    except (ValueError, TypeError):
        return
    try:
        expected = json.loads(data)
    except ValueError as exc:
        try:
            jsonfast.loads(data)
        except type(exc):
            return
        raise AssertionError("expected an error") from None
    got = jsonfast.loads(data)
    assert json.dumps(got, allow_nan=True) == json.dumps(expected, allow_nan=True)
    assert _types(got) == _types(expected)  # ints stay ints (exact), floats floats


def _types(value):
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


def test_a_run_lowers_the_gil_switch_interval_and_restores_it():
    before = sys.getswitchinterval()
    with short_gil_switch():
        with short_gil_switch():
            assert sys.getswitchinterval() == min(before, GIL_SWITCH_INTERVAL)
        assert sys.getswitchinterval() == min(before, GIL_SWITCH_INTERVAL)  # still one run active
    assert sys.getswitchinterval() == before
