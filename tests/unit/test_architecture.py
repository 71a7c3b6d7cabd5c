"""The house rules of the layout, checked on the source: the engine knows nothing of Feiqiu, ODS, SQL or
HTTP; nothing below the connector imports the loaders; a run builds its FlowRunner once."""

from __future__ import annotations

import ast
from pathlib import Path

import feiqiu_etl

ROOT = Path(feiqiu_etl.__file__).parent
BELOW_THE_CONNECTOR = ("pipeline", "api", "connector", "config", "db")


def _imports(package: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        out[str(path.relative_to(ROOT))] = names
    return out


def test_nothing_below_the_connector_imports_the_loaders_or_the_runner():
    offenders = {f: sorted(n for n in names if n.startswith(("feiqiu_etl.tasks", "feiqiu_etl.runner",
                                                                "feiqiu_etl.plan", "feiqiu_etl.runs")))
                 for package in BELOW_THE_CONNECTOR for f, names in _imports(package).items()}
    assert {f: n for f, n in offenders.items() if n} == {}


def test_the_engine_knows_nothing_of_feiqiu_sql_or_http():
    forbidden = ("feiqiu_etl.api", "feiqiu_etl.connector", "feiqiu_etl.db", "feiqiu_etl.tasks", "psycopg", "httpx")
    offenders = {f: sorted(n for n in names if n.startswith(forbidden)) for f, names in _imports("pipeline").items()}
    assert {f: n for f, n in offenders.items() if n} == {}
    text = " ".join(p.read_text(encoding="utf-8") for p in (ROOT / "pipeline").rglob("*.py")).lower()
    assert "ods." not in text and "siteid" not in text


def test_only_the_dagster_module_imports_dagster():
    for path in ROOT.rglob("*.py"):
        if "dagster" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module] + \
                  [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not any(m == "dagster" or m.startswith("dagster.") for m in modules), path


def test_a_run_builds_its_flow_runner_once(pg_dsn, monkeypatch):
    from feiqiu_etl.runner import flow_runner
    from feiqiu_etl.simulator import Simulator
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from flowkit import run_flow, sim_config

    built = []
    original = flow_runner.FlowRunner.__init__

    def counting(self, *args, **kw):
        built.append(1)
        original(self, *args, **kw)

    monkeypatch.setattr(flow_runner.FlowRunner, "__init__", counting)
    with Simulator(sim_config(seed=3)) as sim:
        assert run_flow(sim, pg_dsn, tasks=["ODS_PAYMENT"]).status == "SUCCESS"
    assert built == [1]
