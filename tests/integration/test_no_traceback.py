"""Bad homes, bad ``.env`` files and bad connector files end with one line and exit 2, never a traceback
(issue 11, finding 7). Each case runs the real CLI in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from userkit import python_for

ROOT = os.geteuid() == 0


def _cli(*args: str, home: Path | str | None = None, prefix: list[str] | None = None, cwd=None,
         timeout: float = 120, nobody: bool = False, **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ETL_DB_DSN", "FEIQIU_ETL_HOME")} | extra_env
    if home is not None:
        env["FEIQIU_ETL_HOME"] = str(home)
    python = [sys.executable]
    if nobody:  # as the user nobody, who may not be able to read this checkout (userkit)
        python, more = python_for("nobody")
        env |= more
    return subprocess.run([*(prefix or []), *python, "-m", "feiqiu_etl", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=cwd)


def _one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_home_under_a_regular_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    _one_line(_cli("sql", "SELECT 1", home=tmp_path / "afile" / "home"), "afile")


def test_home_under_proc():
    _one_line(_cli("sql", "SELECT 1", home="/proc/feiqiu-etl-home"), "/proc/feiqiu-etl-home")


def _can_mount_read_only(path: Path) -> bool:
    if not ROOT or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs '{path}'"],
                           capture_output=True)
    return probe.returncode == 0


def test_home_on_a_read_only_filesystem(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    if not _can_mount_read_only(mount):
        pytest.skip("cannot mount a read-only filesystem here (needs root and mount namespaces)")
    script = (f"mount -t tmpfs -o ro tmpfs '{mount}' && exec \"$@\"")
    proc = _cli("sql", "SELECT 1", home=mount / "home", prefix=["unshare", "-m", "sh", "-c", script, "sh"])
    _one_line(proc, "Read-only file system")


def test_home_the_user_cannot_write(fresh_home):
    fresh_home.mkdir()
    if ROOT:  # root may write anywhere: the user is nobody, the folder root's
        fresh_home.chmod(0o755)
        proc = _cli("sql", "SELECT 1", home=fresh_home / "home", nobody=True, cwd="/")
    else:
        fresh_home.chmod(0o555)
        proc = _cli("sql", "SELECT 1", home=fresh_home / "home")
    _one_line(proc, "Permission denied", str(fresh_home / "home"))


def test_default_home_of_a_user_without_a_home_folder():
    if not ROOT:
        pytest.skip("needs root to run as nobody (whose home /nonexistent cannot be created)")
    _one_line(_cli("sql", "SELECT 1", nobody=True, cwd="/", HOME="/nonexistent"), "Permission denied")
    _one_line(_cli("sql", "SELECT 1", nobody=True, cwd="/", HOME="/root"), "Permission denied")


def test_pgdata_created_by_another_user(fresh_home):
    import pwd

    pgdata = fresh_home / "pgdata"
    pgdata.mkdir(parents=True)
    if ROOT:  # a data folder of nobody's, started by root; and root's, started by nobody
        fresh_home.chmod(0o755)
        nobody = pwd.getpwnam("nobody")
        os.chown(pgdata, nobody.pw_uid, nobody.pw_gid)
        _one_line(_cli("sql", "SELECT 1", home=fresh_home), "belongs to nobody")
        os.chown(pgdata, 0, 0)
        os.chown(fresh_home, nobody.pw_uid, nobody.pw_gid)
        _one_line(_cli("sql", "SELECT 1", home=fresh_home, nobody=True, cwd="/"), "belongs to root")
    else:
        pytest.skip("needs root to make a folder of another user")


def test_env_file_with_a_nul_byte(tmp_path):
    (tmp_path / ".env").write_bytes(b"PIPELINE_WORKERS=2\nFEIQIU_API_BASE=http://x\x00y\n")
    _one_line(_cli("tasks", cwd=tmp_path), ".env", "FEIQIU_API_BASE", "NUL")


def test_env_file_with_a_huge_value_is_blamed_on_the_file(tmp_path, fresh_home):
    (tmp_path / ".env").write_text("ETL_NOTE=" + "x" * 300_000 + "\n")
    line = _one_line(_cli("sql", "SELECT 1", home=fresh_home, cwd=tmp_path), ".env", "ETL_NOTE")
    assert "embedded" not in line.lower() and "xxxx" not in line


def test_binary_connector_file_names_the_file(tmp_path):
    binary = tmp_path / "connector.yaml"
    binary.write_bytes(bytes(range(256)) * 8)
    _one_line(_cli("tasks", "--connector", str(binary)), str(binary))
    deep = tmp_path / "deep.yaml"
    deep.write_text("tasks: " + "[" * 50_000)
    _one_line(_cli("tasks", "--connector", str(deep)), str(deep))
