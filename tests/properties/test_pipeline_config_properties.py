"""Properties 3 and 4 (spec §5): ``PipelineConfig`` validation and layered loading.

P3 compares construction against an independent statement of the documented rules (spec §3.1 plus the
engine's stricter ones: integer counts, ``batch_timeout > 0``, rates >= 0, a failure limit >= 1).
P4 builds random layers — built-in defaults, global ``pipeline.<key>``, the connector's task defaults,
task-level ``pipeline.<task_code>.<key>`` — with values as numbers or as environment strings, and checks
the precedence task-level > task default > global > default for every key, through the settings model
(``tests/properties/test_settings_layers.py`` adds the other layers: .env, environment, flag, fleet lane).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from feiqiu_etl.config import load_settings
from feiqiu_etl.pipeline.config import PipelineConfig

INT_KEYS = ("workers", "queue_size", "batch_size", "max_consecutive_failures")
FLOAT_KEYS = ("batch_timeout", "rate_min", "rate_max")
DEFAULTS = {"workers": 2, "queue_size": 100, "batch_size": 1000, "batch_timeout": 5.0,
            "rate_min": 5.0, "rate_max": 20.0, "max_consecutive_failures": 10}


UPPER = {"workers": 256, "queue_size": 1_000_000, "batch_size": 1_000_000, "max_consecutive_failures": 1_000_000,
         "batch_timeout": 3600.0, "rate_min": 86400.0, "rate_max": 86400.0}


def is_valid(v: dict) -> bool:
    """The rules, written independently of ``PipelineConfig.__post_init__`` (docs/reference/settings.md: sane upper limits)."""
    for k in INT_KEYS:
        if type(v[k]) is not int or not 1 <= v[k] <= UPPER[k]:
            return False
    for k in FLOAT_KEYS:
        if type(v[k]) not in (int, float) or not math.isfinite(v[k]) or v[k] > UPPER[k]:
            return False
    return v["batch_timeout"] > 0 and 0 <= v["rate_min"] <= v["rate_max"]


VALID = {
    "workers": st.integers(1, 64), "queue_size": st.integers(1, 10_000), "batch_size": st.integers(1, 10_000),
    "max_consecutive_failures": st.integers(1, 100),
    "batch_timeout": st.one_of(st.sampled_from([1e-9, 5.0, 1]), st.floats(1e-6, 600.0)),
}
BROKEN = {  # just past each rule's boundary (both ends), plus wrong types and non-finite values
    **{k: st.sampled_from([0, 0, 0, -1, True, 2.0, "3", None, UPPER[k] + 1]) for k in INT_KEYS},
    "batch_timeout": st.sampled_from([0.0, -0.0, -1e-9, -1.0, math.nan, math.inf, 3600.001, "5", None]),
    "rate_min": st.sampled_from([-1e-9, -1.0, math.nan, None, "5"]),
    "rate_max": st.sampled_from([-1.0, math.nan, math.inf, 86400.5, None]),
}


@st.composite
def config_values(draw) -> dict:
    """A valid configuration with zero, one or two fields broken at a boundary (or rate_min > rate_max)."""
    values = {k: draw(v) for k, v in VALID.items()}
    values["rate_min"] = draw(st.one_of(st.sampled_from([0, 0.0, 5.0]), st.floats(0.0, 60.0)))
    gap = draw(st.one_of(st.sampled_from([0.0, 1e-9, 15.0, math.inf, 86400.0]), st.floats(0.0, 60.0)))
    values["rate_max"] = values["rate_min"] + gap
    if draw(st.sampled_from([False, False, False, True])) and gap > 0:  # swap: rate_min just above rate_max
        values["rate_min"], values["rate_max"] = values["rate_max"], values["rate_min"]
    broken = draw(st.sampled_from([0, 1, 1, 1, 2]))
    for key in draw(st.sets(st.sampled_from(sorted(BROKEN)), min_size=broken, max_size=broken)):
        values[key] = draw(BROKEN[key])
    return values


GOOD = {"workers": 1, "queue_size": 1, "batch_size": 1, "max_consecutive_failures": 1, "batch_timeout": 1e-9,
        "rate_min": 0.0, "rate_max": 0.0}
EDGES = [GOOD, {**GOOD, "rate_min": 5.0, "rate_max": 5.0}, {**GOOD, "rate_min": 5.0 + 1e-9, "rate_max": 5.0},
         {**GOOD, "rate_min": -1e-9}, {**GOOD, "batch_timeout": 0.0}] + [{**GOOD, k: 0} for k in INT_KEYS]


def with_examples(cases: list[dict]):
    """Run the smallest valid values and each rule one step past its boundary in every run."""
    def apply(test):
        for values in reversed(cases):
            test = example(values=values)(test)
        return test
    return apply


# Feature: etl-unified-pipeline, Property 3: PipelineConfig 构造与验证
@given(values=config_values())
@with_examples(EDGES)
def test_p3_valid_parameters_construct_and_invalid_ones_raise(values):
    if is_valid(values):
        config = PipelineConfig(**values)
        assert {k: getattr(config, k) for k in values} == values
    else:
        with pytest.raises(ValueError):
            PipelineConfig(**values)


def layered(task_code, global_layer, task_layer, task_defaults, other_task_layer) -> PipelineConfig:
    """The layers as the settings model reads them: the global and task-level keys as ``--set`` keys, the task
    defaults as the connector's (a task without task-level keys stands for "no task")."""
    code = task_code or "ODS_PLAIN"
    connector = SimpleNamespace(api=SimpleNamespace(timeout_seconds=30.0), tasks=[
        SimpleNamespace(code=code.upper(), pipeline=task_defaults),
        SimpleNamespace(code="ODS_OTHER_TASK", pipeline={})])
    flat = {f"pipeline.{k}": v for k, v in global_layer.items()}
    flat |= {f"pipeline.ods_other_task.{k}": v for k, v in other_task_layer.items()}  # never applies
    if task_code:
        flat |= {f"pipeline.{task_code.lower()}.{k}": v for k, v in task_layer.items()}
    return load_settings(connector=connector, environ={}, sets=flat).pipeline_config(code)


def in_bounds(layer: dict) -> bool:
    """Every value of a layer is checked on its own, also one a higher layer overrides (docs/guides/configuration.md): each within
    the bounds of its key."""
    for key, raw in layer.items():
        value = float(raw)
        low_ok = value > 0 if key == "batch_timeout" else value >= (1 if key in INT_KEYS else 0)
        if not (low_ok and value <= UPPER[key]):
            return False
    return True


def int_values():
    return st.integers(1, 64).flatmap(lambda n: st.sampled_from([n, str(n), f" {n} ", float(n)]))


def seconds_values():
    return st.floats(0, 40, allow_nan=False).map(lambda x: round(x, 3)).flatmap(
        lambda x: st.sampled_from([x, repr(x)]))


def layer():
    """Some of the keys, each as a number or as an environment string."""
    return st.fixed_dictionaries({}, optional={
        **{k: int_values() for k in INT_KEYS}, **{k: seconds_values() for k in FLOAT_KEYS}})


# Feature: etl-unified-pipeline, Property 4: 配置分层与任务级覆盖
@given(
    task_code=st.one_of(st.none(), st.sampled_from(["ODS_GROUP_PACKAGE", "ods_member", "Ods_Settlement"])),
    global_layer=layer(),
    task_layer=layer(),
    task_defaults=layer(),
    other_task_layer=layer(),
)
def test_p4_task_level_beats_task_default_beats_global_beats_default(
    task_code, global_layer, task_layer, task_defaults, other_task_layer
):
    expected = {}
    for key, default in DEFAULTS.items():
        for layer_values in ((task_layer if task_code else {}), task_defaults, global_layer):
            if key in layer_values:
                raw = layer_values[key]
                expected[key] = int(float(raw)) if key in INT_KEYS else float(raw)
                break
        else:
            expected[key] = default

    given_layers = [global_layer, task_defaults, other_task_layer] + ([task_layer] if task_code else [])
    if is_valid(expected) and all(in_bounds(values) for values in given_layers):
        config = layered(task_code, global_layer, task_layer, task_defaults, other_task_layer)
        assert {k: getattr(config, k) for k in DEFAULTS} == expected
        assert all(type(getattr(config, k)) is int for k in INT_KEYS)
    else:  # e.g. a task-level rate_min above the global rate_max: the merged result is refused
        with pytest.raises(ValueError):
            layered(task_code, global_layer, task_layer, task_defaults, other_task_layer)
