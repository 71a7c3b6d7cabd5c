"""Issue 18 item 9: the scheduling recipes of the docs work as written. The cron line is read from the docs
page ``docs/guides/scheduling.md`` (it was README's section "Scheduling without Dagster" until issue 26; so the
document cannot drift from what is tested), only its paths are changed, and it runs once the way cron runs it
(``/bin/sh -c``, a bare environment, no terminal) against the simulator and the embedded PostgreSQL; the systemd
units are read from that page too and checked with ``systemd-analyze verify``."""

from __future__ import annotations

import configparser
import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

from feiqiu_etl.simulator import Simulator
from flowkit import sim_config

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "scheduling.md"
PRODUCT = "/opt/feiqiu-etl/.venv/bin/feiqiu-etl"


def section() -> str:
    """The scheduling page, whole (one page: cron, then systemd)."""
    return PAGE.read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section(), flags=re.S)


def cron_line() -> tuple[str, str]:
    """(schedule, command) of the one crontab line of the section."""
    lines = [line for block in blocks("cron") for line in block.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) == 1, lines
    fields = lines[0].split(None, 5)
    return " ".join(fields[:5]), fields[5]


def localised(command: str, root: Path) -> str:
    """``command`` with the page's paths moved under ``root`` and the product's path replaced by this
    checkout's console script; nothing else changes."""
    product = Path(sys.executable).with_name("feiqiu-etl")
    assert product.exists(), product
    moved = command.replace(PRODUCT, str(product))
    for prefix, folder in (("/etc/feiqiu-etl", "etc"), ("/var/log/feiqiu-etl", "log"), ("/run/lock", "lock"),
                           ("/var/lib/feiqiu-etl", "lib")):
        (root / folder).mkdir(exist_ok=True)
        moved = re.sub(rf"{re.escape(prefix)}(?=/|\s|$)", str(root / folder), moved, flags=re.M)
    left = re.findall(r"(?<![\w.-])/(?:etc|var|run|opt)/\S*", moved)
    assert left == [], f"a path of the docs' cron line the test does not move: {left}"
    return moved


def test_the_docs_cron_line_runs_a_night_once(pg_dsn, tmp_path):
    schedule, command = cron_line()
    assert schedule == "30 2 * * *"
    assert "flock -n" in command and "--env-file" in command
    line = localised(command, tmp_path)
    with Simulator(sim_config(seed=3)) as sim:
        site = sim.config.site_ids[0]
        (tmp_path / "etc" / "feiqiu.env").write_text(
            f"FEIQIU_API_BASE={sim.base_url}\nFQ_TOKEN_NORTH={sim.config.token}\nETL_DB_DSN={pg_dsn}\n",
            encoding="utf-8")
        (tmp_path / "etc" / "fleet.yaml").write_text(
            "lanes:\n  - name: north\n    token_env: FQ_TOKEN_NORTH\n"
            f"    stores: [{{site_id: {site}}}]\n    tasks: [ODS_TABLE_AREA]\n"
            "    pipeline: {rate_min: 3, rate_max: 3.2}\n", encoding="utf-8")
        cron_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SHELL": "/bin/sh",
                    "LOGNAME": os.environ.get("LOGNAME", "root")}
        done = subprocess.run(["/bin/sh", "-c", line], cwd=tmp_path, env=cron_env, capture_output=True, text=True,
                              timeout=180)
        log = (tmp_path / "log" / "run.log").read_text(encoding="utf-8")
        assert done.returncode == 0, (done.stdout, done.stderr, log)
        assert done.stdout == "" and done.stderr == "", "cron would mail this"
        assert "Traceback" not in log and sim.config.token not in log

        with open(tmp_path / "lock" / "feiqiu-etl.lock", "w") as held:  # the previous night still runs
            fcntl.flock(held, fcntl.LOCK_EX)
            busy = subprocess.run(["/bin/sh", "-c", line], cwd=tmp_path, env=cron_env, capture_output=True,
                                  text=True, timeout=30)
        assert busy.returncode == 6, (busy.stdout, busy.stderr)
    with psycopg.connect(pg_dsn) as conn:
        runs = conn.execute("SELECT status, exit_code, stores, tasks, rows_written FROM etl_meta.run").fetchall()
        areas = conn.execute("SELECT count(*) FROM ods.table_area WHERE site_id = %s", (site,)).fetchone()[0]
    assert runs == [("SUCCESS", 0, [site], ["ODS_TABLE_AREA"], areas)] and areas > 0, runs


def unit_files(root: Path) -> list[Path]:
    """The docs' systemd units, written under ``root`` with their names and the paths moved."""
    out = []
    for block in blocks("ini"):
        name = re.match(r"# /etc/systemd/system/(\S+)\n", block)
        assert name, block[:80]
        path = root / name.group(1)
        path.write_text(localised(block[name.end():], root), encoding="utf-8")
        out.append(path)
    return out


def test_the_docs_systemd_units_are_valid(tmp_path):
    units = unit_files(tmp_path)
    assert sorted(p.name for p in units) == ["feiqiu-etl.service", "feiqiu-etl.timer"]
    service, timer = sorted(units)
    parsed = {}
    for path in (service, timer):
        parser = configparser.ConfigParser(interpolation=None, strict=True)
        parser.optionxform = str
        parser.read(path, encoding="utf-8")
        parsed[path.suffix] = parser
    svc = parsed[".service"]["Service"]
    assert svc["Type"] == "oneshot" and svc["KillMode"] == "mixed" and svc["SuccessExitStatus"] == "6"
    assert svc["ExecStart"].split()[0] == str(Path(sys.executable).with_name("feiqiu-etl"))
    assert " run " in svc["ExecStart"] and "--env-file" in svc["ExecStart"]
    assert parsed[".timer"]["Timer"]["Persistent"] == "true"
    assert parsed[".timer"]["Install"]["WantedBy"] == "timers.target"
    analyze = shutil.which("systemd-analyze")
    if analyze is None:  # Debian: package systemd; without it the units were parsed above, and that is all
        return
    checked = subprocess.run([analyze, "verify", "--man=no", str(service), str(timer)], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0 and checked.stderr.strip() == "", checked.stderr
    calendar = subprocess.run([analyze, "calendar", parsed[".timer"]["Timer"]["OnCalendar"]], capture_output=True,
                              text=True, timeout=30)
    assert calendar.returncode == 0 and "Normalized form: *-*-* 02:30:00" in calendar.stdout, calendar.stdout
