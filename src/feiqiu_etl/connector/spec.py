"""``OdsTaskSpec``: the declarative description of one ODS task (spec §3.5–§3.6).

A spec says where a list lives (endpoint, ``data_path``/``list_key``), how records are keyed and typed
in their ODS table (warehouse-model.md §2.4), whether the task is a snapshot or windowed, and, for
Detail_Mode, how to fetch and store each record's detail rows. Specs are plain frozen data: the
connector YAML builds them, and Python code may build them directly. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Literal, Mapping

SqlKeyType = Literal["bigint", "text", "integer"]
JSON_TYPES = ("integer", "number", "string", "boolean", "object", "array")
"""The JSON types a declared field may have (:attr:`OdsTaskSpec.fields`); ``number`` includes integers."""


def json_type(value: Any) -> str | None:
    """The JSON type of a parsed value (one of :data:`JSON_TYPES`), None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    return "array" if isinstance(value, list) else type(value).__name__
TaskKind = Literal["snapshot", "windowed"]


@dataclass(frozen=True)
class KeyColumn:
    """One key column: JSON ``field`` → ODS ``column`` of SQL type ``sql_type`` (warehouse-model §2.4)."""

    field: str
    column: str
    sql_type: SqlKeyType

    def convert(self, value: Any) -> Any:
        """Cast a JSON value to the Python value stored in the key column.

        Raises ``ValueError`` for a missing/empty key or a non-integral value for an integer column.
        Integers stay exact (no float round trip, upstream-api.md Q2); ``text`` keys keep leading zeros (Q4).
        """
        if value is None or value == "":
            raise ValueError(f"key field {self.field!r} is missing or empty")
        if self.sql_type == "text":
            if isinstance(value, (dict, list)):
                raise ValueError(f"key field {self.field!r} is not a scalar: {value!r}")
            return value if isinstance(value, str) else str(value)
        if isinstance(value, bool) or isinstance(value, float):
            raise ValueError(f"key field {self.field!r} must be an integer, got {value!r}")
        if isinstance(value, int):
            out = value
        elif isinstance(value, str) and value.lstrip("-").isascii() and value.lstrip("-").isdigit():  # ASCII only
            out = int(value)
        else:
            raise ValueError(f"key field {self.field!r} must be an integer, got {value!r}")
        limit = 2**63 if self.sql_type == "bigint" else 2**31
        if not -limit <= out < limit:
            raise ValueError(f"key field {self.field!r} out of range for {self.sql_type}: {out}")
        return out


@dataclass(frozen=True)
class DueWhen:
    """A rule that makes a parent's detail due without its list row changing (issue 25 part 6): a row of task
    ``changed``'s table that is new, changed or soft-deleted makes the detail of the parent whose key is in that
    row's field ``parent_field`` due (the member's detail holds the member's cards: a card that changed in the
    card snapshot means a stale detail)."""

    changed: str
    parent_field: str


@dataclass(frozen=True)
class OwedParent:
    """The child's side of a :class:`DueWhen` rule, on the ``changed`` task's spec: its rows' ``parent_field``
    names a row of ``parent_table`` (key ``parent_key``) of task ``parent_task`` whose detail becomes owed
    (``etl_meta.detail_pending``, in the transaction that writes the child's rows)."""

    parent_task: str
    parent_table: str
    parent_key: KeyColumn
    parent_field: str


@dataclass(frozen=True)
class DetailSpec:
    """Detail_Mode settings of a task (spec §3.6; upstream-api.md §5.1).

    ``param_builder(record) -> body`` builds the detail request body from a list record, passing ids
    through unchanged (Q2). ``keys`` are the detail table's key columns; ``parent`` is the column that
    holds the parent id (the per-parent soft-delete scope of warehouse-model §2.3); it may also be a key.
    """

    endpoint: str
    param_builder: Callable[[Mapping[str, Any]], dict]
    target_table: str
    data_path: tuple[str, ...]
    list_key: str
    id_column: str
    keys: tuple[KeyColumn, ...]
    parent: KeyColumn
    refetch_on_new_fields: bool = False
    """False (default): a parent whose only change is fields it did not have before (schema drift) keeps
    its stored detail, no request is sent. True: every changed parent fetches its detail again."""
    refetch_on_volatile: bool = False
    """False (default): a parent whose only change is in the task's ``volatile_fields`` (upstream-api.md Q11)
    is updated in ODS but keeps its stored detail (refreshed at its next other change). True: fetch it again."""
    due_when: tuple[DueWhen, ...] = ()
    """Other tasks whose changed rows make a parent's detail due (:class:`DueWhen`; the connector's
    ``detail.due_when``). Such a task runs before this one in a run, so the detail is fetched the same night."""

    @property
    def parent_is_key(self) -> bool:
        return any(k.column == self.parent.column for k in self.keys)


@dataclass(frozen=True)
class OdsTaskSpec:
    """One ODS task: list endpoint → ODS table (spec §3.5–§3.6, warehouse-model §2).

    ``table`` is schema-qualified (``"ods.settlement"``). ``pipeline`` holds task-level defaults for
    ``PipelineConfig`` keys (e.g. ``{"rate_min": 8.5}`` for the group-buy gap class, upstream-api §2.2).
    ``gap_class`` is the upstream's risk-control class of the list and detail endpoints (the lane keeps
    a floor per class; the connector documents each class's minimum gap).

    ``volatile_fields`` are fields that change without moving ``updateTime`` (upstream-api.md Q11): a change
    in them alone asks for no detail. ``lookback`` (windowed tasks) is how far before the high-water mark an
    incremental run reads again; None means the run's ``window.lookback_hours`` (lists whose window field can
    stay put when the record changes, Q13). ``expected_rows`` (snapshots: records of a store) and
    ``expected_daily_rows`` (windowed: records per day) are the contract's documented volume range
    (upstream-api.md §4.1), which plans use before a store has history. ``names`` are display names by language
    (``zh``: the contract's Chinese name, upstream-api.md §4; ``en``), shown by the web page beside the code.
    """

    code: str
    endpoint: str
    table: str
    kind: TaskKind
    keys: tuple[KeyColumn, ...]
    data_path: tuple[str, ...] = ("data",)
    list_key: str = "list"
    window_field: str | None = None
    window_column: str | None = None
    page_size: int = 200
    pipeline: Mapping[str, Any] = field(default_factory=dict)
    detail: DetailSpec | None = None
    gap_class: str = "standard"
    description: str = ""
    names: Mapping[str, str] = field(default_factory=dict)
    volatile_fields: tuple[str, ...] = ()
    lookback: timedelta | None = None
    expected_rows: tuple[int, int] | None = None
    expected_daily_rows: tuple[int, int] | None = None
    fields: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The top-level fields of a list record and the JSON types each may have (``integer``, ``number``,
    ``string``, ``boolean``, ``object``, ``array``; null always allowed), upstream-api.md §3; empty: not
    declared. ``feiqiu-etl check`` reports fields missing, new or of another type against it."""
    owes_details: tuple[OwedParent, ...] = ()
    """Parents' details this task's changed rows make due (the other side of their ``detail.due_when``)."""

    def __post_init__(self) -> None:
        if self.kind not in ("snapshot", "windowed"):
            raise ValueError(f"{self.code}: kind must be 'snapshot' or 'windowed', got {self.kind!r}")
        if self.kind == "windowed" and not (self.window_field and self.window_column):
            raise ValueError(f"{self.code}: a windowed task needs window_field and window_column")
        if self.kind == "snapshot" and self.window_field:
            raise ValueError(f"{self.code}: a snapshot task has no window field")
        if not self.keys:
            raise ValueError(f"{self.code}: at least one key column is required")
        if not 1 <= self.page_size <= 10_000:
            raise ValueError(f"{self.code}: page_size must be 1..10000, got {self.page_size}")
        if self.lookback is not None and (self.kind != "windowed" or self.lookback < timedelta(0)):
            raise ValueError(f"{self.code}: a look-back belongs to a windowed task and is >= 0")

    # Spec §3.6 names, kept as read-only views for callers that use the flat form.
    @property
    def detail_endpoint(self) -> str | None:
        return self.detail.endpoint if self.detail else None

    @property
    def detail_target_table(self) -> str | None:
        return self.detail.target_table if self.detail else None

    @property
    def is_snapshot(self) -> bool:
        return self.kind == "snapshot"

    def tables(self) -> tuple[str, ...]:
        return (self.table,) + ((self.detail.target_table,) if self.detail else ())


def split_table(qualified: str) -> tuple[str, str]:
    """``"ods.member"`` → ``("ods", "member")``. Raises ``ValueError`` when not schema-qualified."""
    schema, dot, name = qualified.partition(".")
    if not dot or not schema or not name or "." in name:
        raise ValueError(f"table name must be 'schema.table', got {qualified!r}")
    return schema, name


def run_order(specs: "tuple[OdsTaskSpec, ...] | list[OdsTaskSpec]") -> tuple[OdsTaskSpec, ...]:
    """``specs`` in the order a store runs them: as given, except that a task whose detail is due when another
    selected task's rows changed (``detail.due_when``) runs after that task (stable otherwise)."""
    out = list(specs)
    for spec in list(out):
        if spec.detail is None or not spec.detail.due_when:
            continue
        children = {rule.changed for rule in spec.detail.due_when}
        last = max((i for i, s in enumerate(out) if s.code in children), default=-1)
        here = out.index(spec)
        if last > here:
            out.insert(last, out.pop(here))
    return tuple(out)
