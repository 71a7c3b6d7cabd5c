"""Plan, then run: validated inputs (:mod:`.inputs`), history (:mod:`.history`), the frozen
:class:`RunPlan` (:mod:`.model`) and the pure builder (:mod:`.builder`). The fleet file is :mod:`.fleet`.

The names below are imported on first use (PEP 562): ``from feiqiu_etl.plan.fleet import load_fleet`` does not
load the builder and, through the inputs, the HTTP client (a tenth of a second of every command that reads a
fleet file; issue 27.6)."""

from feiqiu_etl.common.lazyface import lazy_face

_FACE = {
    "build_plan": ".builder", "PlanHistory": ".history", "TaskHistory": ".history", "read_history": ".history",
    "LaneInput": ".inputs", "PlanInputs": ".inputs", "RunOptions": ".inputs", "prepare": ".inputs",
    "window_settings": ".inputs", "DwdPlan": ".model", "Estimate": ".model", "LanePlan": ".model", "RunPlan": ".model",
    "Secret": ".model", "StorePlan": ".model", "TaskPlan": ".model", "WindowSettings": ".model",
}
"""The names of this face and the module of each."""

__all__ = sorted(_FACE)


__getattr__ = lazy_face(__name__, _FACE, globals())
