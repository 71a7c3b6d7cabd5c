"""Shared fixtures.

* ``pg_server_dsn`` (session): admin DSN of one embedded PostgreSQL per test session, or ``$TEST_DB_DSN``.
* ``pg_dsn`` (function): DSN of a fresh, empty database for one test (dropped afterwards).
* ``fresh_home`` (function): a path in the temp dir that does not exist yet, for a home of one's own (the
  product creates it, so a server account can enter it when the tests run as root); removed afterwards.
* Hypothesis profile ``ci``: 100 examples per property, no deadline (threads make timing noisy).
* Order: the slowest files (:data:`SLOWEST_FIRST`) run first, the rest in collection order, so that with
  ``-n 2 --dist loadfile`` no long file starts last while the other worker has run dry (issue 26: ≤ 12 min).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# pytest-xdist's workers run with COLUMNS=80 and LINES=24 (execnet sets them), which every CLI process a test
# starts would inherit: a piped command would wrap its messages as on an 80-column terminal. The tests meet
# the commands as a script does (piped, no COLUMNS); a test that wants a width passes COLUMNS itself.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


SLOWEST_FIRST = (
    # the 18 slowest files of the README command with --durations=150 (main 72e3d4a, 2 workers, 2 CPUs), slowest
    # first; a file not named here keeps its place after them. The order only schedules: each file's tests still
    # run in file order, in one worker.
    "tests/integration/test_dagster_deployment.py",
    "tests/integration/test_dagster.py",
    "tests/integration/test_packaging.py",
    "tests/integration/test_web_login_throttle.py",
    "tests/integration/test_frozen_statement.py",
    "tests/properties/test_dwd_parallel_properties.py",
    "tests/integration/test_sql_session.py",
    "tests/integration/test_invalid_ids.py",
    "tests/integration/test_chaos_subset.py",
    "tests/integration/test_state_backfill.py",
    "tests/integration/test_embedded_lifetime.py",
    "tests/integration/test_frozen_database.py",
    "tests/integration/test_process_signals.py",
    "tests/integration/test_embedded_layouts.py",
    "tests/integration/test_sql_read_only.py",
    "tests/integration/test_alerts.py",
    "tests/integration/test_frozen_embedded.py",
    "tests/integration/test_integrity.py",
)


def pytest_configure(config):
    # xdist's --dist loadfile sorts files by their number of tests (many short unit tests first), which leaves
    # the one-test files of a minute and more for the end; the order below is longest-processing-time first.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::")[0], i)
    items.sort(key=lambda it: (rank.get(it.nodeid.split("::")[0], len(rank)), first_seen[it.nodeid.split("::")[0]]))


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path, monkeypatch):
    """Run every test (and the CLI processes it starts) from an empty folder, so that a developer's
    ``.env`` in the repository never changes a result."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def pg_server_dsn():
    external = os.environ.get("TEST_DB_DSN")
    if external:
        yield external
        return
    from feiqiu_etl.db.embedded import temporary_server

    with temporary_server(prefix="feiqiu-test-pg-") as server:  # password auth: the DSN names its passfile
        yield server.dsn("postgres")


def _with_database(dsn: str, database: str) -> str:
    import psycopg.conninfo as ci

    params = ci.conninfo_to_dict(dsn)
    params["dbname"] = database
    return ci.make_conninfo(**params)


@pytest.fixture
def pg_dsn(pg_server_dsn):
    from feiqiu_etl.db.embedded import create_database

    name = f"t_{uuid.uuid4().hex[:12]}"
    create_database(pg_server_dsn, name)
    yield _with_database(pg_server_dsn, name)
    import psycopg
    from psycopg import sql

    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def fresh_home():
    home = Path(tempfile.gettempdir()) / f"feiqiu-home-{uuid.uuid4().hex[:12]}"
    yield home
    shutil.rmtree(home, ignore_errors=True)
