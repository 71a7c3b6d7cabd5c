"""Plan, then run: validated inputs (:mod:`.inputs`), history (:mod:`.history`), the frozen
:class:`RunPlan` (:mod:`.model`) and the pure builder (:mod:`.builder`). The fleet file is :mod:`.fleet`.

The names below are imported on first use (PEP 562): ``from feiqiu_etl.plan.fleet import load_fleet`` does not
load the builder and, through the inputs, the HTTP client (a tenth of a second of every command that reads a
fleet file; issue 27.6)."""

import importlib
from typing import Any

_FACE = {
    "build_plan": "builder", "PlanHistory": "history", "TaskHistory": "history", "read_history": "history",
    "LaneInput": "inputs", "PlanInputs": "inputs", "RunOptions": "inputs", "prepare": "inputs",
    "window_settings": "inputs", "DwdPlan": "model", "Estimate": "model", "LanePlan": "model", "RunPlan": "model",
    "Secret": "model", "StorePlan": "model", "TaskPlan": "model", "WindowSettings": "model",
}
"""The names of this face and the module of each."""

__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
