"""The chaos matrix: the flow against the simulator under each fault, compared with the simulator's data.

Every cell runs the real CLI (``feiqiu-etl run`` as a process, ODS and DWD) against the simulator and an
embedded PostgreSQL, under one fault, then — unless the cell must end SUCCESS by itself — one clean rerun, and
prints runs, records lost, records duplicated, owed details left, SCD2 invariant violations, statuses, exit
codes and tracebacks. Cells: kill -9 at random moments; SIGTERM, SIGINT, double SIGINT, ``--timeout``; the
product's connections terminated 3 times in one run; the server stopped (fast and immediate) and restarted;
the simulator killed and restarted; 5xx bursts; 429/42901 storms; truncated and non-UTF-8 bodies; responses
stalled past the timeout; a full disk (needs root and tmpfs).

Usage: python benchmarks/chaos_matrix.py [--kills 20]   (the output is a markdown table)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from chaoskit import (  # noqa: E402
    HEADER, disk_full, inject, injections, kill_at, random_moments, restart_server, restart_simulator, run_cell,
    signal_after, terminate_connections, timeout_after,
)
from feiqiu_etl.db.embedded import temporary_server  # noqa: E402


def cells(kills: int):
    for i, moment in enumerate(random_moments(kills, 0.3, 4.5)):
        yield f"kill -9 at {moment:.2f} s", kill_at(moment), {"seed": 100 + i}
    yield "SIGTERM", signal_after(40, signal.SIGTERM), {}
    yield "SIGINT", signal_after(40, signal.SIGINT), {}
    yield "double SIGINT", signal_after(40, signal.SIGINT, signal.SIGINT), {}
    yield "--timeout 2", timeout_after(2), {}
    yield "connections terminated 3x (no rerun)", terminate_connections(3), {"rerun": False}
    yield "server stopped (fast) and restarted (no rerun)", restart_server(2, signal.SIGINT), {"rerun": False}
    yield "server stopped (immediate) and restarted (no rerun)", restart_server(2, signal.SIGQUIT), {"rerun": False}
    yield "simulator killed and restarted", restart_simulator(1.0), {}
    yield "5xx bursts", injections(("http500", 3, None, {}), ("http502", 3, "/api/settlement/detail", {}),
                                   ("http503", 4, "/api/member/detail", {}), ("code50001", 3, None, {})), {}
    yield "429/42901 storms", injections(("http429", 6, None, {"retry_after": 1}),
                                         ("code42901", 6, None, {"retry_after": 1})), {"timeout": 600}
    yield "truncated bodies", inject("truncated", 5, None), {}
    yield "non-UTF-8 bodies", inject("non_utf8", 5, None), {}
    yield "responses stalled past the timeout", inject("stall", 2, "/api/settlement/list", stall_seconds=4), {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    args = parser.parse_args()
    started = time.monotonic()
    rows = []
    with temporary_server("fq-chaos-") as server:
        for name, fault, kw in cells(args.kills):
            result = run_cell(name, server, fault, **kw)
            rows.append(result)
            print(result.row(), file=sys.stderr, flush=True)
    rows.append(_disk_full_cell())
    print(f"command: python benchmarks/chaos_matrix.py --kills {args.kills}")
    print(HEADER)
    for r in rows:
        print(r.row())
    exact = sum(1 for r in rows if r.exact)
    print(f"\n{exact} of {len(rows)} cells exact (0 lost, 0 duplicated, 0 owed, 0 SCD2 violations, no traceback); "
          f"{time.monotonic() - started:.0f} s")


def _disk_full_cell():
    from chaoskit import CellResult

    if os.geteuid() != 0:
        return CellResult("disk full", notes=["not run: needs root to mount a small tmpfs"])
    mount = Path(tempfile.mkdtemp(prefix="fq-chaos-disk-"))
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400m", "tmpfs", str(mount)]).returncode != 0:
        return CellResult("disk full", notes=["not run: tmpfs mount refused"])
    try:
        os.chmod(mount, 0o755)
        os.environ["TMPDIR"] = str(mount)
        tempfile.tempdir = str(mount)
        with temporary_server("fq-chaos-disk-home-") as server:
            return run_cell("disk full for 3 s", server, disk_full(3.0))
    finally:
        tempfile.tempdir = None
        os.environ.pop("TMPDIR", None)
        subprocess.run(["umount", "-l", str(mount)])


if __name__ == "__main__":
    main()
