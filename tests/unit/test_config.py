import pytest

from feiqiu_etl.config import ConfigError, DotEnv, load_settings
from feiqiu_etl.config.settings import env_to_key
from feiqiu_etl.connector import ConnectorError, load_connector

CONNECTOR = load_connector()


def test_env_names_map_to_dotted_keys():
    assert env_to_key("PIPELINE_WORKERS") == "pipeline.workers"
    assert env_to_key("PIPELINE_ODS_GROUP_PACKAGE.RATE_MIN") == "pipeline.ods_group_package.rate_min"
    assert env_to_key("PIPELINE_ODS_GROUP_PACKAGE__RATE_MAX") == "pipeline.ods_group_package.rate_max"
    assert env_to_key("DWD_PARALLEL_WORKERS") == "dwd.parallel_workers"
    assert env_to_key("HOME") is None


def test_precedence_cli_over_env_task_over_connector_default_over_global():
    env = {"PIPELINE_RATE_MIN": "3", "PIPELINE_RATE_MAX": "30", "PIPELINE_ODS_MEMBER.WORKERS": "3"}
    sets = {"pipeline.ods_member.rate_min": "4"}
    cfg = load_settings(connector=CONNECTOR, environ=env, sets=sets)
    member = cfg.pipeline_config("ODS_MEMBER")
    assert (member.rate_min, member.rate_max, member.workers) == (4.0, 30.0, 3)
    package = cfg.pipeline_config("ODS_GROUP_PACKAGE")  # the connector's task defaults: 8.5 / 25
    assert (package.rate_min, package.rate_max) == (8.5, 25.0)  # connector default beats global
    cfg = load_settings(connector=CONNECTOR, environ=env, sets={**sets, "pipeline.ods_group_package.rate_min": "9"})
    assert cfg.pipeline_config("ODS_GROUP_PACKAGE").rate_min == 9.0


@pytest.mark.parametrize("key,value,match", [
    ("pipeline.workers", "0", "workers must be >= 1"),
    ("pipeline.workers", "two", "expected int"),
    ("pipeline.rate_min", "30", "must not exceed"),
])
def test_bad_values_are_one_line_config_errors(key, value, match):
    with pytest.raises(ConfigError, match=match) as info:  # a value is checked when its layer is read
        load_settings(connector=CONNECTOR, environ={}, sets={key: value}).pipeline_config("ODS_MEMBER")
    assert "\n" not in str(info.value)


def test_unknown_keys_and_tasks_are_rejected():
    with pytest.raises(ConfigError, match="unknown configuration key"):
        load_settings(connector=CONNECTOR, environ={}, sets={"pipeline.wrokers": 2})
    with pytest.raises(ConfigError):
        load_settings(connector=CONNECTOR, environ={}, sets={"pipeline.ods_nope.workers": 2})


def test_connector_errors_name_file_task_and_field(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("name: x\ntasks:\n  - code: ODS_A\n    endpoint: /a\n    kind: windowed\n"
                   "    keys: [{field: id, column: id, type: float}]\n", encoding="utf-8")
    with pytest.raises(ConnectorError) as info:
        load_connector(bad)
    text = str(info.value)
    assert str(bad) in text and "tasks[0] (ODS_A).keys[0] (id).type" in text
    (tmp_path / "y.yaml").write_text("tasks: [", encoding="utf-8")
    with pytest.raises(ConnectorError, match="invalid YAML"):
        load_connector(tmp_path / "y.yaml")
    with pytest.raises(ConnectorError, match="cannot read"):
        load_connector(tmp_path / "missing.yaml")


@pytest.mark.parametrize("key,value", [
    ("pipeline.rate_max", "inf"), ("pipeline.rate_min", "nan"), ("pipeline.batch_timeout", "1e300"),
    ("pipeline.workers", "100000"), ("pipeline.rate_max", "1e9"),
])
def test_non_finite_and_absurd_values_are_rejected(key, value):
    with pytest.raises(ConfigError):
        load_settings(connector=CONNECTOR, environ={}, sets={key: value}).pipeline_config("ODS_MEMBER")


@pytest.mark.parametrize("key", ["api.retry_backoff", "api.timeout", "window.lookback_hours"])
def test_number_rejects_nan_and_inf(key):
    for bad in ("nan", "inf", "-inf"):
        with pytest.raises(ConfigError, match="finite"):
            load_settings(connector=CONNECTOR, environ={}, sets={key: bad})


@pytest.mark.parametrize("patch,match", [
    ("keys: [{field: siteId, column: site_id, type: bigint}]", "reserved"),
    ("keys: [{field: a, column: payload, type: text}]", "reserved"),
    ("keys: [{field: a, column: x, type: text}, {field: b, column: x, type: text}]", "repeat"),
    ("table: etl_meta.run\n    keys: [{field: a, column: a, type: text}]", "schema"),
    ("table: pg_catalog.pg_class\n    keys: [{field: a, column: a, type: text}]", "schema"),
    ("window_field: fetchedAt\n    kind: windowed\n    keys: [{field: a, column: a, type: text}]", "reserved"),
])
def test_connector_column_collisions_are_one_line_errors(tmp_path, patch, match):
    kind = "" if "kind:" in patch else "    kind: snapshot\n"
    text = f"name: x\ntasks:\n  - code: ODS_A\n    endpoint: /a\n{kind}    {patch}\n"
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConnectorError, match=match) as info:
        load_connector(path)
    assert "\n" not in str(info.value)


def test_connector_window_max_days_has_a_floor(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\napi: {window: {max_days: 0.000001}}\ntasks:\n  - {code: ODS_A, endpoint: /a, "
                    "kind: snapshot, keys: [{field: a, column: a, type: text}]}\n", encoding="utf-8")
    with pytest.raises(ConnectorError, match="max_days"):
        load_connector(path)


def test_env_file_loads_without_overriding_and_rejects_garbage(tmp_path):
    from feiqiu_etl.config import load_env_file

    env = {"PIPELINE_WORKERS": "3"}
    (tmp_path / ".env").write_text("PIPELINE_WORKERS=5\nFEIQIU_API_TOKEN=tok\n", encoding="utf-8")
    assert load_env_file(tmp_path / ".env", env) == {"PIPELINE_WORKERS", "FEIQIU_API_TOKEN"}
    assert env == {"PIPELINE_WORKERS": "3", "FEIQIU_API_TOKEN": "tok"}  # the real environment wins
    (tmp_path / "bad.env").write_text('A="unterminated\nB=1\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="line 1"):
        load_env_file(tmp_path / "bad.env", {})
    assert load_env_file(tmp_path / "missing.env", env) == set()
    with pytest.raises(ConfigError, match="no such env file"):
        load_env_file(tmp_path / "missing.env", env, required=True)
    (tmp_path / "latin1.env").write_bytes(b"X=\xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_env_file(tmp_path / "latin1.env", {})


def test_unknown_variables_from_dotenv_are_errors_but_other_software_s_are_ignored():
    with pytest.raises(ConfigError, match="PIPELINE_WOKERS"):
        load_settings(connector=CONNECTOR, environ={"PIPELINE_WOKERS": "3"},
                      dotenv=DotEnv(frozenset({"PIPELINE_WOKERS"}), frozenset({"PIPELINE_WOKERS"})))
    load_settings(connector=CONNECTOR, environ={"PIPELINE_WORKSPACE": "/agent/_work/1", "WINDOW_MANAGER": "x",
                                                "API_KEY": "x", "HOME": "/root"})  # e.g. Azure Pipelines


def test_connector_timeout_is_the_default_of_api_timeout(tmp_path):
    from feiqiu_etl.connector.model import default_connector_path
    from feiqiu_etl.plan import RunOptions, prepare

    text = default_connector_path().read_text(encoding="utf-8").replace("timeout_seconds: 30", "timeout_seconds: 12")
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("dwd_mapping: feiqiu.dwd.yaml\n", ""), encoding="utf-8")

    def client_timeout(overrides):
        opts = RunOptions(api_base="http://127.0.0.1:9", token="t", site_ids=[1], connector_path=str(path),
                          overrides=overrides, load_dwd=False, environ={})
        return prepare(opts).api_timeout

    assert client_timeout({}) == 12.0
    assert client_timeout({"api.timeout": "7"}) == 7.0


def test_huge_files_and_fifos_are_refused_in_one_line_before_parsing(tmp_path):
    import os

    import pytest

    from feiqiu_etl.config import ConfigError, load_env_file
    from feiqiu_etl.config.dotenv import MAX_ENV_BYTES
    from feiqiu_etl.plan.fleet import FleetError, load_fleet

    huge = tmp_path / "fleet.yaml"
    huge.write_text("lanes:\n" + "  - {name: a, token_env: A, stores: [{site_id: 1}]}\n" * 90_000)
    with pytest.raises(FleetError, match="more than the 4 MiB"):
        load_fleet(huge)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(FleetError, match="not a regular file"):
        load_fleet(fifo)  # would block forever on open
    env = tmp_path / ".env"
    env.write_text("X=1\n" * (MAX_ENV_BYTES // 4 + 1))
    with pytest.raises(ConfigError, match="more than the 1 MiB"):
        load_env_file(env, required=True, environ={})


def test_an_error_about_a_file_that_is_no_yaml_mapping_does_not_echo_its_lines():
    from pydantic import BaseModel, ConfigDict, ValidationError

    from feiqiu_etl.common.yamldoc import describe

    class Doc(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: str = "x"

    raw = {"root:$6$secrethash:20228:0:99999:7:::": None}  # what /etc/shadow parses into
    try:
        Doc.model_validate(raw)
    except ValidationError as exc:
        text = describe(exc, raw)
    assert "secrethash" not in text and "unknown key" in text


def test_an_invalid_yaml_error_says_where_but_never_quotes_the_file():
    import pytest

    from feiqiu_etl.plan.fleet import FleetError, load_fleet

    def check(tmp, text):
        path = tmp / "f.yaml"
        path.write_text(text)
        with pytest.raises(FleetError) as info:
            load_fleet(path)
        return str(info.value)

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        for text in ("*:*:*:postgres:QcR6UyOdB1UZN_leU\n", "a: 1\nb: [unclosed SECRETLINE_xyz\n"):
            message = check(Path(d), text)
            assert "invalid YAML at line" in message and "QcR6" not in message and "SECRETLINE" not in message


def test_a_key_twice_in_one_mapping_of_a_definition_file_is_one_line_naming_it_and_where(tmp_path):
    """Adversarial trial: PyYAML keeps the last of two equal keys silently (a lane's second ``stores:`` dropped
    the first list). Every definition file (connector, mapping, fleet, alerts) is read by one loader that refuses it."""
    from feiqiu_etl.common.yamldoc import read_yaml

    path = tmp_path / "fleet.yaml"
    path.write_text("lanes:\n  - name: a\n    token_env: FQ_A\n    stores: [{site_id: 1}]\n"
                    "    stores: [{site_id: 2}]\n", encoding="utf-8")
    with pytest.raises(ValueError) as err:
        read_yaml(path, ValueError, "fleet file")
    assert str(err.value) == f"{path}: invalid YAML at line 5, column 5: key stores appears twice in one mapping"
    path.write_text("a: 1\nb: {a: 1}\n", encoding="utf-8")  # the same key in two mappings is fine
    assert read_yaml(path, ValueError, "fleet file") == {"a": 1, "b": {"a": 1}}


def test_a_dotenv_name_one_slip_from_ours_is_warned_about_and_another_name_is_not(caplog):
    """Adversarial trial: ``FEIQIU_API_TOKN`` or ``ETL_DB_DNS`` in a ``.env`` was ignored without a word (no
    setting reads them). Not an error — a fleet's ``token_env`` may be any name — but one warning line."""
    import logging

    names = {"FEIQIU_API_TOKN": "x", "ETL_DB_DNS": "postgresql://h/db", "FQ_NORTH": "y",
             "FEIQIU_NORTH_TOKEN": "z"}
    with caplog.at_level(logging.WARNING):
        load_settings(environ=names, dotenv=DotEnv(frozenset(names), frozenset(names)))
    warned = sorted(r.getMessage() for r in caplog.records)
    assert warned == [".env: ETL_DB_DNS is read by nothing (did you mean ETL_DB_DSN?)",
                      ".env: FEIQIU_API_TOKN is read by nothing (did you mean FEIQIU_API_TOKEN?)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the same names in the real environment: other software's
        load_settings(environ=names, dotenv=DotEnv())
    assert caplog.records == []


def test_an_api_name_one_slip_from_ours_in_a_dotenv_is_warned_about_with_its_file_and_line(tmp_path, caplog):
    """Adversarial trial: ``API_TOKN`` or ``API_BASEE`` in a ``.env`` was ignored without a word (``API_*`` is
    exempt from the unknown-name error: too generic to claim). A close misspelling of one of our names is
    warned about, naming the file and the line (never the value); another ``API_*`` name is not."""
    import logging

    from feiqiu_etl.config import read_dotenv

    path = tmp_path / "site.env"
    path.write_text("# ours, misspelt\nAPI_TOKN=secret-value\n\nAPI_BASEE=http://h\nAPI_TIMEOT=3\n"
                    "API_GATEWAY_KEY=other-software\nFEIQIU_API_TOKN=x\nAPI_RETRY_ATTEMPTS=2\n", encoding="utf-8")
    environ: dict[str, str] = {}
    dotenv = read_dotenv(path, environ, required=True)
    with caplog.at_level(logging.WARNING):
        settings = load_settings(environ=environ, dotenv=dotenv)
    assert settings.api.retry_attempts == 2
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [f"{path}:2: API_TOKN is read by nothing (did you mean FEIQIU_API_TOKEN?)",
                      f"{path}:4: API_BASEE is read by nothing (did you mean FEIQIU_API_BASE?)",
                      f"{path}:5: API_TIMEOT is read by nothing (did you mean API_TIMEOUT?)",
                      f"{path}:7: FEIQIU_API_TOKN is read by nothing (did you mean FEIQIU_API_TOKEN?)"]
    assert not any("secret-value" in line for line in warned)


def test_a_name_set_twice_in_a_dotenv_is_warned_about_and_the_last_line_wins(tmp_path, caplog):
    """Adversarial trial: a duplicate name in a ``.env`` was accepted without a word. python-dotenv takes the
    last one; one warning line per duplicated name says where, and which line wins (never the value)."""
    import logging

    from feiqiu_etl.config import read_dotenv

    path = tmp_path / ".env"
    path.write_text('PIPELINE_WORKERS=2\nFEIQIU_API_TOKEN=first-secret\nDB_POOL_SIZE="4"\nX_MULTI="a\nb"\n'
                    "PIPELINE_WORKERS=3\nexport PIPELINE_WORKERS=5\nFEIQIU_API_TOKEN=second-secret\n",
                    encoding="utf-8")
    environ: dict[str, str] = {}
    dotenv = read_dotenv(path, environ, required=True)
    with caplog.at_level(logging.WARNING):
        settings = load_settings(environ=environ, dotenv=dotenv)
    assert settings.pipeline.workers == 5 and environ["FEIQIU_API_TOKEN"] == "second-secret"
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [f"{path}:7: PIPELINE_WORKERS is set 3 times (lines 1, 6, 7); the last one, line 7, wins",
                      f"{path}:8: FEIQIU_API_TOKEN is set 2 times (lines 2, 8); the last one, line 8, wins"]
    assert dotenv.where("DB_POOL_SIZE") == f"{path}:3" and dotenv.where("X_MULTI") == f"{path}:4"
    caplog.clear()
    path.write_text("PIPELINE_WORKERS=2\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        load_settings(environ={}, dotenv=read_dotenv(path, {}, required=True))
    assert caplog.records == []
