"""The quick simulator block of the docs (``docs/getting-started/simulator.md``, README's until issue 26) works
in the page's order: after a first run against the default
simulator, the quick one gets a fresh home (so no details owed from the first simulator, which the new one
answers with 40401, turn the run PARTIAL)."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started" / "simulator.md"


def test_the_quick_simulator_block_starts_a_fresh_home_before_its_run():
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    (quick,) = [b for b in blocks if "kill %1" in b and "--gap-standard 0.2" in b]
    lines = quick.splitlines()
    fresh = next(i for i, line in enumerate(lines) if line.startswith("export FEIQIU_ETL_HOME=$(mktemp -d)"))
    run = next(i for i, line in enumerate(lines) if line.startswith("feiqiu-etl run"))
    assert fresh < run, quick
