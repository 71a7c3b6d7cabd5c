"""The override order of the settings model, across every layer (docs/guides/configuration.md).

Random values in every layer — built-in default, the connector's task defaults, a ``.env`` file (really written
and loaded the way the CLI loads it, so the real environment wins), the environment, ``--set``, the dedicated
flags, a fleet file and a fleet lane — at both levels of a pipeline key (global ``pipeline.<key>`` and
task-level ``pipeline.<task>.<key>``), checked against the rule stated independently here:

* a task-level value (the connector's task defaults are task-level values) beats a global one;
* within a level: fleet lane > flag > --set > environment > .env > fleet file > connector > built-in default;

for the effective value of every key *and* for the source the model reports (what ``config show`` prints).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from feiqiu_etl.config import ConfigError, load_settings, read_dotenv

TASK = "ODS_MEMBER"
ORDER = ["default", "connector", "fleet file", ".env", "environment", "--set", "flag", "fleet lane north"]
"""Lowest first: the rule under test, written independently of :class:`feiqiu_etl.config.Source`."""
BUILT_IN = {"workers": 2, "queue_size": 100, "batch_size": 1000, "batch_timeout": 5.0, "rate_min": 5.0,
            "rate_max": 20.0, "max_consecutive_failures": 10}
INTS = {"workers", "queue_size", "batch_size", "max_consecutive_failures"}
FLAGGED = {"workers", "batch_size", "rate_min", "rate_max"}  # the keys that have a dedicated flag


def value_of(key: str):
    if key in INTS:
        return st.integers(1, 64)
    if key == "batch_timeout":
        return st.floats(0.01, 60).map(lambda x: round(x, 3))
    return st.floats(0, 40).map(lambda x: round(x, 3))


KEYS = ("workers", "batch_size", "batch_timeout", "rate_min", "rate_max")  # few, so that layers collide often


def entries(levels: tuple[str, ...], keys=KEYS):
    """A few ``(level, key) -> value`` of one layer."""
    pairs = [(level, key) for level in levels for key in keys]
    return st.lists(st.sampled_from(pairs), max_size=3, unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries({pair: value_of(pair[1]) for pair in chosen}))


LAYER_NAMES = {"connector": "connector", "dotenv": ".env", "environment": "environment", "set": "--set",
               "flag": "flag", "lane": "fleet lane north"}


def only(**layers) -> dict:
    """Explicit layers by short name (``dotenv``, ``set``, ``lane`` …), the others empty."""
    return {full: layers.get(short, {}) for short, full in LAYER_NAMES.items()}


LAYERS = st.fixed_dictionaries({
    "connector": entries(("task",)),
    ".env": entries(("global", "task")),
    "environment": entries(("global", "task")),
    "--set": entries(("global", "task")),
    "flag": entries(("global",), tuple(FLAGGED)),
    "fleet lane north": entries(("global", "task")),
})
BASES = st.fixed_dictionaries({}, optional={name: st.sampled_from(["http://a:1", "http://b:2", "https://c"])
                                            for name in ("fleet file", ".env", "environment", "flag",
                                                         "fleet lane north")})


def env_name(level: str, key: str, separator: str) -> str:
    return f"PIPELINE_{key.upper()}" if level == "global" else f"PIPELINE_{TASK}{separator}{key.upper()}"


def dotted(level: str, key: str) -> str:
    return f"pipeline.{key}" if level == "global" else f"pipeline.{TASK.lower()}.{key}"


def expected(layers: dict, key: str) -> tuple:
    """(value, source) by the rule in the module docstring."""
    best = (-1, 0, BUILT_IN[key], "default")
    for source, values in layers.items():
        for level in ("global", "task"):
            if (level, key) in values:
                rank = (1 if level == "task" else 0, ORDER.index(source))
                if rank > best[:2]:
                    best = (*rank, values[(level, key)], source)
    return best[2], best[3]


def build(layers: dict, bases: dict, env_separator: str, dotenv_separator: str):
    """The settings of the lane ``north`` of a fleet, built the way ``run --fleet`` builds them."""
    connector = SimpleNamespace(api=SimpleNamespace(timeout_seconds=30.0), tasks=[
        SimpleNamespace(code=TASK, pipeline={k: v for (_, k), v in layers["connector"].items()}),
        SimpleNamespace(code="ODS_PAYMENT", pipeline={})])
    environ = {env_name(lvl, k, env_separator): str(v) for (lvl, k), v in layers["environment"].items()}
    if "environment" in bases:
        environ["FEIQIU_API_BASE"] = bases["environment"]
    lines = [f"{env_name(lvl, k, dotenv_separator)}={v}" for (lvl, k), v in layers[".env"].items()]
    if ".env" in bases:
        lines.append(f"FEIQIU_API_BASE={bases['.env']}")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / ".env"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        dotenv = read_dotenv(path, environ, required=True)  # what the CLI does before it parses options
    flags = {dotted(lvl, k): str(v) for (lvl, k), v in layers["flag"].items()}
    if "flag" in bases:
        flags["api_base"] = bases["flag"]
    sets = {dotted(lvl, k): repr(v) for (lvl, k), v in layers["--set"].items()}
    settings_ = load_settings(connector=connector, environ=environ, dotenv=dotenv, sets=sets, flags=flags,
                              fleet_base=bases.get("fleet file"))
    lane = {(k if lvl == "global" else f"{TASK}.{k}"): v for (lvl, k), v in layers["fleet lane north"].items()}
    return settings_.for_lane("north", lane, bases.get("fleet lane north"))


@settings(max_examples=150, deadline=None)
@given(layers=LAYERS, bases=BASES, env_separator=st.sampled_from([".", "__"]),
       dotenv_separator=st.sampled_from([".", "__"]))
@example(layers=only(dotenv={("global", "workers"): 3}, environment={("global", "workers"): 4},
                     set={("global", "workers"): 5}, flag={("global", "workers"): 6}),
         bases={".env": "http://a:1", "environment": "http://b:2"}, env_separator="__", dotenv_separator=".")
@example(layers=only(connector={("task", "rate_min"): 8.5}, dotenv={("task", "rate_min"): 9.0},
                     lane={("global", "rate_min"): 30.0, ("global", "rate_max"): 40.0}),
         bases={"fleet file": "http://a:1", "flag": "http://b:2", "fleet lane north": "https://c"},
         env_separator=".", dotenv_separator="__")
def test_the_override_order_holds_across_every_layer(layers, bases, env_separator, dotenv_separator):
    lane = build(layers, bases, env_separator, dotenv_separator)
    want = {key: expected(layers, key) for key in BUILT_IN}
    for key, (value, source) in want.items():
        found = lane.resolve(TASK, key)
        assert (found.value, found.source) == (value, source), key
    values = {key: value for key, (value, _) in want.items()}
    if values["rate_min"] <= values["rate_max"]:
        config = lane.pipeline_config(TASK)
        assert {k: getattr(config, k) for k in BUILT_IN} == values
    else:  # the merged rates do not fit together: refused in one line
        with pytest.raises(ConfigError, match="must not exceed"):
            lane.pipeline_config(TASK)
    base = max(bases.items(), key=lambda item: ORDER.index(item[0]), default=(None, None))
    assert (lane.api_base, lane.source("api_base") if base[1] else None) == (base[1], base[0])
    for key in BUILT_IN:  # task-level values of TASK never reach another task
        assert lane.resolve("ODS_PAYMENT", key).key == f"pipeline.{key}"


def test_a_value_under_a_higher_layer_is_still_checked():
    """Issue 21 item 8: ``--pipeline-rate-max 4 --set pipeline.rate_max=garbage`` is an error, not ignored."""
    with pytest.raises(ConfigError, match="pipeline.rate_max: expected float, got 'garbage'"):
        load_settings(environ={}, sets={"pipeline.rate_max": "garbage"}, flags={"pipeline.rate_max": "4"})
    with pytest.raises(ConfigError, match="PIPELINE_WORKERS|pipeline.workers"):
        load_settings(environ={"PIPELINE_WORKERS": "many"}, flags={"pipeline.workers": "2"})
