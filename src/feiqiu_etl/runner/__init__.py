"""The runner executes a :class:`~feiqiu_etl.plan.model.RunPlan`: :class:`FlowRunner` (the run),
:class:`LaneRunner` (one token's lane, its stores sharing it fairly), :class:`TaskExecutor` (one task)
and the results with the one place where statuses combine (:mod:`.results`)."""

from feiqiu_etl.runner.flow_runner import FlowRunner, RunnerWiring, envelope_rules, new_run_id, prepare_database
from feiqiu_etl.runner.lane import LaneRunner
from feiqiu_etl.runner.results import LaneResult, RunResult, StoreResult

__all__ = ["FlowRunner", "LaneResult", "LaneRunner", "RunResult", "RunnerWiring", "StoreResult", "envelope_rules",
           "new_run_id", "prepare_database"]
