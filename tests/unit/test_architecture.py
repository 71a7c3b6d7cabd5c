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


MAX_PARAMETERS = 8
# Functions allowed more than MAX_PARAMETERS for now, each with the branch that owns its file. An entry that no
# longer offends fails the test too: take it off this list.
KNOWN_LONG_SIGNATURES = {
    "simulator/events.py:make_table_use": "sim branch (issue 20) owns the simulator",
    "simulator/events.py:make_service": "sim branch (issue 20) owns the simulator",
    "simulator/events.py:make_payment": "sim branch (issue 20) owns the simulator",
    "simulator/events.py:make_balance_change": "sim branch (issue 20) owns the simulator",
    "simulator/events.py:_discounts": "sim branch (issue 20) owns the simulator",
    "simulator/events.py:_payments": "sim branch (issue 20) owns the simulator",
    "simulator/events.py:_goods": "sim branch (issue 20) owns the simulator",
    "simulator/events.py:_services": "sim branch (issue 20) owns the simulator",
    "simulator/master.py:_content": "sim branch (issue 20) owns the simulator",
}
# Modules whose functions are not checked yet (db/embedded.py was, until its split into db/embedded/, issue 16).
NOT_YET_CHECKED: tuple[str, ...] = ()


def _is_click_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``@main.command()``, ``@click.command("x")``, ``@click.group()``, ``@details.command("drop")``: a click
    command's signature is its options, however many."""
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in ("command", "group")
               for d in node.decorator_list)


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """What a caller can pass: positional and keyword parameters (not ``self``/``cls``), ``*args`` and
    ``**kwargs`` one each."""
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def _long_signatures() -> dict[str, int]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(NOT_YET_CHECKED):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_click_command(node):
                count = _parameters(node)
                if count > MAX_PARAMETERS:
                    out[f"{rel}:{node.name}"] = count
    return out


def test_no_function_takes_more_than_eight_parameters_outside_click_commands():
    found = _long_signatures()
    assert {k: v for k, v in found.items() if k not in KNOWN_LONG_SIGNATURES} == {}, \
        "pass a few typed values (a frozen dataclass) instead of a long argument list"
    assert sorted(set(KNOWN_LONG_SIGNATURES) - set(found)) == []  # fixed: take it off the list


def test_the_check_of_long_signatures_sees_what_it_must():
    tree = ast.parse("@main.command()\ndef cmd(a, b, c, d, e, f, g, h, i): pass\n"
                     "class C:\n    def m(self, a, b, c, d, e, f, g, *args, **kw): pass\n"
                     "def plain(a, b, c, d, e, f, g, h): pass\n")
    cmd, method, plain = (next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
                          for name in ("cmd", "m", "plain"))
    assert _is_click_command(cmd) and not _is_click_command(method)
    assert (_parameters(method), _parameters(plain)) == (9, 8)


def test_one_line_error_text_has_one_helper():
    """``errortext.one_line`` is the only place that folds an exception's text onto one line."""
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("errortext.py",) or rel.startswith(NOT_YET_CHECKED):
            continue
        text = path.read_text(encoding="utf-8")
        if "def _one_line" in text or ".join(str(exc).split())" in text or ".join(str(error).split())" in text:
            offenders.append(rel)
    assert offenders == []
