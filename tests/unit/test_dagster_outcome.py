"""The Dagster verdict of a run (feiqiu_etl.dagster.outcome): which stores fail their step, what PARTIAL does,
and that only feiqiu_etl.dagster imports dagster."""

from __future__ import annotations

import ast
from pathlib import Path

import feiqiu_etl
from feiqiu_etl.dagster.outcome import judge_dwd, judge_ods
from feiqiu_etl.pipeline.models import PipelineResult
from feiqiu_etl.runner.results import LaneResult, RunResult, StoreResult
from feiqiu_etl.statistics import LaneTotals
from feiqiu_etl.tasks.ods.task import TaskRun


def _task(site: int, status: str = "SUCCESS", errors=(), rejected: int = 0) -> TaskRun:
    result = PipelineResult(status=status, total_requests=5, completed_requests=5, total_inserted=7, total_skipped=3,
                            rate_limited=rejected, errors=list(errors))
    return TaskRun("ODS_MEMBER", site, "ods.member", None, result, lane="north")


def _run(*stores: StoreResult, lane_reason: str | None = None) -> RunResult:
    lane = LaneResult("north", "feiqiu:0123456789ab", list(stores), reason=lane_reason,
                      statistics=LaneTotals(seconds=12.5))
    run = RunResult("20240304T000000Z-abcdef12", "feiqiu", lanes=[lane])
    run.finish(cancelled=False)
    return run


def test_a_partial_store_is_materialized_with_its_errors_and_a_failed_one_fails_the_step():
    ok = StoreResult(1, "旗舰店", [_task(1)])
    partial = StoreResult(2, None, [_task(2), _task(2, "PARTIAL", [{"stage": "write", "error": "boom"}], rejected=1)])
    refused = StoreResult(3, None, [_task(3, "FAILED")], reason="40103 no permission for this store")
    run = _run(ok, partial, refused)
    verdict = judge_ods(run, [1, 2])
    assert verdict.failure is None and len(verdict.warnings) == 1 and "store 2 PARTIAL" in verdict.warnings[0]
    m = verdict.metadata["2"]
    assert (m["status"], m["rows"], m["requests"], m["rejections"], m["errors"]) == ("PARTIAL", 20, 10, 1, 1)
    assert m["first_errors"] == "ODS_MEMBER write: boom" and m["lane_key"] == "feiqiu:0123456789ab"
    assert verdict.metadata["1"]["store"] == "旗舰店" and verdict.metadata["1"]["lane_seconds"] == 12.5
    assert judge_ods(run, [1, 2], fail_on_partial=True).failure.count("store 2 PARTIAL") == 1
    failed = judge_ods(run, [1, 3])
    assert "store 3 FAILED: 40103 no permission" in failed.failure and run.run_id in failed.failure
    assert "store 9: not in the run" in judge_ods(run, [9]).failure


def test_a_stopped_lane_fails_every_store_of_the_step_with_the_lane_reason():
    run = _run(StoreResult(1, None, [_task(1, "FAILED")]), lane_reason="invalid token (40101)")  # as refuse() leaves it
    verdict = judge_ods(run, [1])
    assert run.status == "FAILED" and "store 1 FAILED: invalid token (40101)" in verdict.failure


def test_dwd_verdicts():
    run = RunResult("r1", "feiqiu", dwd={"status": "PARTIAL", "succeeded": 3, "failed": 1,
                                        "tables": [{"inserted": 4, "updated": 1, "closed": 1}],
                                        "errors": [{"table": "dim_member", "error": "boom"}]})
    run.finish(cancelled=False)
    partial = judge_dwd(run)
    assert partial.failure is None and "dim_member: boom" in partial.warnings[0]
    assert partial.metadata[""]["rows_inserted"] == 4 and partial.metadata[""]["tables_failed"] == 1
    run.dwd["status"], run.dwd["succeeded"] = "FAILED", 0
    run.finish(cancelled=False)
    assert "DWD load FAILED: dim_member: boom" in judge_dwd(run).failure


def test_only_the_dagster_package_imports_dagster():
    root = Path(feiqiu_etl.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if "dagster" in path.relative_to(root).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] == "dagster"]
    assert offenders == []


def test_bans_are_the_lanes_and_the_banned_seconds_the_stores():
    task = _task(1)
    task.result.banned_seconds = 12.5
    lane = LaneResult("north", "feiqiu:0123456789ab", [StoreResult(1, None, [task]), StoreResult(2, None, [_task(2)])],
                      statistics=LaneTotals(seconds=40.0, banned=2, banned_seconds=12.5))
    run = RunResult("20240304T000000Z-abcdef12", "feiqiu", lanes=[lane])
    run.finish(cancelled=False)
    verdict = judge_ods(run, [1, 2])
    assert (verdict.metadata["1"]["bans"], verdict.metadata["1"]["banned_seconds"]) == (2, 12.5)
    assert (verdict.metadata["2"]["bans"], verdict.metadata["2"]["banned_seconds"]) == (2, 0)
