"""The fleet on Dagster (feiqiu-etl[dagster]): Dagster's own execution API against the real simulator over HTTP
and real PostgreSQL, on a persistent Dagster instance whose pools have limit 1.

What keeps a token's lane serial across Dagster runs is the instance's concurrency pool: each step claims a
slot of its lane's pool in the instance storage before it starts (op granularity, the default) and waits while
another run holds it. The PostgreSQL lane guard underneath is the safety net when a pool has no limit.
"""

from __future__ import annotations

import json
import uuid
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest

dg = pytest.importorskip("dagster")

from feiqiu_etl.config.settings import reveal  # noqa: E402
from feiqiu_etl.connector.windows import fmt  # noqa: E402
from feiqiu_etl.dagster import DWD_KEY, FleetSettings, build_definitions, lane_key, pool_name  # noqa: E402
from feiqiu_etl.plan.fleet import load_fleet  # noqa: E402
from feiqiu_etl.simulator import Simulator  # noqa: E402
from flowkit import (ANCHOR, FAST, as_environment, dwd_exact, fleet_file, lane_violations,  # noqa: E402
                     sim_config, store_exact)

NORTH = (8640015201004417, 8640015201004418)
SOUTH = (8640015201004421,)
FORBIDDEN = 8640015201004499     # in the north lane, but the north token may not read it
TASKS = ["ODS_MEMBER", "ODS_SETTLEMENT", "ODS_PAYMENT", "ODS_GOODS"]
TOKENS = {"FQ_NORTH": "fq_north", "FQ_SOUTH": "fq_south"}
NO_TELEMETRY = "telemetry:\n  enabled: false\n"
POOLS_OF_ONE = "concurrency:\n  pools:\n    default_limit: 1\n"


def _window(days: int) -> dict:
    return {"window_start": fmt(ANCHOR - timedelta(days=days)), "window_end": fmt(ANCHOR), "task_codes": TASKS}


def _instance_home(path: Path, pools: bool, storage_dsn: str | None = None) -> Path:
    """A persistent Dagster instance set up once, as a deployment would be, before any run: SQLite storage, or
    with ``storage_dsn`` PostgreSQL's (dagster-postgres, as docs/scale-out.md deploys it)."""
    path.mkdir()
    storage = ""
    if storage_dsn is not None:
        from feiqiu_etl.dagster.instance import storage_url

        storage = f"storage:\n  postgres:\n    postgres_url: \"{storage_url(storage_dsn)}\"\n"
    (path / "dagster.yaml").write_text(NO_TELEMETRY + (POOLS_OF_ONE if pools else "") + storage, encoding="utf-8")
    with dg.DagsterInstance.from_config(str(path)) as instance:
        instance.get_run_records(limit=1)
    return path


def _sim(seed: int, sites) -> Simulator:
    tokens = {"fq_north": tuple(s for s in NORTH if s in sites), "fq_south": SOUTH}  # never FORBIDDEN
    return Simulator(sim_config(seed=seed, site_ids=tuple(sites), tokens=tokens, token="fq_admin"))


def _range_tags(first: str, last: str) -> dict:
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    return {ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last}


def _materializations(instance, key) -> dict[str, dict]:
    """{partition: metadata values} of the latest materialization of each partition of ``key``."""
    out = {}
    for record in instance.fetch_materializations(key, limit=100).records:
        m = record.asset_materialization
        out.setdefault(m.partition or "", {k: v.value for k, v in m.metadata.items()})
    return out


def test_the_fleet_materializes_store_by_store_and_dwd_follows(pg_dsn, tmp_path):
    sites = NORTH + (FORBIDDEN,) + SOUTH
    fleet = fleet_file(tmp_path / "fleet.yaml", {"north": ("FQ_NORTH", NORTH + (FORBIDDEN,)), "south": ("FQ_SOUTH", SOUTH)})
    home = _instance_home(tmp_path / "dagster", pools=True)
    with _sim(71, sites) as sim, dg.DagsterInstance.from_config(str(home)) as instance:
        defs = build_definitions(FleetSettings(fleet, dsn=pg_dsn, api_base=sim.base_url, overrides=FAST,
                                               unsafe_gaps=True, run_options=_window(sim.config.days), environ=TOKENS))
        north_key, south_key = dg.AssetKey(["feiqiu", "ods", "north"]), dg.AssetKey(["feiqiu", "ods", "south"])
        pools = {k: defs.resolve_assets_def(k).op.pool for k in (north_key, south_key)}
        assert pools == {north_key: pool_name("feiqiu", load_fleet(fleet).lanes[0], TOKENS),
                         south_key: pool_name("feiqiu", load_fleet(fleet).lanes[1], TOKENS)}
        assert all("fq_" not in p for p in pools.values()) and len(set(pools.values())) == 2
        assert {s.name for s in defs.schedules} == {"feiqiu_ods_north_daily", "feiqiu_ods_south_daily",
                                                    "feiqiu_freshness_hourly"}

        before = dg.evaluate_automation_conditions(defs=defs, instance=instance)  # the sensor's first tick
        assert before.get_num_requested(DWD_KEY) == 0  # nothing in ODS yet: no DWD load

        # both north stores in ONE run: one lane, the stores interleaved fairly, metadata per partition
        north = defs.resolve_job_def("feiqiu_ods_north").execute_in_process(
            instance=instance, tags=_range_tags(str(NORTH[0]), str(NORTH[1])))
        assert north.success
        south = defs.resolve_job_def("feiqiu_ods_south").execute_in_process(instance=instance, partition_key=str(SOUTH[0]))
        assert south.success
        # a forbidden store fails its materialization with the reason (40103), alone
        forbidden = defs.resolve_job_def("feiqiu_ods_north").execute_in_process(
            instance=instance, partition_key=str(FORBIDDEN), raise_on_error=False)
        assert not forbidden.success
        failure = [e for e in forbidden.all_events if e.is_step_failure][0].step_failure_data.error
        assert "40103" in failure.message and f"store {FORBIDDEN} FAILED" in failure.message

        # the automation sensor's condition asks for DWD now that ODS was updated (the forbidden store is
        # missing, which must not block it)
        evaluation = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=before.cursor)
        assert evaluation.get_num_requested(DWD_KEY) == 1
        dwd = defs.resolve_job_def("feiqiu_dwd").execute_in_process(instance=instance)
        assert dwd.success

        for site in NORTH + SOUTH:
            store_exact(pg_dsn, sim, site, TASKS)
            dwd_exact(pg_dsn, site, TASKS)
        log = sim.request_log()
    meta = {**_materializations(instance, north_key), **_materializations(instance, south_key)}
    assert set(meta) == {str(s) for s in NORTH + SOUTH}  # the forbidden store is not materialized
    for site in NORTH + SOUTH:
        m = meta[str(site)]
        assert m["status"] == "SUCCESS" and m["rows"] > 0 and m["rejections"] == 0 and m["errors"] == 0, m
        assert m["requests"] == sum(1 for e in log if e.site_id == site), (site, m)
        lane = load_fleet(fleet).lanes[0 if site in NORTH else 1]
        assert m["feiqiu_run_id"] and m["lane_key"] == lane_key("feiqiu", lane, TOKENS)
        assert pools[north_key if site in NORTH else south_key] == m["lane_key"].replace(":", "_")
    assert meta[str(NORTH[0])]["feiqiu_run_id"] == meta[str(NORTH[1])]["feiqiu_run_id"]  # one run, two partitions
    dwd_meta = _materializations(instance, DWD_KEY)[""]
    assert dwd_meta["status"] == "SUCCESS" and dwd_meta["tables_failed"] == 0 and dwd_meta["rows_inserted"] > 0
    with psycopg.connect(pg_dsn) as conn:
        runs = conn.execute("SELECT command, status, args->>'dagster_run_id' FROM etl_meta.run ORDER BY started_at").fetchall()
    assert [(c, s) for c, s, _ in runs] == [("dagster", "SUCCESS")] * 2 + [("dagster", "FAILED"), ("dagster", "SUCCESS")]
    assert runs[0][2] == north.run_id
    assert lane_violations([e for e in log if e.site_id in NORTH + (FORBIDDEN,)], 0.01) == []


# ---------------------------------------------------------------------------------------- across processes
DEFS_FILE = """
import os, pathlib, time
from feiqiu_etl.dagster import FleetSettings, build_definitions

gate = pathlib.Path({gate!r})  # start barrier: every process has imported Dagster before any run begins
(gate / f"ready-{{os.getpid()}}").touch()
deadline = time.monotonic() + 120
while not (gate / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
defs = build_definitions(FleetSettings({fleet!r}, dsn={dsn!r}, api_base={base!r}, overrides={overrides!r},
                                       unsafe_gaps=True, run_options={run_options!r}, wait_for_lane={wait!r}))
"""


def _defs_file(tmp_path: Path, fleet: str, dsn: str, sim: Simulator, *, wait: float | None = None,
               gap: float | None = None) -> Path:
    """A definitions file for ``dagster asset materialize -f`` (gaps: FAST, or ``gap`` s for longer runs)."""
    overrides = FAST if gap is None else {**FAST, "pipeline.rate_min": gap, "pipeline.rate_max": gap * 1.25}
    path = tmp_path / "fleet_defs.py"
    (tmp_path / "gate").mkdir(exist_ok=True)
    path.write_text(DEFS_FILE.format(fleet=fleet, dsn=dsn, base=sim.base_url, overrides=overrides, wait=wait,
                                     gate=str(tmp_path / "gate"), run_options=_window(sim.config.days)),
                    encoding="utf-8")
    return path


def _start(tmp_path: Path, home: Path, defs_file: Path, jobs: list[tuple[str, str]], **kw) -> list[subprocess.Popen]:
    """One ``dagster asset materialize`` process per (asset key, partition), released together once all of
    them have imported Dagster and loaded the definitions file."""
    gate = tmp_path / "gate"
    for old in gate.iterdir():
        old.unlink()
    env = {**os.environ, **TOKENS, "DAGSTER_HOME": str(home)}
    procs = [subprocess.Popen([sys.executable, "-m", "dagster", "asset", "materialize", "-f", str(defs_file),
                               "--select", key, "--partition", partition],
                              cwd=tmp_path, env=env, **{"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, **kw})
             for key, partition in jobs]
    deadline = time.monotonic() + 120
    while len(list(gate.glob("ready-*"))) < len(procs) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [(p.communicate()[0] or "")[-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.02)
    (gate / "go").touch()
    return procs


def _materialize_at_once(tmp_path: Path, home: Path, defs_file: Path, jobs: list[tuple[str, str]]):
    """Run :func:`_start`'s processes to the end: (exit codes, outputs)."""
    procs = _start(tmp_path, home, defs_file, jobs)
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    return [p.returncode for p in procs], outputs


def _runs_by_site(dsn: str) -> dict[int, tuple]:
    """{site id: (started_at, finished_at, status, summary)} of the feiqiu-etl runs the steps made."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT stores, started_at, finished_at, status, summary FROM etl_meta.run").fetchall()
    return {stores[0]: (start, end, status, summary) for stores, start, end, status, summary in rows}


def _span(log, sites) -> tuple[float, float]:
    mine = [e for e in log if e.site_id in sites]
    return min(e.started for e in mine), max(e.ended for e in mine)


@pytest.mark.timeout(400)
def test_runs_of_one_token_take_turns_in_its_pool_and_other_tokens_run_alongside(pg_server_dsn, pg_dsn, tmp_path):
    fleet = fleet_file(tmp_path / "fleet.yaml", {"north": ("FQ_NORTH", NORTH), "south": ("FQ_SOUTH", SOUTH)})
    # PostgreSQL storage, as deployed: on SQLite two steps that start in the same instant can both claim the
    # pool's one slot (seen in every full suite run on a busy machine: the second north run BUSY at the lane guard)
    import psycopg.conninfo as ci

    from feiqiu_etl.db.embedded import create_database

    storage_db = f"dagster_{uuid.uuid4().hex[:10]}"
    create_database(pg_server_dsn, storage_db)
    home = _instance_home(tmp_path / "dagster", pools=True, storage_dsn=ci.make_conninfo(pg_server_dsn, dbname=storage_db))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        # the pools exist with their one slot before any run, as a deployment sets them (`dagster instance
        # concurrency set POOL 1`): left to default_limit, two steps starting at once can each create the pool
        # (SQLite storage) and both run — seen once in CI as a BUSY second run
        for lane in load_fleet(fleet).lanes:
            instance.event_log_storage.set_concurrency_slots(pool_name("feiqiu", lane, TOKENS), 1)
    with _sim(72, NORTH + SOUTH) as sim:
        defs_file = _defs_file(tmp_path, fleet, pg_dsn, sim)  # no waiting at the lane guard: the pool must do it
        started = time.monotonic()
        codes, outputs = _materialize_at_once(tmp_path, home, defs_file, [
            ("feiqiu/ods/north", str(NORTH[0])), ("feiqiu/ods/north", str(NORTH[1])), ("feiqiu/ods/south", str(SOUTH[0]))])
        wall = time.monotonic() - started
        log = sim.request_log()
        assert codes == [0, 0, 0], "\n".join(o[-3000:] for o in outputs)
        for site in NORTH + SOUTH:
            store_exact(pg_dsn, sim, site, TASKS)
    runs = _runs_by_site(pg_dsn)
    assert {site: r[2] for site, r in runs.items()} == {site: "SUCCESS" for site in NORTH + SOUTH}
    # same token: strictly serial at the simulator, and the two runs never overlapped at all — the second
    # feiqiu-etl run began only after the first ended, so it was Dagster's pool, not the lane guard, that waited
    assert lane_violations([e for e in log if e.site_id in NORTH], 0.01) == []
    first, second = sorted(NORTH, key=lambda s: runs[s][0])
    assert runs[second][0] >= runs[first][1], (runs[first][:2], runs[second][:2])
    assert _span(log, [second])[0] >= _span(log, [first])[1]
    # a different token does not wait for north's pool: its requests overlap north's in time
    north_span, south_span = _span(log, NORTH), _span(log, SOUTH)
    overlap = min(north_span[1], south_span[1]) - max(north_span[0], south_span[0])
    assert overlap > 0, (north_span, south_span)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_run_records()
        assert len(records) == 3 and all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records)
        assert instance.event_log_storage.get_concurrency_info(pool_name(
            "feiqiu", load_fleet(fleet).lanes[0], TOKENS)).claimed_slots == []  # every slot given back
    print(json.dumps({"wall_s": round(wall, 1), "north_span_s": round(north_span[1] - north_span[0], 2),
                      "south_span_s": round(south_span[1] - south_span[0], 2), "overlap_s": round(overlap, 2)}))


@pytest.mark.timeout(400)
def test_without_a_pool_limit_the_lane_guard_makes_the_second_run_wait(pg_dsn, tmp_path):
    fleet = fleet_file(tmp_path / "fleet.yaml", {"north": ("FQ_NORTH", NORTH)})
    home = _instance_home(tmp_path / "dagster", pools=False)  # misconfigured: the pool has no limit
    with _sim(73, NORTH) as sim:
        defs_file = _defs_file(tmp_path, fleet, pg_dsn, sim, wait=120.0, gap=0.05)  # runs of ~4 s: they overlap
        codes, outputs = _materialize_at_once(tmp_path, home, defs_file, [
            ("feiqiu/ods/north", str(NORTH[0])), ("feiqiu/ods/north", str(NORTH[1]))])
        log = sim.request_log()
        assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
        for site in NORTH:
            store_exact(pg_dsn, sim, site, TASKS)
    assert all("has no limit in this Dagster instance" in o for o in outputs)
    runs = _runs_by_site(pg_dsn)
    assert {site: r[2] for site, r in runs.items()} == {site: "SUCCESS" for site in NORTH}
    # first: the run that got the lane (its record may have started a moment after the other's)
    first, second = sorted(NORTH, key=lambda s: _span(log, [s])[0])
    assert runs[second][0] < runs[first][1]  # both runs were going at once ...
    assert lane_violations([e for e in log if e.site_id in NORTH], 0.01) == []  # ... yet the lane stayed serial
    assert _span(log, [second])[0] >= _span(log, [first])[1]  # the second waited for the lane guard


def test_the_module_loads_from_FEIQIU_FLEET_for_dagster_dev(tmp_path):
    fleet = fleet_file(tmp_path / "fleet.yaml", {"north": ("FQ_NORTH", NORTH), "south-east": ("FQ_SOUTH", SOUTH)})
    env = {**os.environ, "DAGSTER_HOME": str(_instance_home(tmp_path / "dagster", pools=True))}
    env.pop("FEIQIU_FLEET", None)
    validate = [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "feiqiu_etl.dagster"]
    ok = subprocess.run(validate, cwd=tmp_path, env={**env, "FEIQIU_FLEET": fleet}, capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    from feiqiu_etl.dagster import FleetDefinitionsError, definitions_from_env

    with pytest.raises(FleetDefinitionsError, match="set FEIQIU_FLEET to the fleet file"):
        definitions_from_env({})  # what the code location shows when the variable is missing

    defs = definitions_from_env({"FEIQIU_FLEET": fleet, "FEIQIU_DAGSTER_CRON": "30 1 * * *"})
    assert {s.name: s.cron_schedule for s in defs.schedules} == {
        "feiqiu_ods_north_daily": "30 1 * * *", "feiqiu_ods_south_east_daily": "30 1 * * *",
        "feiqiu_freshness_hourly": "15 * * * *"}
    assert {j.name for j in defs.jobs} >= {"feiqiu_ods_north", "feiqiu_ods_south_east", "feiqiu_dwd"}
    assert defs.resolve_assets_def(["feiqiu", "ods", "north"]).op.pool == "feiqiu_env_FQ_NORTH"  # no token here
    tick = defs.resolve_schedule_def("feiqiu_ods_north_daily").evaluate_tick(
        dg.build_schedule_context(scheduled_execution_time=datetime(2024, 3, 4, 1, 30),
                                  repository_def=defs.get_repository_def()))
    assert [r.partition_key for r in tick.run_requests] == [str(s) for s in NORTH]  # one run per store
    assert [r.run_key for r in tick.run_requests] == [f"north:{s}:2024-03-04T01:30" for s in NORTH]


def test_bad_fleet_files_and_options_are_one_line_errors(tmp_path):
    from feiqiu_etl.dagster import FleetDefinitionsError

    bad = tmp_path / "f.yaml"
    bad.write_text("lanes:\n  - {name: a, token_env: FQ_A, stores: [{site_id: x}]}\n", encoding="utf-8")
    with pytest.raises(FleetDefinitionsError, match=r"f\.yaml: lanes\[0\] \(a\)\.stores\[0\]\.site_id"):
        build_definitions(bad)
    good = fleet_file(tmp_path / "g.yaml", {"a-b": ("FQ_A", (1,)), "a_b": ("FQ_B", (2,))})
    with pytest.raises(FleetDefinitionsError, match="clash"):
        build_definitions(good)
    with pytest.raises(FleetDefinitionsError, match="'stores'"):
        build_definitions(FleetSettings(fleet_file(tmp_path / "h.yaml", {"a": ("FQ_A", (1,))}),
                                        run_options={"stores": [1]}))


def _mid_lane(tmp_path: Path, home: Path, fleet: str, dsn: str, sim: Simulator, **kw) -> subprocess.Popen:
    """One materialization of north's first store with 0.2 s gaps, returned once 5 requests reached the simulator."""
    (proc,) = _start(tmp_path, home, _defs_file(tmp_path, fleet, dsn, sim, gap=0.2),
                     [("feiqiu/ods/north", str(NORTH[0]))], **kw)
    deadline = time.monotonic() + 120
    while len(sim.request_log()) < 5 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None and len(sim.request_log()) >= 5, "the run did not get going"
    return proc


@pytest.mark.timeout(300)
def test_terminating_a_dagster_run_cancels_the_feiqiu_run_gracefully(pg_dsn, tmp_path):
    fleet = fleet_file(tmp_path / "fleet.yaml", {"north": ("FQ_NORTH", NORTH)})
    home = _instance_home(tmp_path / "dagster", pools=True)
    with _sim(74, NORTH) as sim:
        proc = _mid_lane(tmp_path, home, fleet, pg_dsn, sim, stdout=subprocess.PIPE)
        proc.terminate()  # what Dagster's run termination sends the run worker
        output = proc.communicate(timeout=60)[0]
        sent = len(sim.request_log())
        time.sleep(0.5)
        assert len(sim.request_log()) == sent  # nothing is sent after the process ended
    assert proc.returncode != 0 and "cancelling the feiqiu-etl run" in output, output[-3000:]
    with psycopg.connect(pg_dsn) as conn:
        status, error = conn.execute("SELECT status, error FROM etl_meta.run").fetchone()
    assert status == "CANCELLED" and "dagster" in error, output[-6000:]  # not left RUNNING/INTERRUPTED
    assert 5 <= sent < 100


@pytest.mark.timeout(300)
def test_a_worker_killed_mid_lane_frees_the_lock_at_once_and_its_pool_slot_once_reported(pg_dsn, tmp_path):
    from feiqiu_etl.registry.lane_guard import lock_key

    fleet = fleet_file(tmp_path / "fleet.yaml", {"north": ("FQ_NORTH", NORTH)})
    home = _instance_home(tmp_path / "dagster", pools=True)
    pool = pool_name("feiqiu", load_fleet(fleet).lanes[0], TOKENS)
    key = lock_key(lane_key("feiqiu", load_fleet(fleet).lanes[0], TOKENS))
    with _sim(75, NORTH) as sim:
        proc = _mid_lane(tmp_path, home, fleet, pg_dsn, sim, stdout=subprocess.DEVNULL)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            taken = "SELECT pg_try_advisory_lock(%s)"
            assert not conn.execute(taken, (key,)).fetchone()[0]  # the run holds its lane guard
            proc.kill()  # the run worker dies mid-lane: no cleanup of any kind
            proc.wait(30)
            killed_requests = len(sim.request_log())
            freed = time.monotonic() + 5  # PostgreSQL ends the session when its client's socket closes
            while not conn.execute(taken, (key,)).fetchone()[0]:
                assert time.monotonic() < freed, "the lane guard outlived its process"
                time.sleep(0.05)
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        with dg.DagsterInstance.from_config(str(home)) as instance:
            (dead,) = instance.get_runs()
            assert dead.status == dg.DagsterRunStatus.STARTED  # Dagster does not know yet ...
            claimed = instance.event_log_storage.get_concurrency_info(pool).claimed_slots
            assert [s.run_id for s in claimed] == [dead.run_id]  # ... and the lane's slot is still taken
            # what run monitoring does (run_monitoring.enabled + free_slots_after_run_end_seconds, see
            # docs/scale-out.md): mark the run failed, then give its slots back
            instance.report_run_failed(dead)
            instance.event_log_storage.free_concurrency_slots_for_run(dead.run_id)
        codes, outputs = _materialize_at_once(tmp_path, home, _defs_file(tmp_path, fleet, pg_dsn, sim),
                                              [("feiqiu/ods/north", str(NORTH[0]))])
        assert codes == [0], outputs[0][-3000:]
        store_exact(pg_dsn, sim, NORTH[0], TASKS)
        assert len(sim.request_log()) > killed_requests
    with psycopg.connect(pg_dsn) as conn:
        statuses = [r[0] for r in conn.execute("SELECT status FROM etl_meta.run ORDER BY started_at")]
    assert statuses == ["INTERRUPTED", "SUCCESS"]  # the next run found the dead one and said so


def test_a_step_reads_the_environment_as_the_cli_does(pg_dsn, tmp_path):
    """Issue 19: a step reads ``FEIQIU_API_BASE``, ``ETL_DB_DSN`` and every ``PIPELINE_*``/``API_*`` setting from its
    environment through the CLI's code path and in the CLI's order — the environment beats the fleet file's
    top-level ``api_base`` — with nothing passed to :func:`build_definitions` but the fleet and the window."""
    from feiqiu_etl.plan import RunOptions, prepare

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("api_base: http://127.0.0.1:9\n"  # nothing listens there: the environment must win
                     f"lanes:\n  - {{name: north, token_env: FQ_NORTH, stores: [{{site_id: {NORTH[0]}}}]}}\n",
                     encoding="utf-8")
    with _sim(76, NORTH) as sim:
        env = {**TOKENS, "FEIQIU_API_BASE": sim.base_url, "ETL_DB_DSN": pg_dsn, **as_environment(FAST)}
        window = _window(sim.config.days)
        cli = prepare(RunOptions(fleet_path=str(fleet), environ=env, unsafe_gaps=True, load_dwd=False, **window))
        (lane,) = cli.lanes
        assert lane.api_base == sim.base_url and lane.settings.source("api_base") == "environment"
        assert lane.configs["ODS_MEMBER"].rate_min == FAST["pipeline.rate_min"]
        assert lane.settings.resolve("ODS_MEMBER", "rate_min").source == "environment"
        assert reveal(cli.settings.db_dsn) == pg_dsn and cli.api_timeout == FAST["api.timeout"]

        defs = build_definitions(FleetSettings(str(fleet), unsafe_gaps=True, run_options=window, environ=env))
        with dg.DagsterInstance.ephemeral() as instance:
            result = defs.resolve_job_def("feiqiu_ods_north").execute_in_process(
                instance=instance, partition_key=str(NORTH[0]))
        assert result.success
        store_exact(pg_dsn, sim, NORTH[0], TASKS)
        log = sim.request_log()
    assert lane_violations(log, 0.01) == [] and log
    with psycopg.connect(pg_dsn) as conn:
        command, config = conn.execute("SELECT command, config FROM etl_meta.run").fetchone()
    assert command == "dagster"
    assert config["pipeline.rate_min"] == {"value": FAST["pipeline.rate_min"], "source": "environment"}
    assert config["api.timeout"]["source"] == "environment"


def test_a_step_reads_dotenv_as_the_cli_does(pg_dsn, tmp_path, monkeypatch):
    """The step's ``./.env`` is read by the CLI's own function: its settings count (source ``.env``), the real
    environment wins over it, and a setting it names that does not exist fails the step in one line, as
    ``feiqiu-etl run`` exits 2 for it."""
    fleet = fleet_file(tmp_path / "fleet.yaml", {"north": ("FQ_NORTH", NORTH)})
    for name, value in {**TOKENS, **as_environment(FAST)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PIPELINE_RATE_MAX", "0.03")  # the environment wins over .env
    (tmp_path / ".env").write_text("WINDOW_SEGMENT_DAYS=1\nPIPELINE_RATE_MAX=7\n", encoding="utf-8")  # cwd: tmp_path
    with _sim(77, NORTH) as sim:
        monkeypatch.setenv("FEIQIU_API_BASE", sim.base_url)
        monkeypatch.setenv("ETL_DB_DSN", pg_dsn)
        defs = build_definitions(FleetSettings(fleet, unsafe_gaps=True, run_options=_window(sim.config.days)))
        job = defs.resolve_job_def("feiqiu_ods_north")
        with dg.DagsterInstance.ephemeral() as instance:
            ok = job.execute_in_process(instance=instance, partition_key=str(NORTH[0]))
            (tmp_path / ".env").write_text("PIPELINE_RATE_MAXIMUM=7\n", encoding="utf-8")
            bad = job.execute_in_process(instance=instance, partition_key=str(NORTH[1]), raise_on_error=False)
        assert ok.success
        store_exact(pg_dsn, sim, NORTH[0], TASKS)
    with psycopg.connect(pg_dsn) as conn:
        (config,) = conn.execute("SELECT config FROM etl_meta.run").fetchone()  # the bad one never started a run
    assert config["window.segment_days"] == {"value": 1, "source": ".env"}
    assert config["pipeline.rate_max"] == {"value": 0.03, "source": "environment"}
    failure = [e for e in bad.all_events if e.is_step_failure][0].step_failure_data.error.message
    assert "unknown setting PIPELINE_RATE_MAXIMUM in .env" in failure and "\n" not in failure.strip()
