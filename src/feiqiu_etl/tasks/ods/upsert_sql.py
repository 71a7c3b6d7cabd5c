"""The SQL of the ODS batch upsert (warehouse-model.md §2.3) and the parameters it takes, in matching order.

:func:`upsert_sql` is ONE statement per table and batch: the rows travel as column arrays (:func:`batch_arrays`,
PostgreSQL array literals in :func:`array_columns` order) plus ONE JSON array of payloads; they are unnested,
an unchanged live row is dropped before the ``INSERT … ON CONFLICT … DO UPDATE … WHERE content_hash IS DISTINCT
FROM … OR is_deleted``, and the statement reads back what it wrote: ``(inserted, changed)`` counts, or for the
parents of a task with details one row per written row with a *no detail needed* flag. :func:`owe_sql` is the
INSERT of the ``etl_meta.detail_pending`` rows that another task's rows make due (``owes_details``).
Identifiers always go through ``sql.Identifier``; values are parameters (the arrays) or ``sql.Literal``.
Pure: builds text, runs nothing.
"""

from __future__ import annotations

from datetime import datetime

from psycopg import postgres, sql
from psycopg.adapt import Dumper

from feiqiu_etl.connector.spec import OdsTaskSpec, split_table
from feiqiu_etl.tasks.ods.rows import OdsRow, TableLayout


class TextBytes(Dumper):
    """Send ``bytes`` that hold UTF-8 text as a text parameter, as they are (no decode, no bytea escaping).
    Register it on the upsert's cursor only: the payload array (:func:`batch_arrays`) is such bytes."""

    oid = postgres.types["text"].oid

    def dump(self, obj: bytes) -> bytes:
        return obj


def array_literal(values: list, sql_type: str) -> str:
    """A PostgreSQL array literal (``'{1,2}'``, ``'{"a","b\\"c"}'``) of ints, strings or aware datetimes;
    None is NULL. Strings are double-quoted with ``\\`` and ``"`` escaped; ISO datetimes need no quotes."""
    if sql_type in ("bigint", "integer"):
        return "{" + ",".join([str(v) for v in values]) + "}"
    if sql_type == "timestamptz":
        seen: dict[datetime, str] = {}  # fetched_at is one object per page
        parts = []
        for v in values:
            text = seen.get(v) if v is not None else "NULL"
            if text is None:
                text = seen[v] = v.isoformat()
            parts.append(text)
        return "{" + ",".join(parts) + "}"
    return "{" + ",".join(['"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values]) + "}"


def array_columns(layout: TableLayout) -> list[tuple[str, str]]:
    """(column, SQL type) of the unnest arrays, in :func:`batch_arrays` order (the payload travels apart)."""
    cols = [("site_id", "bigint"), *((k.column, k.sql_type) for k in layout.keys),
            *((k.column, k.sql_type) for k in layout.extra)]
    if layout.window_column:
        cols.append((layout.window_column, "timestamptz"))
    return cols + [("content_hash", "text"), ("fetched_at", "timestamptz")]


def batch_arrays(layout: TableLayout, rows: list[OdsRow]) -> tuple[list[str], bytes]:
    """The batch as PostgreSQL array literals, one per column of :func:`array_columns`, and the payloads as ONE
    JSON array (UTF-8 bytes, sent as text: see :class:`TextBytes`). Built with string joins: dumping Python
    lists element by element was the writer's largest cost (profile in benchmarks/results/vs_peers.txt)."""
    columns = [array_literal([r.site_id for r in rows], "bigint")]
    for i, k in enumerate(layout.keys):
        columns.append(array_literal([r.keys[i] for r in rows], k.sql_type))
    for i, k in enumerate(layout.extra):
        columns.append(array_literal([r.extra[i] for r in rows], k.sql_type))
    if layout.window_column:
        columns.append(array_literal([r.window for r in rows], "timestamptz"))
    columns.append("{" + ",".join([r.content_hash for r in rows]) + "}")  # hex digests: nothing to quote
    columns.append(array_literal([r.fetched_at for r in rows], "timestamptz"))
    payloads = [r.payload if type(r.payload) is bytes else r.payload.encode("utf-8") for r in rows]
    return columns, b"[" + b",".join(payloads) + b"]"


def upsert_sql(spec: OdsTaskSpec, connector: str, layout: TableLayout, parents: bool) -> sql.Composed:
    """One statement for ``layout``'s table of task ``spec``: unnest the column arrays (and the payload array, by
    position), upsert by key, count (or, with ``parents``: the task's detail parents, list with a
    no-detail-needed flag) the rows written. Its placeholders: ``[key arrays…]`` first with ``parents`` (the
    stored rows read before the upsert), then the :func:`batch_arrays` columns, the payloads, the run id — as
    :meth:`~feiqiu_etl.tasks.ods.writer.OdsWriter.write` passes them. Key types come from the closed
    ``SqlKeyType`` list."""
    target = sql.Identifier(*split_table(layout.table))
    owes = layout.table == spec.table and bool(spec.owes_details)
    typed = array_columns(layout)
    conflict = ["site_id", *layout.key_columns]
    upsert = _insert_sql(target, typed, conflict, returning_payload=parents or owes)
    if not parents:
        owed = sql.SQL("").join(sql.SQL(", {} AS ({})").format(sql.Identifier(f"owed_{i}"), owe_sql(
            connector, rule, sql.SQL("SELECT DISTINCT w.site_id, w.payload ->> {} AS k FROM w").format(
                sql.Literal(rule.parent_field)))) for i, rule in enumerate(spec.owes_details if owes else ()))
        return sql.SQL("WITH w AS ({}){} SELECT count(*) FILTER (WHERE inserted), count(*) FROM w").format(
            upsert, owed)
    return _flagged_sql(spec, target, typed, conflict, upsert)


def _insert_sql(target: sql.Identifier, typed: list[tuple[str, str]], conflict: list[str],
                returning_payload: bool) -> sql.Composed:
    """The ``INSERT … SELECT … ON CONFLICT … RETURNING (xmax = 0) AS inserted, keys[, t.payload]``."""
    columns = [c for c, _ in typed] + ["payload", "run_id"]
    updatable = [c for c in columns if c not in conflict]
    sets = [sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in updatable]
    sets += [sql.SQL("is_deleted = false"), sql.SQL("deleted_at = NULL")]
    arrays = sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(t)) for _, t in typed)
    alias = sql.SQL(", ").join(sql.Identifier(c) for c, _ in typed)
    select = sql.SQL(", ").join([sql.SQL("s.{}").format(sql.Identifier(c)) for c, _ in typed]
                                + [sql.SQL("j.payload::jsonb"), sql.SQL("%s")])
    keys = sql.SQL(", ").join(sql.Identifier(c) for c in conflict)
    same = sql.SQL(" AND ").join(sql.SQL("o.{c} = s.{c}").format(c=sql.Identifier(c)) for c in conflict)
    # The payloads travel as ONE json text: only the rows that are new or changed are parsed into jsonb,
    # and an unchanged live row is dropped before the upsert (no row lock, no WAL: a re-run writes nothing).
    return sql.SQL(
        "INSERT INTO {target} AS t ({cols}) SELECT {select} FROM unnest({arrays}) WITH ORDINALITY AS s({alias}, n) "
        "JOIN json_array_elements(%s::json) WITH ORDINALITY AS j(payload, n) USING (n) "
        "WHERE NOT EXISTS (SELECT 1 FROM {target} o WHERE {same} AND o.content_hash = s.content_hash "
        "AND NOT o.is_deleted) "
        "ON CONFLICT ({conflict}) DO UPDATE SET {sets} "
        "WHERE t.content_hash IS DISTINCT FROM EXCLUDED.content_hash OR t.is_deleted "
        "RETURNING (xmax = 0) AS inserted, {ret}"
    ).format(
        target=target, cols=sql.SQL(", ").join(map(sql.Identifier, columns)), select=select,
        arrays=arrays, alias=alias, conflict=keys, sets=sql.SQL(", ").join(sets), same=same,
        ret=sql.SQL(", ").join([keys, sql.SQL("t.payload")] if returning_payload else [keys]),
    )


def _flagged_sql(spec: OdsTaskSpec, target: sql.Identifier, typed: list[tuple[str, str]], conflict: list[str],
                 upsert: sql.Composed) -> sql.Composed:
    """Detail parents: the stored payload before this statement (one snapshot for the whole WITH) tells a
    change that needs no detail: both payloads without the volatile fields (Q11) are equal once the new one
    also drops the fields the old one lacked (schema drift). Each part is left out when the task's
    ``detail.refetch_on_*`` asks for a detail anyway. Rows ``(inserted, no_detail_needed, site_id, keys…)``."""
    match = sql.SQL(" AND ").join(sql.SQL("p.{c} = w.{c}").format(c=sql.Identifier(c)) for c in conflict)
    old_keys = sql.SQL(" AND ").join(
        sql.SQL("o.{c} = ANY(%s::{t}[])").format(c=sql.Identifier(c), t=sql.SQL(t))
        for c, t in typed[:len(conflict)])
    detail = spec.detail
    volatile = () if detail.refetch_on_volatile else spec.volatile_fields
    ignore = (sql.SQL(" - ARRAY[{}]::text[]").format(sql.SQL(", ").join(map(sql.Literal, volatile)))
              if volatile else sql.SQL(""))
    new_fields = sql.SQL("") if detail.refetch_on_new_fields else sql.SQL(
        " - ARRAY(SELECT jsonb_object_keys(w.payload) EXCEPT SELECT jsonb_object_keys(p.payload))")
    return sql.SQL(
        "WITH prev AS MATERIALIZED (SELECT {okeys}, o.payload, o.is_deleted FROM {target} o WHERE {old_keys}), "
        "w AS ({upsert}) "
        "SELECT w.inserted, COALESCE(NOT p.is_deleted AND (p.payload{ignore}) = (w.payload{ignore}){new_fields}, "
        "false), {wkeys} FROM w LEFT JOIN prev p ON {match}"
    ).format(okeys=sql.SQL(", ").join(sql.SQL("o.{}").format(sql.Identifier(c)) for c in conflict),
             target=target, old_keys=old_keys, upsert=upsert, match=match, ignore=ignore, new_fields=new_fields,
             wkeys=sql.SQL(", ").join(sql.SQL("w.{}").format(sql.Identifier(c)) for c in conflict))


def owe_sql(connector: str, rule, changed: sql.Composable) -> sql.Composed:
    """An INSERT of ``etl_meta.detail_pending`` rows for the live parents (``rule``: an ``OwedParent``) that the
    rows of ``changed`` (a query of ``site_id, k``: the parent key as text) name, with the parent's stored list
    record as the request's record; an entry already owed stays as it is (issue 25 part 6)."""
    schema, name = split_table(rule.parent_table)
    return sql.SQL(
        "INSERT INTO etl_meta.detail_pending (connector, task_code, site_id, parent_key, record, attempts) "
        "SELECT {conn}, {task}, p.site_id, p.{pk}::text, p.payload, 0 FROM {parents} p "
        "JOIN ({changed}) c ON c.site_id = p.site_id AND c.k = p.{pk}::text WHERE NOT p.is_deleted "
        "ON CONFLICT (connector, task_code, site_id, parent_key) DO NOTHING"
    ).format(conn=sql.Literal(connector), task=sql.Literal(rule.parent_task), pk=sql.Identifier(
        rule.parent_key.column), parents=sql.Identifier(schema, name), changed=changed)
