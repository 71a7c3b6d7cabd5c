"""The DWD mapping (``feiqiu.dwd.yaml``): which ODS table feeds which DWD table, and how each column is cast.

The YAML is validated with pydantic and turned into frozen dataclasses (:class:`DwdMapping`,
:class:`DwdTable`, :class:`DwdColumn`). Every problem is reported as one line naming the file, the table and
the column (:class:`DwdMappingError`). The rules checked here are the ones of warehouse-model §3–§5: a cast
helper produces only its documented SQL types, every non-key column of a dimension is either tracked or
type-1 (never both), and no ``timestamptz`` column is tracked (§4.1). This module never touches a database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from feiqiu_etl.common.yamldoc import Strict, read_yaml, validate

CastName = Literal["TXT", "INT", "ID", "REF", "SREF", "MNY", "DEC", "TS", "DT", "BOOL", "JSONB"]
SqlType = Literal[
    "text", "smallint", "integer", "bigint", "numeric(12,2)", "numeric(6,4)",
    "date", "timestamptz", "boolean", "jsonb",
]
TableKind = Literal["dimension", "fact"]

#: warehouse-model §3: the SQL types each cast helper may produce.
CAST_TYPES: dict[str, frozenset[str]] = {
    "TXT": frozenset({"text"}),
    "INT": frozenset({"integer", "smallint"}),
    "ID": frozenset({"bigint"}),
    "REF": frozenset({"bigint", "integer"}),
    "SREF": frozenset({"bigint"}),
    "MNY": frozenset({"numeric(12,2)"}),
    "DEC": frozenset({"numeric(6,4)"}),
    "TS": frozenset({"timestamptz"}),
    "DT": frozenset({"date"}),
    "BOOL": frozenset({"boolean"}),
    "JSONB": frozenset({"jsonb"}),
}

# Names start with a letter: names starting with "_" are kept for the engine's own aliases (staging).
_IDENT = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_QUALIFIED = re.compile(r"^[a-z][a-z0-9_]{0,62}\.[a-z][a-z0-9_]{0,62}$")
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_KEY_CASTS = frozenset({"ID", "TXT", "INT"})
# Columns every DWD table gets from the engine (warehouse-model §4.1, §5.1); a mapping may not reuse them.
RESERVED_COLUMNS = frozenset({
    "site_id", "change_hash", "version_no", "valid_from", "valid_to", "is_current", "run_id", "loaded_at",
    "is_deleted", "src_content_hash", "src_fetched_at",
})


class DwdMappingError(ValueError):
    """The DWD mapping file is missing, unreadable or invalid; ``str()`` is one line naming file, table, column."""


# ---------------------------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class WhenSpec:
    """``CASE WHEN p->>field = equals THEN <cast> END`` (warehouse-model §5.2, dwd_payment/dwd_refund)."""

    field: str
    equals: str


@dataclass(frozen=True)
class DwdColumn:
    """One mapped column: ``name`` of ``sql_type`` = ``cast(path)`` (warehouse-model §3).

    ``path`` is the payload field split on dots: ``("level", "levelId")`` reads ``p->'level'->>'levelId'``.
    """

    name: str
    sql_type: str
    cast: str
    path: tuple[str, ...]
    when: WhenSpec | None = None

    @property
    def field(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True)
class DwdTable:
    """One DWD table: ``target`` (``"dwd.dim_member"``) loaded from ``source`` (``"ods.member"``).

    ``business_key`` names the BK columns (``site_id`` is implied and always first). For dimensions,
    ``tracked`` lists the hashed columns in hash order and ``type1`` the in-place columns; both are empty
    for facts.
    """

    target: str
    kind: TableKind
    source: str
    business_key: tuple[str, ...]
    columns: tuple[DwdColumn, ...]
    tracked: tuple[str, ...] = ()
    type1: tuple[str, ...] = ()

    @property
    def schema(self) -> str:
        return self.target.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.target.split(".", 1)[1]

    @property
    def source_schema(self) -> str:
        return self.source.split(".", 1)[0]

    @property
    def source_name(self) -> str:
        return self.source.split(".", 1)[1]

    @property
    def is_dimension(self) -> bool:
        return self.kind == "dimension"

    @property
    def key(self) -> tuple[str, ...]:
        """The full key: ``("site_id", *business_key)``."""
        return ("site_id", *self.business_key)

    @property
    def surrogate_key(self) -> str:
        """``<dim>_sk``, the identity column of a dimension (warehouse-model §4.1)."""
        return f"{self.name}_sk"

    def column(self, name: str) -> DwdColumn:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.target} has no column {name!r}")

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


@dataclass(frozen=True)
class DwdMapping:
    """The whole DWD layer: dimensions (merged first) and facts, each in file order."""

    dimensions: tuple[DwdTable, ...]
    facts: tuple[DwdTable, ...]
    source_file: Path | None = None

    @property
    def tables(self) -> tuple[DwdTable, ...]:
        return self.dimensions + self.facts

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tables)

    def table(self, name: str) -> DwdTable:
        """Look a table up by bare (``dim_member``) or qualified (``dwd.dim_member``) name.

        Raises ``KeyError`` listing the known names.
        """
        for t in self.tables:
            if name in (t.name, t.target):
                return t
        raise KeyError(f"unknown DWD table {name!r}; known: {', '.join(self.names)}")

    def select(self, names: list[str] | None) -> tuple[DwdTable, ...]:
        """The tables named (all when ``names`` is None or empty), in mapping order.

        Raises ``ValueError`` naming the unknown names and listing the known ones.
        """
        if not names:
            return self.tables
        known = {n for t in self.tables for n in (t.name, t.target)}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"unknown DWD table(s) {', '.join(unknown)}; known: {', '.join(self.names)}")
        wanted = set(names)
        return tuple(t for t in self.tables if t.name in wanted or t.target in wanted)


# ---------------------------------------------------------------------------------------- pydantic models


def _check_ident(v: str) -> str:
    if not _IDENT.match(v):
        raise ValueError(f"not a lower-case SQL identifier starting with a letter: {v!r}")
    return v


def _check_qualified(v: str) -> str:
    if not _QUALIFIED.match(v):
        raise ValueError(f"must be 'schema.table' in lower case, got {v!r}")
    return v


class WhenModel(Strict):
    field: str = Field(pattern=_FIELD.pattern)
    equals: str = Field(min_length=1)


class ColumnModel(Strict):
    column: str
    type: SqlType
    cast: CastName
    field: str = Field(pattern=_FIELD.pattern)
    when: WhenModel | None = None

    @field_validator("column")
    @classmethod
    def _column_ident(cls, v: str) -> str:
        return _check_ident(v)

    @model_validator(mode="after")
    def _cast_type(self) -> "ColumnModel":
        if self.column in RESERVED_COLUMNS:
            raise ValueError(f"column name {self.column!r} is reserved for the engine")
        allowed = CAST_TYPES[self.cast]
        if self.type not in allowed:
            raise ValueError(
                f"cast {self.cast} produces {' or '.join(sorted(allowed))}, not {self.type} (warehouse-model §3)"
            )
        return self

    def to_column(self) -> DwdColumn:
        when = WhenSpec(self.when.field, self.when.equals) if self.when else None
        return DwdColumn(self.column, self.type, self.cast, tuple(self.field.split(".")), when)


class _TableModel(Strict):
    table: str
    source: str
    business_key: list[str] = Field(min_length=1)
    columns: list[ColumnModel] = Field(min_length=1)

    @field_validator("table", "source")
    @classmethod
    def _qualified(cls, v: str) -> str:
        return _check_qualified(v)

    @model_validator(mode="after")
    def _columns_and_key(self):
        by_name: dict[str, ColumnModel] = {}
        for c in self.columns:
            if c.column in by_name:
                raise ValueError(f"column {c.column!r} is mapped twice")
            by_name[c.column] = c
        for k in self.business_key:
            if k not in by_name:
                raise ValueError(f"business key column {k!r} is not among the columns")
            if by_name[k].cast not in _KEY_CASTS or by_name[k].when:
                raise ValueError(f"business key column {k!r} must use {', '.join(sorted(_KEY_CASTS))} without 'when'")
        if len(set(self.business_key)) != len(self.business_key):
            raise ValueError("business_key repeats a column")
        return self


class FactModel(_TableModel):
    def to_table(self) -> DwdTable:
        return DwdTable(self.table, "fact", self.source, tuple(self.business_key),
                        tuple(c.to_column() for c in self.columns))


class DimensionModel(_TableModel):
    tracked: list[str] = Field(min_length=1)
    type1: list[str] = []

    @model_validator(mode="after")
    def _tracked_type1(self) -> "DimensionModel":
        by_name = {c.column: c for c in self.columns}
        for role, names in (("tracked", self.tracked), ("type1", self.type1)):
            for n in names:
                if n not in by_name:
                    raise ValueError(f"{role} column {n!r} is not among the columns")
                if n in self.business_key:
                    raise ValueError(f"{role} column {n!r} is part of the business key")
            if len(set(names)) != len(names):
                raise ValueError(f"{role} lists a column twice")
        both = sorted(set(self.tracked) & set(self.type1))
        if both:
            raise ValueError(f"column(s) {', '.join(both)} are both tracked and type-1")
        unassigned = [c for c in by_name if c not in self.business_key and c not in self.tracked
                      and c not in self.type1]
        if unassigned:
            raise ValueError(f"column(s) {', '.join(unassigned)} are neither tracked nor type-1")
        surrogate = f"{self.table.split('.', 1)[1]}_sk"
        if surrogate in by_name:
            raise ValueError(f"column name {surrogate!r} is reserved for the surrogate key")
        ts = [n for n in self.tracked if by_name[n].type == "timestamptz"]
        if ts:
            raise ValueError(f"timestamptz column(s) {', '.join(ts)} cannot be tracked (warehouse-model §4.1)")
        return self

    def to_table(self) -> DwdTable:
        return DwdTable(self.table, "dimension", self.source, tuple(self.business_key),
                        tuple(c.to_column() for c in self.columns), tuple(self.tracked), tuple(self.type1))


class MappingModel(Strict):
    dimensions: list[DimensionModel] = []
    facts: list[FactModel] = []

    @model_validator(mode="after")
    def _unique_targets(self) -> "MappingModel":
        seen: set[str] = set()
        for t in [*self.dimensions, *self.facts]:
            name = t.table.split(".", 1)[1]
            if name in seen:
                raise ValueError(f"DWD table name {name!r} is used twice")
            seen.add(name)
        if not seen:
            raise ValueError("the mapping has no dimensions and no facts")
        return self


# -------------------------------------------------------------------------------------------------- loading


def default_mapping_path() -> Path:
    """The bundled Feiqiu mapping, ``connector/feiqiu.dwd.yaml``."""
    return Path(__file__).resolve().parent / "feiqiu.dwd.yaml"


def load_dwd_mapping(path: str | Path | None = None) -> DwdMapping:
    """Load and validate a DWD mapping YAML (default: the bundled ``feiqiu.dwd.yaml``).

    Returns a :class:`DwdMapping`. Raises :class:`DwdMappingError` with one line such as
    ``"feiqiu.dwd.yaml: dimensions[0] (dwd.dim_member).columns[7] (gender): cast INT produces …"``.
    """
    p = Path(path) if path else default_mapping_path()
    return parse_dwd_mapping(read_yaml(p, DwdMappingError, "DWD mapping"), p)


def parse_dwd_mapping(raw: object, source: Path | None = None) -> DwdMapping:
    """Validate an already-parsed mapping document (see :func:`load_dwd_mapping`)."""
    where = str(source) if source else "<mapping>"
    model = validate(raw, MappingModel, DwdMappingError, where, root="mapping",
                     expect="a DWD mapping must be a YAML mapping with 'dimensions' and 'facts'")
    return DwdMapping(
        dimensions=tuple(d.to_table() for d in model.dimensions),
        facts=tuple(f.to_table() for f in model.facts),
        source_file=source,
    )
