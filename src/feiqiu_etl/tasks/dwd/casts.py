"""Cast helpers of warehouse-model §3 as ``psycopg.sql`` fragments with their parameters, and SQL names.

``cast_sql(column)`` turns a mapped :class:`~feiqiu_etl.connector.dwd_mapping.DwdColumn` into the SQL expression
that reads it from ``payload``, e.g. ``MNY(salePrice)`` → ``NULLIF(payload->>%s, '')::numeric(12,2)`` with
parameter ``"salePrice"``. A :class:`Fragment` carries the composed SQL and its parameters, in order, so a
caller can join fragments and run them as one statement. ``target_ident``/``source_ident``/``names``/``same_key``
compose the table and column names of a mapping.

Rules this module never breaks: identifiers are always ``sql.Identifier``; values that come from a mapping file
(JSON field names, ``when`` values) are always bound parameters, never pasted into SQL. SQL type names are
pasted only after :mod:`~feiqiu_etl.connector.dwd_mapping` has checked them against a closed list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from psycopg import sql

from feiqiu_etl.connector.dwd_mapping import CAST_TYPES, DwdColumn, DwdTable

# The SQL type names the mapping allows (a closed list), so pasting them is safe.
_TYPES: frozenset[str] = frozenset().union(*CAST_TYPES.values())


@dataclass(frozen=True)
class Fragment:
    """A piece of SQL plus the parameters of its ``%s`` placeholders, in order."""

    sql: sql.Composable
    params: tuple[Any, ...] = ()

    @staticmethod
    def of(template: str, *parts: "Fragment | sql.Composable") -> "Fragment":
        """Fill ``{}`` slots of ``template`` left to right; parameters are concatenated in the same order."""
        pieces: list[sql.Composable] = []
        params: list[Any] = []
        for p in parts:
            if isinstance(p, Fragment):
                pieces.append(p.sql)
                params.extend(p.params)
            else:
                pieces.append(p)
        return Fragment(sql.SQL(template).format(*pieces), tuple(params))

    @staticmethod
    def join(sep: str, parts: Iterable["Fragment"]) -> "Fragment":
        parts = list(parts)
        return Fragment(sql.SQL(sep).join(p.sql for p in parts), tuple(x for p in parts for x in p.params))


def param(value: Any) -> Fragment:
    """A single bound parameter."""
    return Fragment(sql.Placeholder(), (value,))


def sql_type(name: str) -> sql.SQL:
    """A SQL type name from the mapping's closed list. Raises ``ValueError`` for anything else."""
    if name not in _TYPES:
        raise ValueError(f"not an allowed DWD column type: {name!r}")
    return sql.SQL(name)


def target_ident(table: DwdTable) -> sql.Identifier:
    """``"dwd"."dim_member"``."""
    return sql.Identifier(table.schema, table.name)


def source_ident(table: DwdTable) -> sql.Identifier:
    """``"ods"."member"``."""
    return sql.Identifier(table.source_schema, table.source_name)


def names(columns, alias: str | None = None) -> sql.Composed:
    """``a, b, c`` (or ``x.a, x.b, x.c`` with ``alias``) as identifiers."""
    return sql.SQL(", ").join(sql.Identifier(alias, c) if alias else sql.Identifier(c) for c in columns)


def same_key(table: DwdTable, left: str, right: str) -> sql.Composed:
    """``l.site_id = r.site_id AND l.bk = r.bk …`` (composite keys compared column by column)."""
    return sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(sql.Identifier(left, k), sql.Identifier(right, k)) for k in table.key)


def json_text(path: tuple[str, ...], payload: sql.Composable = sql.Identifier("payload")) -> Fragment:
    """``p->>'f'`` for ``("f",)``; ``p->'a'->>'b'`` for ``("a", "b")`` (warehouse-model §3, nested fields)."""
    expr = Fragment(payload)
    for key in path[:-1]:
        expr = Fragment.of("{}->{}", expr, param(key))
    return Fragment.of("({}->>{})", expr, param(path[-1]))


def json_value(path: tuple[str, ...], payload: sql.Composable = sql.Identifier("payload")) -> Fragment:
    """``p->'f'`` (jsonb, for ``JSONB(f)``), following nested paths the same way."""
    expr = Fragment(payload)
    for key in path:
        expr = Fragment.of("{}->{}", expr, param(key))
    return Fragment.of("({})", expr)


def _empty_to_null(text: Fragment) -> Fragment:
    return Fragment.of("NULLIF({}, '')", text)


def _helper(cast: str, target: sql.SQL, path: tuple[str, ...], payload: sql.Composable) -> Fragment:
    """The SQL of one §3 helper applied to ``path``, producing ``target``."""
    text = json_text(path, payload)
    if cast == "TXT":
        return _empty_to_null(text)
    if cast == "ID":
        return Fragment.of("{}::bigint", text)
    if cast == "REF":
        return Fragment.of("NULLIF({}::{}, 0)", text, target)
    if cast in ("INT", "SREF", "MNY", "DEC", "DT"):
        return Fragment.of("{}::{}", _empty_to_null(text), target)
    if cast == "TS":
        return Fragment.of("({} || '+08:00')::timestamptz", _empty_to_null(text))
    if cast == "BOOL":
        return Fragment.of("CASE {} WHEN '1' THEN true WHEN '0' THEN false END", text)
    if cast == "JSONB":
        return json_value(path, payload)
    raise ValueError(f"unknown cast helper {cast!r}")


def cast_input(column: DwdColumn, payload: sql.Composable = sql.Identifier("payload")) -> Fragment | None:
    """The text that :func:`cast_sql` hands to the input function of ``column.sql_type`` (so the cast fails
    exactly when this text is not a valid value of that type), or None for the casts that cannot fail
    (TXT, BOOL, JSONB). ``REF``'s ``0 → NULL`` and the ``when`` condition are applied after the input."""
    text = json_text(column.path, payload)
    if column.cast in ("TXT", "BOOL", "JSONB"):
        return None
    if column.cast in ("ID", "REF"):
        return text
    if column.cast == "TS":
        return Fragment.of("({} || '+08:00')", _empty_to_null(text))
    return _empty_to_null(text)


def cast_error_sql(column: DwdColumn, payload: sql.Composable = sql.Identifier("payload"), *,
                   native: bool = True) -> Fragment | None:
    """A text expression: NULL when ``column`` casts (or its field is absent or its ``when`` is false), else
    PostgreSQL's message for the value (and its detail in parentheses), e.g. ``numeric field overflow (A
    field with precision 12, scale 2 must round to an absolute value less than 10^10.)``. ``native`` uses
    ``pg_input_error_info`` (PostgreSQL >= 16); otherwise the session's ``pg_temp.feiqiu_input_error``
    (:data:`INPUT_ERROR_FUNCTION`, which the caller creates first). None when the cast cannot fail."""
    text = cast_input(column, payload)
    if text is None:
        return None
    if native:
        err = Fragment.of("(SELECT e.message || COALESCE(' (' || e.detail || ')', '')"
                          " FROM pg_input_error_info({}, {}) e WHERE e.message IS NOT NULL)", text, param(column.sql_type))
    else:
        err = Fragment.of("pg_temp.feiqiu_input_error({}, {})", text, param(column.sql_type))
    if column.when is not None:
        err = Fragment.of("CASE WHEN {} = {} THEN {} END", json_text((column.when.field,), payload),
                          param(column.when.equals), err)
    return err


#: ``pg_temp.feiqiu_input_error(value, type)`` for servers before 16 (no ``pg_input_error_info``): tries the
#: input in a subtransaction (slow, so only used to find the rows that do not cast). It accepts only the
#: type names of the mapping's closed list (:data:`CAST_TYPES`), which it pastes into the cast.
INPUT_ERROR_FUNCTION = sql.SQL(
    "CREATE OR REPLACE FUNCTION pg_temp.feiqiu_input_error(value text, type_name text) RETURNS text"
    " LANGUAGE plpgsql AS $f$ BEGIN"
    " IF value IS NULL THEN RETURN NULL; END IF;"
    " IF NOT type_name = ANY({types}) THEN RAISE EXCEPTION 'not a DWD column type: %', type_name; END IF;"
    " EXECUTE format('SELECT %L::%s', value, type_name); RETURN NULL;"
    " EXCEPTION WHEN data_exception THEN DECLARE detail text; BEGIN"
    " GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;"
    " RETURN SQLERRM || COALESCE(' (' || NULLIF(detail, '') || ')', ''); END; END $f$"
).format(types=sql.Literal(sorted(_TYPES)))


def cast_sql(column: DwdColumn, payload: sql.Composable = sql.Identifier("payload")) -> Fragment:
    """The expression for ``column`` read from ``payload`` (warehouse-model §3 and the §5.2 CASE forms).

    Raises ``ValueError`` for a cast or type outside warehouse-model §3 (the mapping loader rejects those first).
    """
    if column.sql_type not in CAST_TYPES.get(column.cast, ()):
        raise ValueError(f"cast {column.cast} cannot produce {column.sql_type} ({column.name})")
    expr = _helper(column.cast, sql_type(column.sql_type), column.path, payload)
    if column.when is not None:
        expr = Fragment.of("CASE WHEN {} = {} THEN {} END", json_text((column.when.field,), payload),
                           param(column.when.equals), expr)
    return expr
