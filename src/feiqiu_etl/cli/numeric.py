"""click types for numeric flags: ASCII digits only and finite (:mod:`feiqiu_etl.numbers`, issue 28 items 3, 7).

click's own ``FLOAT``/``FloatRange`` take ``nan`` (NaN compares false with both bounds, so a range lets it
through), ``inf`` and full-width digits; these refuse them with click's usual one error line and exit 2."""

from __future__ import annotations

import click

from feiqiu_etl.numbers import parse_float, parse_int


class FloatRange(click.FloatRange):
    """``click.FloatRange`` that refuses NaN, ±inf and non-ASCII digits."""

    name = "float"

    def convert(self, value, param, ctx):
        try:
            value = parse_float(value, "the value")
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return super().convert(value, param, ctx)

    def _describe_range(self) -> str:
        return _unbounded_is_silent(self)


class IntRange(click.IntRange):
    """``click.IntRange`` that refuses non-ASCII digits (``int("１２")`` is 12 in Python)."""

    name = "integer"

    def convert(self, value, param, ctx):
        try:
            value = parse_int(value, "the value")
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return super().convert(value, param, ctx)

    def _describe_range(self) -> str:
        return _unbounded_is_silent(self)


def _unbounded_is_silent(kind: click.types._NumberRangeBase) -> str:
    """click's range for ``--help`` (``x>=1``), or nothing for a range without bounds (click prints
    ``x<=None`` for one)."""
    if kind.min is None and kind.max is None:
        return ""
    return click.types._NumberRangeBase._describe_range(kind)


FLOAT = FloatRange()
"""Any finite float."""
INT = IntRange()
"""Any whole number in ASCII digits."""
