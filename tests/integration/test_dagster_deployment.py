"""Dagster as deployed (issue 19 item 4): ``dagster-daemon run`` and ``dagster-webserver`` as real processes on
loopback, an instance on PostgreSQL storage (dagster-postgres, its own database on the test server), the
daemon's queued run coordinator, one pool per token with limit 1 and run monitoring — the ``dagster.yaml``
that :func:`feiqiu_etl.dagster.instance.instance_yaml` writes, with the daemon's intervals at 1 s. Every
setting of the steps comes from the environment only, as a deployment gives it (``-m feiqiu_etl.dagster``).

What it shows, at the simulator (the only witness that matters to the upstream's risk control):

* two runs of one token never overlap, the third run (another token) does overlap them;
* a run worker killed mid-lane (kill -9) gives its pool slot back through run monitoring
  (``free_slots_after_run_end_seconds``), and the next queued run of that token starts and completes the
  store the killed one had begun.

Waits have generous timeouts (a loaded 2-core machine); assertions about overlap have none.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import psycopg
import pytest

dg = pytest.importorskip("dagster")
pytest.importorskip("dagster_postgres")
pytest.importorskip("dagster_graphql")

from dagster_graphql import DagsterGraphQLClient  # noqa: E402

from feiqiu_etl.dagster import pool_name  # noqa: E402
from feiqiu_etl.dagster.instance import InstanceSettings, instance_yaml, storage_url  # noqa: E402
from feiqiu_etl.db.embedded import create_database  # noqa: E402
from feiqiu_etl.plan.fleet import load_fleet  # noqa: E402
from feiqiu_etl.simulator import Simulator  # noqa: E402
from flowkit import FAST, as_environment, history, lane_violations, sim_config, store_exact  # noqa: E402

NORTH = (8640015201004417, 8640015201004418)
SOUTH = (8640015201004421,)
TASKS = ["ODS_MEMBER", "ODS_SETTLEMENT", "ODS_PAYMENT", "ODS_GOODS"]
TOKENS = {"FQ_NORTH": "fq_north", "FQ_SOUTH": "fq_south"}
LOCATION = "feiqiu_etl.dagster"
GAP = 0.1          # s between requests: a north run lasts a few seconds at the simulator
WAIT = 420.0       # s: the longest any single wait may take on a loaded machine (never an assertion on overlap)
STOP_WAIT_TEST = 90.0  # s for `feiqiu-etl dagster dev` to end after Ctrl-C (it gives Dagster 60 s)
FAST_DAEMON = InstanceSettings(dequeue_interval=1, monitoring_interval=1, free_slots_after=3, start_timeout=240)


# --------------------------------------------------------------------------------------------- helpers
def fleet_yaml(path: Path, api_base: str = "http://127.0.0.1:9") -> str:
    """The fleet file of a deployment, naming an ``api_base`` nobody listens at: the environment must win."""
    tasks = "[" + ", ".join(TASKS) + "]"
    lines = [f"api_base: {api_base}", "lanes:"]
    for name, env, sites in (("north", "FQ_NORTH", NORTH), ("south", "FQ_SOUTH", SOUTH)):
        lines += [f"  - name: {name}", f"    token_env: {env}", f"    tasks: {tasks}", "    stores:"]
        lines += [f"      - {{site_id: {s}}}" for s in sites]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def step_environment(sim: Simulator, dsn: str | None, fleet: str, gap: float) -> dict[str, str]:
    """The environment of every Dagster process: configuration from environment variables only."""
    mine = ("PIPELINE_", "DWD_", "WINDOW_", "API_", "DB_", "RUN_", "LANE_", "DETAIL_", "PROGRESS_", "FEIQIU_",
            "ETL_DB_DSN", "DAGSTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(mine)}
    settings = {**FAST, "pipeline.rate_min": gap, "pipeline.rate_max": gap * 1.25,
                "pipeline.ods_group_package.rate_min": gap * 1.5, "pipeline.ods_group_package.rate_max": gap * 1.75,
                "window.initial_days": sim.config.days + 1, "progress.heartbeat_seconds": 1}
    env.update({**TOKENS, **as_environment(settings), "FEIQIU_FLEET": fleet, "FEIQIU_API_BASE": sim.base_url,
                "FEIQIU_UNSAFE_GAPS": "1"})
    if dsn is not None:
        env["ETL_DB_DSN"] = dsn
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], env: dict, log: Path, cwd: Path) -> subprocess.Popen:
    """A process in a session of its own (so that it and its children can be ended together), output to
    ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(args, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each process group, then SIGKILL after 30 s; then SIGKILL to any descendant left (the code
    servers the daemon and the webserver start run in sessions of their own)."""
    family = []
    for proc in procs:
        try:
            family += psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    gone, alive = psutil.wait_procs(family, timeout=10)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def wait_for(what: str, probe, timeout: float = WAIT, every: float = 0.1, procs=(), why=lambda: ""):
    """``probe()`` until it is truthy (its value is returned); fails after ``timeout`` s or when one of
    ``procs`` ended, with their logs' ends and ``why()``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        logs = "\n".join(f"--- {log.name}:\n{log.read_text(errors='replace')[-3000:]}" for _, log in procs)
        for proc, log in procs:
            assert proc.poll() is None, f"{log.name} process ended while waiting for {what}:\n{logs}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s: {why()}\n{logs}"
        time.sleep(every)


def feiqiu_run_of(dsn: str, dagster_run_id: str) -> tuple | None:
    """``(run_id, status, pid)`` of the feiqiu-etl run a Dagster run made, or None yet."""
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            return conn.execute("SELECT run_id, status, pid FROM etl_meta.run WHERE args->>'dagster_run_id' = %s",
                                (dagster_run_id,)).fetchone()
    except psycopg.errors.UndefinedTable:
        return None


CHECKS_QUERY = """
query Checks($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode {
      assetChecksOrError { ... on AssetChecks { checks {
        name executionForLatestMaterialization { status evaluation { success description } } } } }
    }
  }
}"""


WAITING_QUERY = """
query Waiting($runId: ID!, $pool: String!) {
  runOrError(runId: $runId) { ... on Run { status allPools } }
  instance { concurrencyLimit(concurrencyKey: $pool) { limit claimedSlots { runId } } }
}"""


def graphql(port: int, query: str, variables: dict) -> dict:
    """One query to the webserver's GraphQL API (what the UI reads)."""
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def span(log, sites) -> tuple[float, float]:
    mine = [e for e in log if e.site_id in sites]
    return min(e.started for e in mine), max(e.ended for e in mine)


# ------------------------------------------------------------------------------------------------ the test
@pytest.mark.timeout(1800)  # a hang guard only (each wait has WAIT of its own)
def test_the_daemon_keeps_a_token_serial_across_runs_and_frees_a_killed_runs_slot(pg_server_dsn, pg_dsn, tmp_path,
                                                                                 monkeypatch):
    storage_db = f"dagster_{uuid.uuid4().hex[:10]}"  # Dagster's own database, beside the warehouse
    create_database(pg_server_dsn, storage_db)
    home = tmp_path / "dagster_home"
    home.mkdir()
    import psycopg.conninfo as ci

    storage_dsn = ci.make_conninfo(pg_server_dsn, dbname=storage_db)
    (home / "dagster.yaml").write_text(instance_yaml(FAST_DAEMON), encoding="utf-8")
    fleet = fleet_yaml(tmp_path / "fleet.yaml")
    sites = NORTH + SOUTH
    config = sim_config(seed=81, site_ids=sites, anchor=None, tokens={"fq_north": NORTH, "fq_south": SOUTH},
                        token="fq_admin")
    timings: dict[str, float] = {}
    procs: list[tuple[subprocess.Popen, Path]] = []
    began = time.monotonic()
    try:
        with Simulator(config) as sim:
            monkeypatch.setenv("FEIQIU_DAGSTER_PG_URL", storage_url(storage_dsn))  # this process reads the instance too
            env = {**step_environment(sim, pg_dsn, fleet, GAP), "DAGSTER_HOME": str(home),
                   "FEIQIU_DAGSTER_PG_URL": storage_url(storage_dsn)}
            port = free_port()
            for name, args in (("daemon", ["dagster-daemon", "run", "-m", LOCATION]),
                               ("webserver", ["dagster-webserver", "-m", LOCATION, "-h", "127.0.0.1", "-p",
                                              str(port)])):
                exe = str(Path(sys.executable).parent / args[0])
                log = tmp_path / f"{name}.log"
                procs.append((start([exe, *args[1:]], env, log, tmp_path), log))
            client = DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=60)

            refused: list[str] = []

            def submit(lane: str, site: int) -> str | None:
                try:
                    return client.submit_job_execution(f"feiqiu_ods_{lane}", repository_location_name=LOCATION,
                                                       tags={"dagster/partition": str(site)})
                except Exception as exc:  # noqa: BLE001 - the webserver is still starting or loading the code
                    refused[:] = [f"{type(exc).__name__}: {exc}"]
                    return None

            first = wait_for("webserver accepting a run", lambda: submit("north", NORTH[0]), procs=procs, every=0.5,
                             why=lambda: refused[0] if refused else "")
            timings["ready_s"] = time.monotonic() - began
            second = submit("north", NORTH[1])
            third = submit("south", SOUTH[0])
            assert second and third
            instance = dg.DagsterInstance.from_config(str(home))
            status = lambda run_id: instance.get_run_by_id(run_id).status  # noqa: E731

            # the second run of north waits while the first holds north's pool slot: in the queue, or (the first
            # time the daemon meets a pool, it may launch both) in its run worker, at the step's slot claim
            wait_for("the first north run to succeed", lambda: status(first) == dg.DagsterRunStatus.SUCCESS,
                     procs=procs)

            # the second one starts; kill -9 its run worker mid-lane, with a third north run queued behind it
            wait_for("the second north run to send requests",
                     lambda: sum(1 for e in sim.request_log() if e.site_id == NORTH[1]) >= 5, procs=procs)
            fourth = submit("north", NORTH[1])
            assert fourth
            wait_for("the queued north run to be seen", lambda: status(fourth) == dg.DagsterRunStatus.QUEUED,
                     procs=procs)
            _, state, pid = wait_for("the feiqiu-etl run of the second", lambda: feiqiu_run_of(pg_dsn, second))
            assert state == "RUNNING"
            pool = pool_name("feiqiu", load_fleet(fleet).lanes[0], TOKENS)
            claimants = lambda: [  # noqa: E731
                s.run_id for s in instance.event_log_storage.get_concurrency_info(pool).claimed_slots]
            assert claimants() == [second]
            waiting = graphql(port, WAITING_QUERY, {"runId": fourth, "pool": pool})["data"]  # what the UI shows
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            sent_when_killed = sum(1 for e in sim.request_log() if e.site_id == NORTH[1])
            wait_for("Dagster to mark the killed run failed", lambda: status(second) == dg.DagsterRunStatus.FAILURE,
                     procs=procs)
            timings["kill_to_failed_s"] = time.monotonic() - killed
            wait_for("run monitoring to free the slot", lambda: second not in claimants(), procs=procs)
            freed_at = time.time()
            timings["kill_to_slot_freed_s"] = time.monotonic() - killed
            ended_at = instance.get_run_record_by_id(second).end_time
            wait_for("the queued north run to start", lambda: status(fourth) != dg.DagsterRunStatus.QUEUED, procs=procs)
            timings["kill_to_next_started_s"] = time.monotonic() - killed
            for run_id in (third, fourth):
                wait_for(f"run {run_id} to end", lambda r=run_id: instance.get_run_by_id(r).is_finished, procs=procs)
            statuses = {r: status(r) for r in (first, second, third, fourth)}
            ui_checks = graphql(port, CHECKS_QUERY, {"key": {"path": ["feiqiu", "ods", "north"]}})
            daemon_log = procs[0][1].read_text(errors="replace")
            timings["total_s"] = time.monotonic() - began
            log = sim.request_log()
            window = history(sim)
            for site in sites:
                store_exact(pg_dsn, sim, site, TASKS, window)
            instance.dispose()
    finally:
        stop([proc for proc, _ in procs])
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{storage_db}" WITH (FORCE)')
    print(json.dumps({k: round(v, 1) for k, v in timings.items()}))
    assert statuses == {first: dg.DagsterRunStatus.SUCCESS, second: dg.DagsterRunStatus.FAILURE,
                        third: dg.DagsterRunStatus.SUCCESS, fourth: dg.DagsterRunStatus.SUCCESS}
    # a run waiting for its token is not a mystery in the UI (Dagster #16441): QUEUED, needing the lane's pool,
    # whose one slot the running run holds
    assert waiting["runOrError"] == {"status": "QUEUED", "allPools": [pool]}, waiting
    assert waiting["instance"]["concurrencyLimit"] == {"limit": 1, "claimedSlots": [{"runId": second}]}, waiting
    # the asset checks as the UI shows them: every store of north is fresh and the last run was complete
    checks = {c["name"]: c["executionForLatestMaterialization"]
              for c in ui_checks["data"]["assetNodeOrError"]["assetChecksOrError"]["checks"]}
    assert set(checks) == {"complete", *(f"fresh_{s}" for s in NORTH)}, ui_checks
    assert all(c["status"] == "SUCCEEDED" and c["evaluation"]["success"] for c in checks.values()), checks
    # the slot outlived the dead run by free_slots_after_run_end_seconds: run monitoring freed it (the run worker
    # was dead, and nothing else frees a claimed slot; Dagster 1.13 does not log it: its count is None)
    assert freed_at - ended_at >= FAST_DAEMON.free_slots_after, (ended_at, freed_at)
    assert "MonitoringDaemon" in daemon_log
    # one token: strictly serial at the simulator, the runs one after the other, never overlapping
    north_log = [e for e in log if e.site_id in NORTH]
    assert lane_violations(north_log, GAP / 2) == []  # half the gap: room for scheduling on a loaded machine
    a_end = span(log, [NORTH[0]])[1]
    b = sorted((e for e in log if e.site_id == NORTH[1]), key=lambda e: e.started)
    assert b[0].started >= a_end  # the second began only after the first had ended
    assert len(b) > sent_when_killed  # the fourth resumed store B after the kill ...
    resumed = b[sent_when_killed]
    assert resumed.started >= b[sent_when_killed - 1].ended  # ... after the killed one's last request
    # another token does not wait for north's pool: south's requests overlap north's in time
    north_span, south_span = span(log, NORTH), span(log, SOUTH)
    assert min(north_span[1], south_span[1]) - max(north_span[0], south_span[0]) > 0, (north_span, south_span)
    with psycopg.connect(pg_dsn) as conn:
        runs = {r[0]: r[1:] for r in conn.execute(
            "SELECT args->>'dagster_run_id', status, started_at, finished_at FROM etl_meta.run").fetchall()}
    assert {r: v[0] for r, v in runs.items()} == {first: "SUCCESS", second: "INTERRUPTED", third: "SUCCESS",
                                                 fourth: "SUCCESS"}
    # the second feiqiu-etl run began only after the first had ended: Dagster's pool held it, not the lane guard
    assert runs[second][1] >= runs[first][2]


# ------------------------------------------------------------------------------- dagster asset materialize
def _check_evaluations(instance, key, names) -> dict:
    """{check name: (passed, description, metadata)} of the latest evaluation of each named check of ``key``."""
    out = {}
    for name in names:
        records = instance.event_log_storage.get_asset_check_execution_history(dg.AssetCheckKey(key, name), limit=1)
        if records and records[0].event and records[0].event.dagster_event:
            ev = records[0].event.dagster_event.event_specific_data
            out[name] = (ev.passed, ev.description, {k: v.value for k, v in ev.metadata.items()})
    return out


@pytest.mark.timeout(300)
def test_dagster_asset_materialize_with_configuration_from_the_environment_only(pg_dsn, tmp_path):
    """``dagster asset materialize -m feiqiu_etl.dagster`` as a subprocess, configured by environment variables
    alone; the fleet file names another ``api_base`` and the environment wins, as for the CLI. The step's log
    shows progress while the run goes on; the metadata and the asset checks say what happened."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n",
                                       encoding="utf-8")
    fleet = fleet_yaml(tmp_path / "fleet.yaml")
    config = sim_config(seed=82, site_ids=NORTH, anchor=None, tokens={"fq_north": NORTH, "fq_south": SOUTH},
                        token="fq_admin")
    key = dg.AssetKey(["feiqiu", "ods", "north"])
    with Simulator(config) as sim:
        env = {**step_environment(sim, pg_dsn, fleet, 0.15), "DAGSTER_HOME": str(home)}
        log = tmp_path / "materialize.log"
        proc = start([sys.executable, "-m", "dagster", "asset", "materialize", "-m", LOCATION, "--select",
                      "feiqiu/ods/north", "--partition", str(NORTH[0])], env, log, tmp_path)
        seen_progress = None
        deadline = time.monotonic() + WAIT
        try:
            with dg.DagsterInstance.from_config(str(home)) as instance:
                while proc.poll() is None:
                    runs = instance.get_runs(limit=1)
                    if runs and seen_progress is None and any(
                            "[progress]" in (e.user_message or "") for e in instance.all_logs(runs[0].run_id)):
                        seen_progress = time.monotonic()
                    assert time.monotonic() < deadline, "dagster asset materialize did not end"
                    time.sleep(0.2)
        finally:
            stop([proc])
        output = log.read_text(errors="replace")
        requests = sim.request_log()
        cli = subprocess.run([str(Path(sys.executable).parent / "feiqiu-etl"), "config", "show", "--fleet", fleet,
                              "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        cli_base = {s["key"]: (s["value"], s["source"]) for s in json.loads(cli.stdout)}["north:FEIQIU_API_BASE"]
        base_url = sim.base_url
        window = history(sim)
        assert proc.returncode == 0, output[-4000:]
        store_exact(pg_dsn, sim, NORTH[0], TASKS, window)
    # the step's log streamed while the run went on: a heartbeat line was in Dagster's event log before the
    # simulator had answered the last request
    assert seen_progress is not None and seen_progress < max(e.started for e in requests), output[-3000:]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()
        messages = [e.user_message or "" for e in instance.all_logs(run.run_id)]
        assert sum(1 for m in messages if m.startswith("[") and " site " in m and "/4] " in m) == 4, messages
        (mat,) = instance.fetch_materializations(key, limit=10).records
        meta = {k: v.value for k, v in mat.asset_materialization.metadata.items()}
        checks = _check_evaluations(instance, key, ["complete", f"fresh_{NORTH[0]}", f"fresh_{NORTH[1]}"])
    assert meta["status"] == "SUCCESS" and meta["requests"] == len(requests) and meta["rows"] > 0, meta
    assert meta["rejections"] == 0 and meta["bans"] == 0 and meta["banned_seconds"] == 0, meta
    with psycopg.connect(pg_dsn) as conn:
        run_id, status, config_used = conn.execute("SELECT run_id, status, config FROM etl_meta.run").fetchone()
    assert meta["feiqiu_run_id"] == run_id and status == "SUCCESS"
    # the fleet file's api_base (where nothing listens) lost to FEIQIU_API_BASE in the step, as in the CLI
    assert cli_base == (base_url, "environment") and requests
    assert config_used["pipeline.rate_min"] == {"value": 0.15, "source": "environment"}
    assert checks["complete"][0] is True, checks
    assert checks["complete"][2]["windows"] == checks["complete"][2]["windows_finished"] > 0
    assert checks[f"fresh_{NORTH[0]}"][0] is True, checks      # just loaded
    assert checks[f"fresh_{NORTH[1]}"][0] is False, checks     # scheduled, never loaded
    assert "never loaded" in checks[f"fresh_{NORTH[1]}"][1]


# ------------------------------------------------------------------------------------ feiqiu-etl dagster dev
@pytest.mark.timeout(400)
def test_feiqiu_etl_dagster_dev_runs_dagster_over_the_embedded_server(fresh_home, tmp_path, monkeypatch):
    """The one-machine trial of docs/scale-out.md: no DSN to build, no dagster.yaml to write. The command holds
    the embedded server, gives Dagster its own database there, runs ``dagster dev``; a run submitted to its UI
    lands in the warehouse every other command opens; Ctrl-C stops Dagster and then the server."""
    from feiqiu_etl.db.embedded.server import home_layout

    fleet = fleet_yaml(tmp_path / "fleet.yaml")
    config = sim_config(seed=83, site_ids=NORTH, anchor=None, tokens={"fq_north": NORTH, "fq_south": SOUTH},
                        token="fq_admin")
    cli = str(Path(sys.executable).parent / "feiqiu-etl")
    port = free_port()
    with Simulator(config) as sim:
        env = {**step_environment(sim, None, fleet, GAP), "FEIQIU_ETL_HOME": str(fresh_home)}
        log = tmp_path / "dev.log"
        began = time.monotonic()
        proc = subprocess.Popen([cli, "dagster", "dev", "--port", str(port)], env=env, cwd=tmp_path,
                                stdout=log.open("wb"), stderr=subprocess.STDOUT)
        procs = [(proc, log)]
        family: list = []
        try:
            client = DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=60)

            def submit() -> str | None:
                try:
                    return client.submit_job_execution("feiqiu_ods_north", repository_location_name=LOCATION,
                                                       tags={"dagster/partition": str(NORTH[0])})
                except Exception:  # noqa: BLE001 - still starting
                    return None

            run_id = wait_for("dagster dev accepting a run", submit, procs=procs, every=0.5)
            ready = time.monotonic() - began
            wait_for("the run to end", lambda: client.get_run_status(run_id).value in ("SUCCESS", "FAILURE"),
                     procs=procs, every=0.5)
            assert client.get_run_status(run_id).value == "SUCCESS", log.read_text(errors="replace")[-4000:]
            runs = subprocess.run([cli, "runs", "--json"], env=env, cwd=tmp_path, capture_output=True, text=True,
                                  timeout=120)
            family = psutil.Process(proc.pid).children(recursive=True)
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            proc.wait(STOP_WAIT_TEST)
            stopped = time.monotonic() - began
        finally:
            stop([proc])
        output = log.read_text(errors="replace")
        monkeypatch.setenv("FEIQIU_ETL_HOME", str(fresh_home))
        pgdata = home_layout().pgdata
    assert proc.returncode == 0, output[-4000:]
    assert "Traceback" not in output
    assert runs.returncode == 0, runs.stderr
    recorded = json.loads(runs.stdout)  # the warehouse every other command opens by default
    assert [(r["command"], r["status"]) for r in recorded] == [("dagster", "SUCCESS")], recorded
    assert "warehouse: database feiqiu_etl on it" in output and "password" not in output
    yaml_text = (fresh_home / "dagster" / "dagster.yaml").read_text(encoding="utf-8")
    assert "postgresql+psycopg2://postgres@/dagster?" in yaml_text and "QueuedRunCoordinator" in yaml_text
    _, alive = psutil.wait_procs(family, timeout=30)
    assert alive == [], [p.cmdline() for p in alive]  # Dagster's processes ended with it
    assert not (pgdata / "postmaster.pid").exists()  # and the embedded server stopped after them
    print(json.dumps({"ready_s": round(ready, 1), "stopped_s": round(stopped, 1)}))
