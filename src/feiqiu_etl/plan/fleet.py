"""The fleet file: named lanes (one per API token), their stores and optional per-lane settings.

A chain of stores may hold several tokens; risk control is per token across all of its stores and endpoints
(upstream-api.md §1.1, §2.2), so the unit of serial work is a token's *lane*. A fleet file lists the lanes::

    api_base: https://open.feiqiu.example      # optional; --api-base / FEIQIU_API_BASE otherwise
    lanes:
      - name: north
        token_env: FQ_TOKEN_NORTH               # the token is read from this environment variable
        stores:
          - {site_id: 8640015201004417, name: 旗舰店}
          - {site_id: 8640015201004418}
        pipeline: {rate_min: 6, rate_max: 20}   # optional, this lane only (any pipeline.* key)
        deadline: "06:00"                       # optional, this lane only (run.deadline)
      - name: south
        token_env: FQ_TOKEN_SOUTH
        stores: [{site_id: 8640015201004419}]

A token is never written in the file: only the *name* of the variable that holds it. Validation errors are
one line naming the file, the lane and the field (``fleet.yaml: lanes[1] (south).token_env: …``). Reading
the file is the only I/O here; resolving tokens from the environment happens in :func:`resolve_tokens`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from pydantic import Field, field_validator, model_validator

from feiqiu_etl.api.tokens import token_problem
from feiqiu_etl.api.urls import base_url_problem
from feiqiu_etl.common.yamldoc import Strict, load_definition

_LANE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
MAX_SITE_ID = 2**53


class FleetError(ValueError):
    """A fleet file is missing, unreadable or invalid; ``str()`` is one line naming file, lane and field."""


class StoreModel(Strict):
    site_id: int = Field(gt=0, lt=MAX_SITE_ID, strict=True)
    name: str | None = Field(None, max_length=100)


class LaneModel(Strict):
    name: str
    token_env: str
    api_base: str | None = None
    stores: list[StoreModel] = Field(min_length=1)
    tasks: list[str] | None = None
    pipeline: dict[str, Any] = {}
    deadline: Any = None

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: Any) -> str | None:
        from feiqiu_etl.deadline import Deadline

        if v is None:
            return None
        if not isinstance(v, str):  # YAML reads 6:30:00 as the number 23400
            raise ValueError(f"write the deadline in quotes, e.g. deadline: \"06:00\" (YAML read {v!r})")
        return Deadline.parse(v).text

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _LANE_NAME.match(v):
            raise ValueError(f"lane names are 1-40 lower-case letters, digits, '-' or '_', got {v!r}")
        return v

    @field_validator("token_env")
    @classmethod
    def _env(cls, v: str) -> str:
        if not _ENV_NAME.match(v):  # the value is not shown: it may be a token pasted by mistake
            raise ValueError("must be the NAME of an environment variable in upper case (e.g. FQ_TOKEN_NORTH), "
                             "never the token itself")
        return v

    @field_validator("api_base")
    @classmethod
    def _base(cls, v: str | None) -> str | None:
        problem = base_url_problem(v) if v is not None else None
        if problem:
            from feiqiu_etl.textsafe import redact_url

            raise ValueError(f"{problem}, got {redact_url(v)!r}")
        return v

    @model_validator(mode="after")
    def _unique_stores(self) -> "LaneModel":
        ids = [s.site_id for s in self.stores]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a store is listed twice: {sorted({i for i in ids if ids.count(i) > 1})}")
        return self


class FleetModel(Strict):
    api_base: str | None = None
    lanes: list[LaneModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "FleetModel":
        names = [lane.name for lane in self.lanes]
        if len(set(names)) != len(names):
            raise ValueError(f"lane names repeat: {names}")
        seen: dict[int, str] = {}
        for lane in self.lanes:
            for store in lane.stores:
                if store.site_id in seen:
                    raise ValueError(f"store {store.site_id} is in lanes {seen[store.site_id]} and {lane.name}: "
                                     "a store belongs to one token's lane")
                seen[store.site_id] = lane.name
        envs = [lane.token_env for lane in self.lanes]
        if len(set(envs)) != len(envs):
            raise ValueError("two lanes read the same token_env: one token is one lane (merge their stores)")
        problem = base_url_problem(self.api_base) if self.api_base is not None else None
        if problem:
            from feiqiu_etl.textsafe import redact_url

            raise ValueError(f"api_base {problem}, got {redact_url(self.api_base)!r}")
        return self


def load_fleet(path: str | Path) -> FleetModel:
    """Read and validate a fleet file. Raises :class:`FleetError` (one line)."""
    return load_definition(Path(path), FleetModel, FleetError, what="fleet file", root="fleet",
                           expect="a fleet file must be a YAML mapping with a 'lanes' list")


def resolve_tokens(fleet: FleetModel, environ: Mapping[str, str], path: str | Path = "fleet") -> dict[str, str]:
    """``{lane name: token}`` from the environment. Raises :class:`FleetError` naming the lane and the
    variable (never a token) when one is unset or empty, or cannot be sent (:mod:`feiqiu_etl.api.tokens`)."""
    out: dict[str, str] = {}
    for i, lane in enumerate(fleet.lanes):
        token = (environ.get(lane.token_env) or "").strip()
        if not token:
            raise FleetError(f"{path}: lanes[{i}] ({lane.name}).token_env: environment variable "
                             f"{lane.token_env} is not set")
        if problem := token_problem(token):
            raise FleetError(f"{path}: lanes[{i}] ({lane.name}).token_env: the token in {lane.token_env} {problem}")
        out[lane.name] = token
    return out


def schedule_from_fleet(path: str | Path, task_codes: Iterable[str]) -> "Schedule":
    """The :class:`Schedule` of a fleet file: each lane's stores with the lane's ``tasks:`` (upper-cased), or
    ``task_codes`` (the connector's) when it names none. Raises :class:`FleetError`
    (one line) for a missing or invalid file, or a task the connector does not have."""
    from feiqiu_etl.registry.freshness import Schedule

    fleet = load_fleet(path)
    codes = tuple(task_codes)
    known = set(codes)
    by: dict[int, tuple[str, ...]] = {}
    for i, lane in enumerate(fleet.lanes):
        tasks = tuple(t.strip().upper() for t in lane.tasks) if lane.tasks else codes
        unknown = [t for t in tasks if t not in known]
        if unknown:
            raise FleetError(f"{path}: lanes[{i}] ({lane.name}).tasks: unknown task {unknown[0]} "
                             "(feiqiu-etl tasks lists them)")
        for store in lane.stores:
            by[store.site_id] = tasks
    return Schedule(by_store=by, source=str(path))
