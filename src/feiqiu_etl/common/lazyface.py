"""A package face whose names are imported on first use (PEP 562): ``from pkg import Name`` works as before,
but importing one submodule of ``pkg`` no longer loads every other one (issue 27.6: read-only commands in under
a second). One helper for every such face (alerts, api, plan, tasks.dwd)."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_face(package: str, names: Mapping[str, str], namespace: dict) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``names`` maps each public name to its module (relative to
    ``package`` when it starts with ``.``, else absolute); the value found is kept in ``namespace`` (the face's
    ``globals()``) so it is looked up once. Raises ``AttributeError`` for any other name."""
    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(package + module if module.startswith(".") else module), name)
        namespace[name] = value
        return value

    return __getattr__
