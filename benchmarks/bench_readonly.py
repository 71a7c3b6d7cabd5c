"""Read-only commands with the embedded server running (issue 27.6): ``runs``, ``show``, ``status``, ``freshness``,
``state show``, ``config show`` — wall time of the whole process, median of ``--repeat`` (5), for this tree and,
with ``--baseline SRC`` (e.g. ``/work/main/src``), for another source tree run with the same interpreter, the
two alternating so that the machine's load hits both alike.

A home of its own (``FEIQIU_ETL_HOME`` in a temporary folder) whose embedded server a holder process keeps
running; one finished run seeded so that ``show`` has something to show. Byte code of the baseline goes to a
cache folder of its own (``PYTHONPYCACHEPREFIX``), never into its tree.

Usage: python benchmarks/bench_readonly.py [--repeat 5] [--baseline /work/main/src] [--output FILE]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import emit

HERE = Path(__file__).resolve().parents[1] / "src"
COMMANDS = (["runs"], ["show", "LAST"], ["status"], ["freshness"], ["state", "show"], ["config", "show"])
HOLDER = ("import sys; from feiqiu_etl.db.embedded import default_embedded; s = default_embedded().start(); "
          "print('ready', flush=True); sys.stdin.read(); s.stop()")


def env_for(src: Path, home: Path, cache: Path) -> dict:
    """The environment of one tree's commands. ``PYTHONDONTWRITEBYTECODE`` is dropped: with it (some sandboxes
    set it) and a cache folder of its own, every command compiled every module it imports, its dependencies'
    too — 2-3 s of CPU that a normal install (pip compiles at install; Python caches the rest on first use)
    never spends. The warm-up run writes the byte code into ``cache``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(src), "FEIQIU_ETL_HOME": str(home), "PYTHONPYCACHEPREFIX": str(cache),
            "COLUMNS": "160"}


def timed(args: list[str], env: dict) -> tuple[float, float]:
    """``(wall seconds, CPU seconds)`` of one command (user + system of the process; the server's not counted):
    on a busy machine the wall time is mostly waiting for a CPU, the CPU time is the command's own work."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "feiqiu_etl", *args], capture_output=True, text=True, env=env,
                          timeout=120)
    took = time.monotonic() - t0
    if proc.returncode not in (0, 8):
        raise SystemExit(f"{shlex.join(args)}: exit {proc.returncode}: {proc.stderr[-500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another source tree (its src folder) to compare with")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    trees = {"this tree": HERE}
    if args.baseline:
        trees = {"baseline": args.baseline.resolve(), **trees}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fq-bench-ro-") as tmp:
        home = Path(tmp) / "home"
        caches = {name: Path(tmp) / f"pyc-{i}" for i, name in enumerate(trees)}
        env = env_for(HERE, home, caches["this tree"])
        holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env)
        try:
            assert holder.stdout.readline().strip() == "ready", "the embedded server did not start"
            seed = subprocess.run([sys.executable, "-m", "feiqiu_etl", "runs", "--json"], capture_output=True,
                                  text=True, env=env, timeout=120)
            assert seed.returncode == 0, seed.stderr
            _seed_run(env)
            for name, src in trees.items():  # warm: byte code compiled, schemas migrated
                timed(["runs"], env_for(src, home, caches[name]))
            times: dict[str, dict[str, list[tuple[float, float]]]] = {name: {" ".join(c): [] for c in COMMANDS} for name in trees}
            for _ in range(args.repeat):
                for command in COMMANDS:
                    for name, src in trees.items():
                        argv = ["show", "bench-ro-1"] if command == ["show", "LAST"] else command
                        times[name][" ".join(command)].append(timed(argv, env_for(src, home, caches[name])))
        finally:
            holder.stdin.close()
            holder.wait(timeout=60)
    head = [f"command: python benchmarks/bench_readonly.py {shlex.join(sys.argv[1:])}".rstrip(),
            f"each command a whole process (python -m feiqiu_etl …), the embedded server already running, median "
            f"of {args.repeat} (min-max) and the median CPU time (user + system) of the process; load average at the start {load:.1f} on {os.cpu_count()} CPUs", ""]
    body = [f"{'':<12} " + "  ".join(f"{name + ': wall, CPU':>34}" for name in trees)]
    for command in COMMANDS:
        key = " ".join(command)
        cells = []
        for name in trees:
            wall = [w for w, _ in times[name][key]]
            cpu = [c for _, c in times[name][key]]
            cells.append(f"{statistics.median(wall):6.2f} s ({min(wall):.2f}-{max(wall):.2f}), "
                         f"{statistics.median(cpu):.2f} s".rjust(34))
        body.append(f"{key.replace('LAST', '<run>'):<12} " + "  ".join(cells))
    emit("\n".join(head + body) + "\n", args.output)


def _seed_run(env: dict) -> None:
    """One finished run in the warehouse (``show`` shows it)."""
    code = ("import sys; sys.path.insert(0, 'tests'); from datetime import datetime, timezone, timedelta; "
            "from feiqiu_etl.db.embedded import default_embedded; from feiqiu_etl.db.connection import connect; "
            "from webkit import seed_run; s = default_embedded().start(); "
            "c = connect(s.ensure_database('feiqiu_etl')); "
            "seed_run(c, 'bench-ro-1', started_at=datetime.now(timezone.utc) - timedelta(hours=1)); c.close(); s.stop()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          cwd=HERE.parent)
    assert proc.returncode == 0, proc.stderr[-800:]


if __name__ == "__main__":
    main()
