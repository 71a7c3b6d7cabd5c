"""The package as a user installs it (issue 27.7): ``python -m build`` makes a wheel and an sdist of this tree; each
installs into a clean venv of its own (no site packages, nothing from this checkout), and the installed command
runs — the wheel's the whole ``demo`` (the embedded PostgreSQL, the simulator, every task, DWD), the sdist's the
commands that read its package data (the connector, the web page's templates). Slow (minutes: pip resolves the
dependencies into each venv), hence its own marker: ``-m 'not packaging'`` leaves it out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = [pytest.mark.packaging, pytest.mark.integration, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]


def _clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "FEIQIU", "ETL_"))}
    return {**env, "FEIQIU_ETL_HOME": str(home)}


def _venv(path: Path, artifact: Path, env: dict) -> Path:
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(path)
    python = path / "bin" / "python"
    # --no-compile: pip would byte-compile every module of every dependency (faker's and babel's locales are
    # most of it; about 40 % of the install on a 2-CPU machine); Python compiles what the commands import anyway
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile", str(artifact)],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return path / "bin" / "feiqiu-etl"


def test_the_wheel_and_the_sdist_install_into_clean_venvs_and_run(tmp_path):
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), str(ROOT)],
                           capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = dist.glob("feiqiu_etl-*.whl")
    (sdist,) = dist.glob("feiqiu_etl-*.tar.gz")
    env = _clean_env(tmp_path / "home")

    from_wheel = _venv(tmp_path / "venv-wheel", wheel, env)
    demo = subprocess.run([str(from_wheel), "demo", "--json", "--days", "1"], capture_output=True, text=True,
                          env=env, timeout=900, cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr[-2000:]
    result = json.loads(demo.stdout)
    assert result["status"] == "SUCCESS" and result["rows_written"] > 0

    from_sdist = _venv(tmp_path / "venv-sdist", sdist, env)
    tasks = subprocess.run([str(from_sdist), "tasks"], capture_output=True, text=True, env=env, timeout=300)
    assert tasks.returncode == 0 and "ODS_MEMBER" in tasks.stdout, tasks.stderr[-1000:]
    located = subprocess.run([str(from_sdist.parent / "python"), "-c",
                              "import feiqiu_etl, pathlib; p = pathlib.Path(feiqiu_etl.__file__).parent; "
                              "print(p); assert (p / 'web/templates/base.html').is_file(); "
                              "assert (p / 'connector/feiqiu.dwd.yaml').is_file()"],
                             capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert located.returncode == 0, located.stderr[-1000:]
    assert str(ROOT) not in located.stdout  # the installed copy, not this checkout
