"""Plan, then run: validated inputs (:mod:`.inputs`), history (:mod:`.history`), the frozen
:class:`RunPlan` (:mod:`.model`) and the pure builder (:mod:`.builder`). The fleet file is :mod:`.fleet`."""

from feiqiu_etl.plan.builder import build_plan
from feiqiu_etl.plan.history import PlanHistory, TaskHistory, read_history
from feiqiu_etl.plan.inputs import LaneInput, PlanInputs, RunOptions, prepare, window_settings
from feiqiu_etl.plan.model import DwdPlan, Estimate, LanePlan, RunPlan, Secret, StorePlan, TaskPlan, WindowSettings

__all__ = [
    "DwdPlan", "Estimate", "LaneInput", "LanePlan", "PlanHistory", "PlanInputs", "RunOptions", "RunPlan", "Secret",
    "StorePlan", "TaskHistory", "TaskPlan", "WindowSettings", "build_plan", "prepare", "read_history",
    "window_settings",
]
