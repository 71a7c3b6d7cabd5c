"""Prove each correctness property can fail: apply a one-line sabotage, run the property, expect a failure.

Usage: ``python tests/properties/sabotage_check.py [P1 P9 ...]``. Works on a throw-away copy of the
checkout (tracked and untracked-but-not-ignored files) with ``PYTHONPATH`` pointing at the copy's
``src``, so the working tree — shared with other engineers — is never modified, and no revert can be
forgotten. Prints, per property, whether it failed (as it must) and hypothesis's falsifying example.
The table in ``SABOTAGE.md`` records one such run. Not collected by pytest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
P = "src/feiqiu_etl/pipeline/"
T = "tests/properties/"

# property, file, exact line fragment, replacement, test node id
SABOTAGES = [
    ("P1a", P + "request_scheduler.py", "        remaining = due.at - now",
     "        remaining = 0.0  # sabotage: no gap",
     T + "test_pipeline_properties.py::test_p1_requests_strictly_serial_each_sent_once_and_run_ends_after_last_write"),
    ("P1b", P + "run_book.py", "            for follow in result.follow_ups:",
     "            for follow in result.follow_ups[1:]:  # sabotage: a write follow-up is lost",
     T + "test_pipeline_properties.py::test_p1_requests_strictly_serial_each_sent_once_and_run_ends_after_last_write"),
    ("P2", P + "config.py", "return min(max(rng.uniform(self.min, self.max), self.min), self.max)",
     "return self.max + 1  # sabotage",
     T + "test_rate_limiter_properties.py"),
    ("P3", P + "config.py", "Workers = Annotated[int, Field(ge=1,", "Workers = Annotated[int, Field(ge=0,",
     T + "test_pipeline_config_properties.py::test_p3_valid_parameters_construct_and_invalid_ones_raise"),
    ("P4", "src/feiqiu_etl/config/settings.py",
     'keys = ([f"pipeline.{task.lower()}.{name}"] if task else []) + [f"pipeline.{name}"]',
     'keys = [f"pipeline.{name}"] + ([f"pipeline.{task.lower()}.{name}"] if task else [])  # sabotage',
     T + "test_pipeline_config_properties.py::test_p4_task_level_beats_task_default_beats_global_beats_default"),
    ("P4b", "src/feiqiu_etl/config/settings.py", "    SET = 5\n    FLAG = 6",
     "    SET = 6  # sabotage: --set beats the flags\n    FLAG = 5",
     T + "test_settings_layers.py::test_the_override_order_holds_across_every_layer"),
    ("P5", P + "run_book.py", "        self.result.total_skipped += result.skipped",
     "        pass  # sabotage: skipped rows not counted",
     T + "test_pipeline_properties.py::test_p5_fetched_equals_records_and_every_record_is_inserted_updated_or_skipped"),
    ("P6", P + "write_worker.py", "if len(self._batch.rows) >= self._batch_size:",
     "if len(self._batch.rows) > self._batch_size:  # sabotage",
     T + "test_pipeline_properties.py::test_p6_write_fn_never_gets_more_than_batch_size_rows"),
    ("P7", P + "cancellation.py", "            self._timer = None",
     "            self._timer = None; self._event.clear()  # sabotage: dispose un-cancels",
     T + "test_cancellation_properties.py"),
    ("P8", P + "processing_stage.py", "                self._process(item)",
     "                self._process(item) if not book.cancellation.is_cancelled "
     "else book.finish_item(item.request.scope, failed=True)  # sabotage",
     T + "test_pipeline_properties.py::test_p8_cancel_sends_nothing_more_and_writes_everything_fetched"),
    ("P9", P + "work_tracker.py", "if has_source and self._tracker._outstanding <= 1:",
     "if has_source:  # sabotage: the pre-fix seed interleaving",
     T + "test_migration_properties.py"),
    ("P10", P + "unified_pipeline.py",
     "            if request.is_detail:\n                book.result.detail_success += 1",
     "            if True:  # sabotage\n                book.result.detail_success += 1",
     T + "test_detail_mode_properties.py"),
    ("P11", P + "unified_pipeline.py", "        if abort or limit_hit:",
     "        if True:  # sabotage: any failure aborts",
     T + "test_pipeline_properties.py::test_p11_a_failed_item_is_recorded_and_the_rest_continues"),
    ("P12", P + "unified_pipeline.py",
     "limit_hit = self.consecutive_request_failures >= self.cfg.max_consecutive_failures",
     "limit_hit = self.consecutive_request_failures > self.cfg.max_consecutive_failures  # sabotage",
     T + "test_pipeline_properties.py::test_p12_reaching_the_consecutive_failure_limit_fails_the_run"),
    ("P13", P + "write_worker.py", "self._on_written(batch.rows, batch.scopes, result, error)",
     "self._on_written(batch.rows, batch.scopes, result, None)  # sabotage: failed batch not reported",
     T + "test_pipeline_properties.py::test_p13_failed_batch_leaves_nothing_and_later_batches_commit"),
    ("P14", P + "run_book.py", '            self.result.errors.append({"stage": stage, **error})',
     '            stage == "write" or self.result.errors.append({"stage": stage, **error})  # sabotage',
     T + "test_pipeline_properties.py::test_p14_statistics_are_complete_and_consistent"),
    ("P15", P + "log_buffer.py", "entries = sorted(self._buffer, key=lambda e: e.timestamp)",
     "entries = list(self._buffer)  # sabotage: no sort",
     T + "test_log_buffer_properties.py"),
    ("P16", "src/feiqiu_etl/tasks/dwd/load_task.py", "pool.map(lambda t: self._run_table(t, now), group)",
     "pool.map(lambda t: self._run_table(t, now.replace(microsecond=now.microsecond ^ 1)), group)",
     T + "test_dwd_parallel_properties.py"),
    ("P21", "src/feiqiu_etl/tasks/ods/task.py",
     "if not request.is_detail or self.spec.detail is None or stops_the_lane(exc):",
     "if not request.is_detail or self.spec.detail is None:  # sabotage: a stop counts an attempt",
     T + "test_owed_details_properties.py"),
]


def copy_checkout(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def falsifying(output: str) -> str:
    """The 'Failing test case' / 'Falsifying example' block hypothesis printed, squeezed to one line."""
    for marker in ("Failing test case:", "Falsifying example:", "Failing explicit example:"):
        if marker in output:
            block = output[output.index(marker):].split("\n\n")[0]
            lines = [re.sub(r"^[\s|E+]*", "", ln).strip() for ln in block.splitlines()]
            return " ".join(ln for ln in lines if ln)[:600]
    error = next((ln.strip() for ln in output.splitlines() if "Error" in ln), "")
    return f"(no falsifying example printed) {error[:300]}"


def main(selected: list[str]) -> int:
    missing = 0
    with tempfile.TemporaryDirectory(prefix="sabotage-") as tmp:
        work = Path(tmp)
        copy_checkout(work)
        env = {**os.environ, "PYTHONPATH": str(work / "src")}
        for prop, path, old, new, test in SABOTAGES:
            if selected and prop not in selected and prop.rstrip("ab") not in selected:
                continue
            target = work / path
            original = target.read_text(encoding="utf-8")
            if original.count(old) != 1:
                print(f"{prop}: sabotage site not found once in {path}")
                missing += 1
                continue
            target.write_text(original.replace(old, new), encoding="utf-8")
            shutil.rmtree(work / ".hypothesis", ignore_errors=True)
            run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", test],
                                 cwd=work, env=env, capture_output=True, text=True, timeout=1800)
            target.write_text(original, encoding="utf-8")
            caught = run.returncode != 0
            missing += not caught
            print(f"{prop}: {'FAILED as it must' if caught else 'PASSED - sabotage NOT detected'}")
            if caught:
                print(f"    {falsifying(run.stdout)}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
