"""Issue 28 items 3 and 7: NaN, ±inf and digits that are not ASCII are refused by every numeric input — every
numeric setting in every layer (environment, ``.env``, ``--set``, the dedicated flags, a fleet lane's YAML),
every numeric click option of every command, and the web's query strings — with one line (exit 2 for a command).

Before: ``freshness --fail-stale --hours nan`` exited 0 ("0 of 21 older than nan h") and ``web --stale-hours nan``
answered 500 on ``/api/freshness``: click's ``FloatRange`` lets NaN through (it compares false with both bounds),
and ``int("１２")`` is 12 in Python."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clikit import PY, finish, start
from feiqiu_etl.cli.app import main
from feiqiu_etl.cli.numeric import FloatRange, IntRange
from feiqiu_etl.config import ConfigError, load_settings, read_dotenv
from feiqiu_etl.config.settings import Settings
from feiqiu_etl.numbers import parse_float, parse_int
from feiqiu_etl.plan.fleet import FleetError, load_fleet

NON_FINITE = ["nan", "NaN", "-nan", "inf", "+inf", "-inf", "Infinity", "-Infinity", "1e400", "-1e999"]
NOT_ASCII = ["１２", "٣", "1２", "۱.5", "１e3", "²"]
BAD = NON_FINITE + NOT_ASCII


def _numeric_keys() -> list[tuple[str, str]]:
    """``(dotted key, "number"|"integer")`` of every numeric setting, read from the model's schema (a setting
    added later is covered without touching this test)."""
    schema = Settings.model_json_schema()
    found = []
    for section, prop in schema["properties"].items():
        ref = (prop.get("$ref") or "").rsplit("/", 1)[-1]
        if not ref:
            continue
        for name, field in schema["$defs"][ref]["properties"].items():
            kinds = {f.get("type") for f in field.get("anyOf", [field])}
            kind = "integer" if "integer" in kinds else "number" if "number" in kinds else None
            if kind:
                found.append((f"{section}.{name}", kind))
    return found


KEYS = _numeric_keys()


def test_the_numeric_settings_are_found():
    keys = dict(KEYS)
    assert len(KEYS) >= 25, KEYS
    assert keys["db.unavailable_limit"] == "number" and keys["pipeline.workers"] == "integer"
    assert keys["pipeline.rate_min"] == "number" and keys["run.stale_after"] == "number"


def _env_name(key: str) -> str:
    return key.upper().replace(".", "_")


def _refused(build, key: str, value: str) -> str:
    with pytest.raises(ConfigError) as info:
        build()
    text = str(info.value)
    assert "\n" not in text and key in text, (key, value, text)
    return text


@settings(max_examples=120, deadline=None)
@given(key=st.sampled_from(KEYS), value=st.sampled_from(BAD) | st.floats(allow_nan=True).filter(
    lambda x: not math.isfinite(x)).map(repr), layer=st.sampled_from(["environment", ".env", "--set", "flag"]))
def test_every_numeric_setting_refuses_non_finite_and_non_ascii_numbers_in_every_layer(key, value, layer):
    (name, kind) = key
    if layer == "environment":
        _refused(lambda: load_settings(environ={_env_name(name): value}), name, value)
    elif layer == ".env":
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / ".env"
            path.write_text(f"{_env_name(name)}={value}\n", encoding="utf-8")
            environ: dict[str, str] = {}
            dotenv = read_dotenv(path, environ, required=True)
            _refused(lambda: load_settings(environ=environ, dotenv=dotenv), name, value)
    elif layer == "--set":
        _refused(lambda: load_settings(environ={}, sets={name: value}), name, value)
    else:
        _refused(lambda: load_settings(environ={}, flags={name: value}), name, value)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "'nan'", "'１２'"])
@pytest.mark.parametrize("key", ["rate_min", "workers", "ods_member.rate_max"])
def test_a_fleet_lanes_yaml_refuses_them_too(tmp_path, key, value):
    path = tmp_path / "fleet.yaml"
    path.write_text("lanes:\n  - name: north\n    token_env: FQ_NORTH\n    stores: [{site_id: 1}]\n"
                    f"    pipeline: {{{key}: {value}}}\n", encoding="utf-8")
    fleet = load_fleet(path)  # the file's shape is fine; the lane's settings are checked as settings
    lane = fleet.lanes[0]
    with pytest.raises(ConfigError) as info:
        load_settings(environ={}).for_lane("north", lane.pipeline)
    assert "\n" not in str(info.value) and key.rsplit(".", 1)[-1] in str(info.value), str(info.value)


def _numeric_options():
    """Every (command path, option) of the CLI whose type is a number."""
    found = []

    def walk(cmd: click.Command, path: str) -> None:
        for param in cmd.params:
            if isinstance(param.type, (click.types.FloatParamType, click.types.IntParamType)) \
                    and not getattr(param, "count", False):  # -v -v counts, it reads no number
                found.append((path, param))
        if isinstance(cmd, click.Group):  # click's API: the CLI loads its commands lazily (cli/app.py)
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), f"{path} {name}")

    walk(main, "feiqiu-etl")
    return found


OPTIONS = _numeric_options()


def test_every_numeric_option_of_every_command_uses_the_finite_ascii_types():
    assert len(OPTIONS) >= 15, [(p, o.name) for p, o in OPTIONS]
    loose = [(p, o.name) for p, o in OPTIONS if not isinstance(o.type, (FloatRange, IntRange))]
    assert loose == [], loose


@settings(max_examples=60, deadline=None)
@given(option=st.sampled_from(OPTIONS), value=st.sampled_from(BAD))
def test_every_numeric_option_refuses_them(option, value):
    path, param = option
    with pytest.raises(click.BadParameter) as info:
        param.type.convert(value, param, None)
    assert "\n" not in info.value.format_message(), (path, param.name, value)


@pytest.mark.parametrize("args", [["freshness", "--fail-stale", "--hours", "nan"],
                                  ["web", "--stale-hours", "inf"], ["runs", "--limit", "１２"]])
def test_the_commands_refuse_them_with_exit_2_before_any_work(args):
    code, out, err = finish(start([*PY, *args], dict(os.environ)), timeout=60)
    assert code == 2 and "Traceback" not in err, (args, code, err[-2000:])
    assert "finite number" in err or "ASCII digits" in err, err
    assert [line for line in err.splitlines() if line.startswith("Error:")], err


@pytest.mark.parametrize("value", BAD + ["0", "-1", "8761"])
def test_web_query_strings_refuse_them(value):
    from feiqiu_etl.web.params import BadRequest, hours_param, int_param

    request = SimpleNamespace(query_params={"hours": value, "page": value})
    with pytest.raises(BadRequest) as info:
        hours_param(request, 26.0)
    assert "\n" not in str(info.value)
    if value not in ("0", "-1", "8761"):
        with pytest.raises(BadRequest):
            int_param(request, "page", 1, -10, 10**7)


def test_the_readers_take_plain_numbers():
    assert parse_float(" 2.5 ") == 2.5 and parse_float("1e3") == 1000.0 and parse_float(3) == 3.0
    assert parse_int("-12") == -12 and parse_int(7) == 7
    for bad in BAD + ["", "1.5x", "0x10"]:
        with pytest.raises(ValueError):
            parse_float(bad)
    with pytest.raises(ValueError):
        parse_float(float("nan"))


@pytest.mark.parametrize("args", [["--now", "２０２６-12-01 12:00:00"],
                                  ["--window-start", "２０２６-11-30 00:00:00", "--window-end", "2026-12-01 00:00:00"],
                                  ["--backfill", "--from", "２０２６-11-30", "--to", "2026-12-01"]])
def test_times_and_dates_in_full_width_digits_are_refused_before_any_work(args, tmp_path):
    """strptime reads "２０２６" as 2026; the adversarial trial ran a SUCCESS with ``--now "２０２６-…"``. Port 9 (discard)
    answers no HTTP: a request sent would end otherwise than exit 2."""
    env = {**os.environ, "FEIQIU_ETL_HOME": str(tmp_path)}
    code, out, err = finish(start([*PY, "run", "--api-base", "http://127.0.0.1:9", "--token", "abc", "--site-id", "1",
                                   "--no-progress", *args], env), timeout=60)
    assert code == 2 and "Traceback" not in err, (args, code, err[-2000:])
    assert [line for line in err.splitlines() if line.startswith("Error:")] == [err.strip().splitlines()[-1]], err
    assert "２０２６" in err and ("ASCII digits" in err or "expected a date YYYY-MM-DD" in err), err


def test_the_window_parsers_take_ascii_digits_only():
    from feiqiu_etl.connector.windows import day_range, parse_local

    assert parse_local("2026-11-30 00:00:00").year == 2026
    for text in ("２０２６-11-30 00:00:00", "2026-11-30 ０0:00:00", "２０２６-11-30"):
        with pytest.raises(ValueError, match="ASCII digits"):
            parse_local(text)
    with pytest.raises(ValueError, match="--from"):
        day_range("２０２６-11-30", "2026-12-01")
