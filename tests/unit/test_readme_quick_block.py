"""The README's quick simulator block works in the README's order: after a first run against the default
simulator, the quick one gets a fresh home (so no details owed from the first simulator, which the new one
answers with 40401, turn the run PARTIAL)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_quick_simulator_block_starts_a_fresh_home_before_its_run():
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    (quick,) = [b for b in blocks if "kill %1" in b and "--gap-standard 0.2" in b]
    lines = quick.splitlines()
    fresh = next(i for i, line in enumerate(lines) if line.startswith("export FEIQIU_ETL_HOME=$(mktemp -d)"))
    run = next(i for i, line in enumerate(lines) if line.startswith("feiqiu-etl run"))
    assert fresh < run, quick
