"""How a setting travels from its flag to the lane (issue 17: at most 6 calls, one change of form).

A real ``feiqiu-etl run`` (in this process, against the simulator and PostgreSQL) with unmistakable values for
``--pipeline-rate-min``/``--pipeline-rate-max`` and ``--pipeline-batch-size``, traced with ``sys.setprofile``
in every thread. A *hop* is a call of a feiqiu_etl function one of whose arguments holds the value itself —
its text, its typed number — or as a direct field of the value object that carries it (the parsed mapping of
a layer, the task's ``PipelineConfig``, the ``Gap``, the ``RateLimiter``). An object that holds it deeper down
(``RunOptions``, ``Settings``, the plan) is handed on unchanged: no hop. The value's own methods (a
validator, ``Gap.draw``) are the value at work, not a hop (``self`` is not looked at).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import pytest

import feiqiu_etl
from feiqiu_etl.cli import main
from feiqiu_etl.connector.windows import fmt
from feiqiu_etl.simulator import Simulator
from flowkit import ANCHOR, sim_config

SOURCE = str(Path(feiqiu_etl.__file__).parent)
RATE_MIN, RATE_MAX, BATCH = "0.0123", "0.0234", "777"
READERS = {"estimates.plan_estimate"}  # the plan's request estimate reads the gap; it is not on the way to the lane


class Tracer:
    """Records, in call order, each function that received one of ``values`` (text or typed) as a hop."""

    def __init__(self, *values: str):
        self.texts = set(values)
        self.numbers = {float(v) for v in values}
        self.hops: dict[str, list[tuple[str, str]]] = {v: [] for v in values}
        self.lock = threading.Lock()

    def _form(self, value) -> tuple[str, str] | None:
        if isinstance(value, str) and value in self.texts:
            return value, "text"
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value in self.numbers:
            return next(v for v in self.texts if float(v) == value), "typed"
        return None

    def _held(self, value) -> list[tuple[str, str]]:
        found = [self._form(value)]
        if isinstance(value, Mapping):
            found += [self._form(v) for v in list(value.values())]
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            found += [self._form(v) for v in list(vars(value).values())]
        return [f for f in found if f is not None]

    def __call__(self, frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(SOURCE):
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount
                                 + bool(code.co_flags & 4) + bool(code.co_flags & 8)]
        found = []
        for name in names:
            if name in ("self", "cls"):
                continue
            value = frame.f_locals.get(name)
            if name in code.co_varnames[code.co_argcount + code.co_kwonlyargcount:] and isinstance(value, dict):
                found += [f for v in value.values() for f in self._held(v)]  # **kwargs
            else:
                found += self._held(value)
        where = f"{Path(code.co_filename).stem}.{code.co_qualname}"
        with self.lock:
            for text, form in found:
                if (where, form) not in self.hops[text]:
                    self.hops[text].append((where, form))


@pytest.fixture
def traced_run(pg_dsn, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no .env of the developer's
    for name in list(__import__("os").environ):
        if name.startswith(("PIPELINE_", "FEIQIU_", "API_")):
            monkeypatch.delenv(name)
    tracer = Tracer(RATE_MIN, RATE_MAX, BATCH)
    with Simulator(sim_config(seed=81, days=1)) as sim:
        args = ["run", "--api-base", sim.base_url, "--token", sim.config.token, "--site-id",
                str(sim.config.site_ids[0]), "--dsn", pg_dsn, "--tasks", "ODS_PAYMENT", "--no-dwd", "--json",
                "--no-progress", "--unsafe-gaps", "--window-start", fmt(ANCHOR - timedelta(days=1)),
                "--window-end", fmt(ANCHOR), "--pipeline-rate-min", RATE_MIN, "--pipeline-rate-max", RATE_MAX,
                "--pipeline-batch-size", BATCH, "--set", "api.retry_backoff=0.01"]
        threading.setprofile(tracer)
        sys.setprofile(tracer)
        try:
            with pytest.raises(SystemExit) as exit_:
                main.main(args, standalone_mode=False)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    assert exit_.value.code == 0
    return tracer.hops


def _path(hops: list[tuple[str, str]]) -> list[str]:
    return [where for where, _ in hops if where not in READERS]


def test_the_gap_flag_reaches_the_lane_in_six_calls_changing_form_once(traced_run):
    for flag in (RATE_MIN, RATE_MAX):
        hops = traced_run[flag]
        path = _path(hops)
        assert path[:6] == ["options._collect_flag", "settings.load_settings", "settings.read_layer",
                            "unified_pipeline.UnifiedPipeline.__init__", "rate_limiter.RateLimiter.__init__",
                            "request_scheduler.RequestScheduler.send"], hops
        forms = [form for _, form in hops]
        assert forms == sorted(forms, key=["text", "typed"].index)  # text, then typed: one change of form
        assert [where for where, form in hops if form == "text"] == path[:3]  # typed in read_layer, only there
        assert set(path[6:]) <= {"request_scheduler.RequestScheduler._wait_gap"}  # inside the lane


def test_the_batch_size_flag_reaches_the_writer_in_five_calls_changing_form_once(traced_run):
    hops = traced_run[BATCH]
    assert _path(hops) == ["options._collect_flag", "settings.load_settings", "settings.read_layer",
                           "unified_pipeline.UnifiedPipeline.__init__", "write_worker.WriteWorker.__init__"], hops
    forms = [form for _, form in hops]
    assert forms == sorted(forms, key=["text", "typed"].index)
