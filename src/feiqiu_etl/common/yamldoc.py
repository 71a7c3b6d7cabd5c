"""Reading YAML definition files (connector, DWD mapping, fleet, alerts), ONE loader: :class:`Strict` is the base
of every definition model (unknown keys refused, values frozen) and :func:`load_definition` reads a file,
validates it and turns a pydantic error into one line that names the file, the item and the field:
``feiqiu.yaml: tasks[3] (ODS_X).keys[0] (memberId).type: …``. No network or database I/O."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

NAME_KEYS = ("code", "table", "name", "column", "field")
M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """The base of every definition model: a key the model does not know is an error, and values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """PyYAML's safe loader (libyaml's parser where PyYAML has it: the connector file parses in 12 ms, not 90)
    that refuses a mapping with a key twice (PyYAML keeps the last one silently: a fleet file with two
    ``stores:`` under one lane would drop the first list without a word)."""

    def construct_mapping(self, node, deep=False):  # noqa: D102 - PyYAML's hook
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {_shown_key(key)} appears twice in one mapping", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


MAX_YAML_BYTES = 4 * 2**20
"""Largest YAML file read (bytes): a connector, mapping or fleet file is kilobytes; a bigger one is a mistake
and parsing it would take minutes and gigabytes without a word."""


def read_yaml(path: Path, error: type[Exception], what: str) -> Any:
    """Parse ``path`` (a regular file of at most :data:`MAX_YAML_BYTES`); raise ``error("<path>: cannot read
    <what>: …")`` or ``"<path>: invalid YAML: …"``."""
    try:
        if path.exists() and not path.is_file():
            raise error(f"{path}: cannot read {what}: not a regular file")
        if path.stat().st_size > MAX_YAML_BYTES:
            raise error(f"{path}: cannot read {what}: {path.stat().st_size:,} bytes, more than the "
                        f"{MAX_YAML_BYTES // 2**20} MiB a {what} may have")
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: cannot read {what}: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise error(f"{path}: cannot read {what}: nested too deeply") from None
    except yaml.YAMLError as exc:  # the problem and where, never the file's text (it may be a password file)
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise error(f"{path}: invalid YAML{where}: {problem}") from None


def validate(raw: Any, model: type[M], error: type[Exception], where: str, *, root: str, expect: str,
             section: str | None = None) -> M:
    """``model`` of an already-parsed document; raise ``error("<where>: <expect>")`` when ``raw`` is no mapping
    (or lacks ``section``), ``error("<where>: <describe(…)>")`` when it does not validate."""
    if not isinstance(raw, dict) or (section is not None and section not in raw):
        raise error(f"{where}: {expect}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise error(f"{where}: {describe(exc, raw, root=root, model=model)}") from None


def load_definition(path: Path, model: type[M], error: type[Exception], *, what: str, root: str, expect: str,
                    section: str | None = None) -> M:
    """Read ``path`` (:func:`read_yaml`) and :func:`validate` it: the one loader of every definition file."""
    return validate(read_yaml(path, error, what), model, error, str(path), root=root, expect=expect, section=section)


MAX_PROBLEMS = 8
"""Problems named in one line at most (the rest are counted)."""


def describe(exc: ValidationError, raw: Any, *, root: str = "document", model: Any = None) -> str:
    """Every pydantic error as ``items[0] (name).field[2] (name).key: problem``, joined by ``; `` (at most
    :data:`MAX_PROBLEMS`, then ``and N more``). An unknown key names the key it most likely means (difflib):
    a required key missing next to it, or — with ``model``, the pydantic model validated — a key the model has
    there (``token_evn: unknown key (did you mean token_env?)``); the "missing" error it explains is dropped."""
    import difflib

    errors = exc.errors()
    consumed: set[tuple] = set()
    texts: list[str] = []
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] != "extra_forbidden" or not loc:
            continue
        parent, key = loc[:-1], str(loc[-1])
        missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing" and tuple(e["loc"][:-1]) == parent]
        present = set(_child_keys(raw, parent))
        known = missing + [k for k in _fields_at(model, parent) if k not in present and k not in missing]
        match = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        if match and match[0] in missing:
            consumed.add(parent + (match[0],))
        err["_hint"] = f" (did you mean {match[0]}?)" if match else ""
    for err in errors:
        loc = tuple(err["loc"])
        if loc in consumed:
            continue
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        texts.append(f"{_where(loc, raw) or root}: {msg}{err.get('_hint', '')}")
    more = f"; and {len(texts) - MAX_PROBLEMS} more" if len(texts) > MAX_PROBLEMS else ""
    return "; ".join(texts[:MAX_PROBLEMS]) + more


def _where(loc: tuple, raw: Any) -> str:
    parts: list[str] = []
    node: Any = raw
    for head in loc:
        if isinstance(head, int) and parts:
            parts[-1] += _named(node, head)
        else:
            parts.append(_shown_key(head))
        node = _child(node, head)
    return ".".join(parts)


def _child_keys(raw: Any, loc: tuple) -> list[str]:
    node = raw
    for head in loc:
        node = _child(node, head)
    return [str(k) for k in node] if isinstance(node, dict) else []


def _fields_at(model: Any, loc: tuple) -> list[str]:
    """The field names (and aliases) of the pydantic model found at ``loc`` inside ``model`` (lists and
    optionals followed); [] when there is none."""
    import typing

    from pydantic import BaseModel

    def models_in(annotation: Any) -> list[type]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in models_in(arg)]

    current = [model] if model is not None else []
    for head in loc:
        if isinstance(head, int):
            continue
        found = []
        for m in current:
            field = m.model_fields.get(str(head))
            if field is not None:
                found += models_in(field.annotation)
        current = found
    names: list[str] = []
    for m in current:
        for name, field in m.model_fields.items():
            names.append(field.alias or name)
    return names


_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _shown_key(key: Any) -> str:
    """A key as it may be shown: a name-like key as it is; anything else (a file that is no YAML mapping parses
    into keys made of its lines, e.g. ``/etc/shadow``'s) is not echoed."""
    text = str(key)
    return text if isinstance(key, int) or _KEY.match(text) else "<a key that is no name>"


def _named(items: Any, index: int) -> str:
    """``"[3] (name)"`` when ``items[index]`` has a naming key, else ``"[3]"``."""
    item = _child(items, index)
    if isinstance(item, dict):
        for key in NAME_KEYS:
            if isinstance(item.get(key), str) and item[key]:
                return f"[{index}] ({item[key]})"
    return f"[{index}]"


def _child(node: Any, key: Any) -> Any:
    if isinstance(node, dict):
        return node.get(key)
    if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
        return node[key]
    return None
