"""Schema and loader for connector YAML files (the Feiqiu connector is ``feiqiu.yaml`` beside this file).

The file is validated with pydantic; any error is reported as one line naming the file, the task and the
field (``ConnectorError``). Loading turns task entries into :class:`~feiqiu_etl.connector.spec.OdsTaskSpec`.
This module never performs network or database I/O.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field, field_validator, model_validator

from feiqiu_etl.common.yamldoc import Strict, load_definition, read_yaml
from feiqiu_etl.connector.spec import DetailSpec, DueWhen, KeyColumn, OdsTaskSpec, OwedParent, run_order

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_CODE = re.compile(r"^[A-Z][A-Z0-9_]{1,62}$")
_QUALIFIED = re.compile(r"^[a-z_][a-z0-9_]{0,62}\.[a-z_][a-z0-9_]{0,62}$")


class ConnectorError(ValueError):
    """A connector file is missing, unreadable or invalid; ``str()`` is a one-line message."""


class KeyModel(Strict):
    field: str = Field(min_length=1)
    column: str
    type: Literal["bigint", "text", "integer"]

    @field_validator("column")
    @classmethod
    def _column_ident(cls, v: str) -> str:
        if not _IDENT.match(v):
            raise ValueError(f"not a lower-case SQL identifier: {v!r}")
        return v

    def to_key(self) -> KeyColumn:
        return KeyColumn(self.field, self.column, self.type)


class EnvelopeModel(Strict):
    code_field: str = "code"
    ok_code: int = 0
    message_field: str = "msg"
    data_field: str = "data"


class PaginationModel(Strict):
    page_param: str = "page"
    limit_param: str = "limit"
    first_page: int = Field(1, ge=0)
    max_limit: int = Field(200, ge=1)
    max_pages: int = Field(5000, ge=1)


class WindowModel(Strict):
    start_param: str = "startTime"
    end_param: str = "endTime"
    format: Literal["%Y-%m-%d %H:%M:%S"] = "%Y-%m-%d %H:%M:%S"   # the only format supported so far
    timezone: Literal["Asia/Shanghai"] = "Asia/Shanghai"          # the only zone supported so far
    max_days: float = Field(31, ge=1 / 24, le=366)   # at least one hour per segment


@functools.cache
def _bundled_errors() -> dict[str, Any]:
    """``api.errors`` of the bundled connector file (``feiqiu.yaml``), read once: the error codes' ONE place
    (upstream-api.md §2.1), also the table of a connector file that names none."""
    raw = read_yaml(default_connector_path(), ConnectorError, "connector file")
    return dict(raw["api"]["errors"])


class ErrorsModel(Strict):
    """What each business code means (the client's :class:`~feiqiu_etl.api.client.EnvelopeRules`)."""

    retry: list[int]
    rate_limited: list[int]
    retry_after_field: str = "retryAfter"
    abort_run: list[int]
    abort_site: list[int]
    not_found: list[int]

    @classmethod
    def bundled(cls) -> "ErrorsModel":
        """The bundled connector's table (the default of ``api.errors``)."""
        return cls.model_validate(_bundled_errors())


class GapClassModel(Strict):
    """An endpoint class of the upstream's risk control (upstream-api.md §2.2 rule 2)."""

    min_gap: float = Field(ge=0, le=3600, description="documented minimum gap after the previous response, s")
    description: str = ""


class ApiModel(Strict):
    auth: Literal["bearer"] = "bearer"
    site_param: str = "siteId"
    envelope: EnvelopeModel = EnvelopeModel()
    pagination: PaginationModel = PaginationModel()
    window: WindowModel = WindowModel()
    errors: ErrorsModel = Field(default_factory=ErrorsModel.bundled)
    timeout_seconds: float = Field(30.0, gt=0, le=600)  # default of the api.timeout setting
    gap_classes: dict[str, GapClassModel] = {"standard": GapClassModel(min_gap=0.0)}
    default_gap_class: str = "standard"

    @model_validator(mode="after")
    def _gap_default(self) -> "ApiModel":
        if self.default_gap_class not in self.gap_classes:
            raise ValueError(f"default_gap_class {self.default_gap_class!r} is not one of gap_classes "
                             f"{sorted(self.gap_classes)}")
        return self


class DueWhenModel(Strict):
    """``detail.due_when`` entry: a new, changed or deleted row of task ``changed`` makes the detail of the
    parent named by the row's ``parent_field`` due (issue 25 part 6)."""

    changed: str
    parent_field: str = Field(min_length=1)


class DetailModel(Strict):
    endpoint: str = Field(pattern=r"^/")
    params: dict[str, str] = Field(description="request body key -> list-record field (copied unchanged)")
    id_column: str
    target_table: str
    data_path: list[str] = ["data"]
    list_key: str
    keys: list[KeyModel] = Field(min_length=1)
    parent: KeyModel
    refetch_on_new_fields: bool = Field(False, description="fetch the detail again when a parent's only change is "
                                        "newly appeared fields (schema drift); default: keep the stored detail")
    refetch_on_volatile: bool = Field(False, description="fetch the detail again when a parent's only change is in "
                                      "the task's volatile_fields (Q11); default: keep the stored detail")
    due_when: list[DueWhenModel] = Field([], description="tasks whose changed rows make a parent's detail due "
                                        "(the member's detail holds its cards: a changed card makes it due)")

    @field_validator("target_table")
    @classmethod
    def _qualified(cls, v: str) -> str:
        if not _QUALIFIED.match(v):
            raise ValueError(f"must be 'schema.table' in lower case, got {v!r}")
        return _check_schema(v)

    @model_validator(mode="after")
    def _columns(self) -> "DetailModel":
        extra = [] if any(k.column == self.parent.column for k in self.keys) else [self.parent.column]
        _check_columns("detail", self.keys, extra, self.parent)
        return self


RESERVED_COLUMNS = {"site_id", "payload", "content_hash", "fetched_at", "run_id", "is_deleted", "deleted_at"}
FORBIDDEN_SCHEMAS = {"dwd", "etl_meta", "information_schema", "public"}


def _check_columns(what: str, keys: list[KeyModel], extra: list[str], parent: KeyModel | None = None) -> None:
    """Key, parent and window columns of one ODS table: not reserved (warehouse-model §2.2), not repeated."""
    columns = [k.column for k in keys] + extra
    for column in columns + ([parent.column] if parent else []):
        if column in RESERVED_COLUMNS:
            raise ValueError(f"{what}: column {column!r} is reserved for the ODS bookkeeping columns")
    if len(set(columns)) != len(columns):
        raise ValueError(f"{what}: column names repeat: {columns}")
    if parent is not None:
        same = [k for k in keys if k.column == parent.column]
        if same and (same[0].field, same[0].type) != (parent.field, parent.type):
            raise ValueError(f"{what}: parent column {parent.column!r} differs from the key of the same name")


def _check_schema(table: str) -> str:
    schema = table.split(".", 1)[0]
    if schema in FORBIDDEN_SCHEMAS or schema.startswith("pg_"):
        raise ValueError(f"ODS tables may not live in schema {schema!r}")
    return table


MAX_LOOKBACK_MINUTES = 31 * 24 * 60.0
"""The longest per-task look-back: one window of the API (upstream-api.md §1.2)."""


class VolumeRange(Strict):
    """A documented volume ``[low, high]`` (records); written as a two-item list in YAML."""

    low: int = Field(ge=0)
    high: int = Field(ge=0)

    @model_validator(mode="before")
    @classmethod
    def _pair(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            if len(value) != 2:
                raise ValueError(f"expected [low, high], got {list(value)}")
            return {"low": value[0], "high": value[1]}
        return value

    @model_validator(mode="after")
    def _ordered(self) -> "VolumeRange":
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        return self

    def pair(self) -> tuple[int, int]:
        return (self.low, self.high)


_PIPELINE_KEYS = {"workers", "queue_size", "batch_size", "batch_timeout", "rate_min", "rate_max",
                  "max_consecutive_failures"}


class TaskModel(Strict):
    code: str
    endpoint: str = Field(pattern=r"^/")
    kind: Literal["snapshot", "windowed"]
    table: str | None = None
    keys: list[KeyModel] = Field(min_length=1)
    data_path: list[str] = ["data"]
    list_key: str = "list"
    window_field: str | None = None
    window_column: str | None = None
    page_size: int = Field(200, ge=1)
    pipeline: dict[str, float | int] = {}
    detail: DetailModel | None = None
    gap_class: str | None = None
    description: str = ""
    names: dict[Literal["zh", "en"], str] = Field({}, description="display names by language (zh: the contract's "
                                                  "Chinese name, upstream-api.md §4; en); the web page shows them "
                                                  "beside the code (issue 29)")
    volatile_fields: list[str] = Field([], description="fields that change without moving updateTime "
                                       "(upstream-api.md Q11); a change in them alone asks for no detail")
    lookback_minutes: float | None = Field(None, ge=0, le=MAX_LOOKBACK_MINUTES, description=
                                           "windowed: minutes before the high-water mark an incremental run reads "
                                           "again; unset: the window.lookback_hours setting (Q13)")
    expected_rows: VolumeRange | None = Field(None, description="snapshot: records of one store, [low, high] "
                                              "(upstream-api.md §4.1 Volume)")
    expected_daily_rows: VolumeRange | None = Field(None, description="windowed: records per store and day, "
                                                    "[low, high] (upstream-api.md §4.1 Volume)")

    @field_validator("code")
    @classmethod
    def _code(cls, v: str) -> str:
        if not _CODE.match(v):
            raise ValueError(f"task code must be UPPER_SNAKE_CASE, got {v!r}")
        return v

    @field_validator("table", "window_column")
    @classmethod
    def _idents(cls, v: str | None, info) -> str | None:
        if v is None:
            return v
        pattern = _QUALIFIED if info.field_name == "table" else _IDENT
        if not pattern.match(v):
            raise ValueError(f"not a valid lower-case SQL name: {v!r}")
        return _check_schema(v) if info.field_name == "table" else v

    @field_validator("pipeline")
    @classmethod
    def _pipeline_keys(cls, v: dict) -> dict:
        unknown = set(v) - _PIPELINE_KEYS
        if unknown:
            raise ValueError(f"unknown pipeline key(s) {sorted(unknown)}; allowed: {sorted(_PIPELINE_KEYS)}")
        return v

    @model_validator(mode="after")
    def _window(self) -> "TaskModel":
        if self.kind == "windowed" and not self.window_field:
            raise ValueError("a windowed task needs window_field")
        if self.kind == "snapshot" and self.window_field:
            raise ValueError("a snapshot task must not have window_field")
        window = self.window_column or (snake_case(self.window_field) if self.window_field else None)
        _check_columns("table", self.keys, [window] if window else [])
        if self.kind == "snapshot" and (self.lookback_minutes is not None or self.expected_daily_rows is not None):
            raise ValueError("a snapshot task has no lookback_minutes or expected_daily_rows (use expected_rows)")
        if self.kind == "windowed" and self.expected_rows is not None:
            raise ValueError("a windowed task has no expected_rows (use expected_daily_rows)")
        fixed = {k.field for k in self.keys} | ({self.window_field} if self.window_field else set())
        if fixed & set(self.volatile_fields) or len(set(self.volatile_fields)) != len(self.volatile_fields):
            raise ValueError(f"volatile_fields must be distinct and name neither a key nor the window field: "
                             f"{self.volatile_fields}")
        return self


class IntegrityModel(Strict):
    """How far a listing is trusted (issue 25, tasks/ods/reconcile.py): extra listings per task and run fetched
    again from page 1, the rows a day usually has for 0 rows to be unexpected, weeks of the trailing median."""

    refetch_listings: int = Field(2, ge=0, le=1000)
    zero_floor: int = Field(20, ge=0)
    zero_weeks: int = Field(4, ge=2, le=52)
    max_delete_share: float = Field(0.2, ge=0, le=1)
    max_delete_rows: int = Field(5, ge=0, le=10_000_000)


class ConnectorModel(Strict):
    name: str
    description: str = ""
    api: ApiModel = Field(default_factory=ApiModel)
    integrity: IntegrityModel = Field(default_factory=IntegrityModel)
    dwd_mapping: str | None = None
    tasks: list[TaskModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "ConnectorModel":
        for t in self.tasks:
            if t.gap_class is not None and t.gap_class not in self.api.gap_classes:
                raise ValueError(f"task {t.code}: gap_class {t.gap_class!r} is not one of api.gap_classes "
                                 f"{sorted(self.api.gap_classes)}")
            if t.page_size > self.api.pagination.max_limit:
                raise ValueError(f"task {t.code}: page_size {t.page_size} exceeds api.pagination.max_limit "
                                 f"{self.api.pagination.max_limit}")
        codes = {t.code for t in self.tasks}
        for t in self.tasks:
            for rule in (t.detail.due_when if t.detail else ()):
                if rule.changed not in codes or rule.changed == t.code:
                    raise ValueError(f"task {t.code}: detail.due_when.changed {rule.changed!r} is not another task "
                                     "of this connector")
                if len(t.keys) != 1:
                    raise ValueError(f"task {t.code}: detail.due_when needs a parent with one key column")
        seen: set[str] = set()
        tables: set[str] = set()
        for t in self.tasks:
            if t.code in seen:
                raise ValueError(f"duplicate task code {t.code}")
            seen.add(t.code)
            for table in _task_tables(t):
                if table in tables:
                    raise ValueError(f"table {table} is written by two tasks")
                tables.add(table)
        return self


def _task_tables(t: TaskModel) -> list[str]:
    return [default_table(t)] + ([t.detail.target_table] if t.detail else [])


def default_table(t: TaskModel) -> str:
    """warehouse-model §2.1: ``ODS_<NAME>`` → ``ods.<name>``."""
    if t.table:
        return t.table
    name = t.code[4:] if t.code.startswith("ODS_") else t.code
    return f"ods.{name.lower()}"


def snake_case(name: str) -> str:
    """``updateTime`` → ``update_time`` (warehouse-model §1)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _param_builder(params: Mapping[str, str]):
    items = tuple(params.items())

    def build(record: Mapping[str, Any]) -> dict:
        return {body_key: record.get(field) for body_key, field in items}

    return build


class Connector:
    """A validated connector: API conventions (``api``) plus its :class:`OdsTaskSpec` list.

    ``task(code)`` raises ``KeyError`` with the known codes for an unknown code.
    """

    def __init__(self, model: ConnectorModel, source: Path | None = None):
        self.model = model
        self.source = source
        self.api = model.api
        specs = [_to_spec(t, model.api.default_gap_class) for t in model.tasks]
        owed: dict[str, list[OwedParent]] = {}
        for spec in specs:  # the child's side of every detail.due_when rule
            for rule in (spec.detail.due_when if spec.detail else ()):
                owed.setdefault(rule.changed, []).append(
                    OwedParent(spec.code, spec.table, spec.keys[0], rule.parent_field))
        self.tasks: tuple[OdsTaskSpec, ...] = tuple(
            replace(s, owes_details=tuple(owed[s.code])) if s.code in owed else s for s in specs)
        self._by_code = {t.code: t for t in self.tasks}

    @property
    def name(self) -> str:
        return self.model.name

    def min_gap(self, gap_class: str) -> float:
        """The upstream's documented minimum gap (s) for ``gap_class`` (upstream-api.md §2.2)."""
        return self.api.gap_classes[gap_class].min_gap

    def task(self, code: str) -> OdsTaskSpec:
        try:
            return self._by_code[code.upper()]
        except KeyError:
            raise KeyError(f"unknown task {code!r}; known: {', '.join(self._by_code)}") from None

    def select(self, codes: list[str] | None) -> tuple[OdsTaskSpec, ...]:
        """The tasks of ``codes`` (None or empty: all) in run order (:func:`~feiqiu_etl.connector.spec.run_order`:
        a task whose detail is due when another task's rows changed runs after it)."""
        if not codes:
            return run_order(self.tasks)
        return run_order([self.task(c) for c in codes])

    def dwd_mapping_path(self) -> Path | None:
        if not self.model.dwd_mapping:
            return None
        base = self.source.parent if self.source else Path(__file__).parent
        return base / self.model.dwd_mapping


def _to_spec(t: TaskModel, default_gap_class: str) -> OdsTaskSpec:
    detail = None
    if t.detail:
        d = t.detail
        detail = DetailSpec(
            endpoint=d.endpoint,
            param_builder=_param_builder(d.params),
            target_table=d.target_table,
            data_path=tuple(d.data_path),
            list_key=d.list_key,
            id_column=d.id_column,
            keys=tuple(k.to_key() for k in d.keys),
            parent=d.parent.to_key(),
            refetch_on_new_fields=d.refetch_on_new_fields,
            refetch_on_volatile=d.refetch_on_volatile,
            due_when=tuple(DueWhen(r.changed, r.parent_field) for r in d.due_when),
        )
    window_column = t.window_column or (snake_case(t.window_field) if t.window_field else None)
    return OdsTaskSpec(
        code=t.code,
        endpoint=t.endpoint,
        table=default_table(t),
        kind=t.kind,
        keys=tuple(k.to_key() for k in t.keys),
        data_path=tuple(t.data_path),
        list_key=t.list_key,
        window_field=t.window_field,
        window_column=window_column,
        page_size=t.page_size,
        pipeline=dict(t.pipeline),
        detail=detail,
        gap_class=t.gap_class or default_gap_class,
        description=t.description,
        names=dict(t.names),
        volatile_fields=tuple(t.volatile_fields),
        lookback=timedelta(minutes=t.lookback_minutes) if t.lookback_minutes is not None else None,
        expected_rows=t.expected_rows.pair() if t.expected_rows else None,
        expected_daily_rows=t.expected_daily_rows.pair() if t.expected_daily_rows else None,
    )


def default_connector_path() -> Path:
    return Path(__file__).with_name("feiqiu.yaml")


def load_connector(path: str | Path | None = None) -> Connector:
    """Load and validate a connector YAML (default: the bundled Feiqiu connector).

    Raises :class:`ConnectorError` with ``"<file>: tasks[3] (ODS_X).keys[0] (memberId).type: <problem>"``.
    """
    p = Path(path) if path else default_connector_path()
    model = load_definition(p, ConnectorModel, ConnectorError, what="connector file", root="connector",
                            expect="a connector file must be a YAML mapping")
    return Connector(model, p)
