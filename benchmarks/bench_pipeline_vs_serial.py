"""UnifiedPipeline vs SerialReference on the real ODS path (processing + PostgreSQL writes), side by side.

The upstream is replaced by an in-process responder with a fixed latency per request, so that the only
difference between the two runs is the engine: the serial loop does request → process → write one after
the other, the unified pipeline hides processing and writing inside the rate-limit gaps. Runs alternate
(serial, unified, serial, unified, …) on one embedded PostgreSQL to share the machine's noise.

    python benchmarks/bench_pipeline_vs_serial.py [--pages 40] [--page-size 200] [--gap 0.03] [--latency 0.02] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

import psycopg

from feiqiu_etl.connector import load_connector
from feiqiu_etl.db.embedded import create_database, temporary_server
from feiqiu_etl.db.schema import ensure_ods_tables
from feiqiu_etl.pipeline import PipelineRequest, RequestScheduler, UnifiedPipeline
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.testing.serial_reference import SerialReference
from feiqiu_etl.simulator import SimulatorConfig
from feiqiu_etl.simulator.dataset import Dataset
from feiqiu_etl.tasks.ods.processing import OdsProcessor
from feiqiu_etl.tasks.ods.rows import layouts_for
from feiqiu_etl.tasks.ods.writer import OdsWriter

SITE = 8640015201004417


def make_pages(pages: int, page_size: int) -> list[list[dict]]:
    """Realistic settlement records (simulator, large scale) with fresh ids, ``pages`` × ``page_size``."""
    base = Dataset(SimulatorConfig(scale="large", days=3)).records("ODS_SETTLEMENT", SITE)
    out, n = [], 0
    for _ in range(pages):
        page = []
        for _ in range(page_size):
            record = dict(base[n % len(base)])
            record["settleId"] = 1872950412356812801 + n
            page.append(record)
            n += 1
        out.append(page)
    return out


def run_once(engine_cls, dsn: str, pages: list[list[dict]], gap: float, latency: float,
             legacy_gap: bool = False) -> tuple[float, int]:
    """One load of all pages. ``legacy_gap``: the pre-migration loop, which slept a full gap *after*
    processing and writing (spec §2.2 ``rate_limiter.wait()``), instead of a gap measured from the end of
    the previous response."""
    spec = replace(load_connector().task("ODS_SETTLEMENT"), detail=None)  # list pages only
    layouts = layouts_for(spec)
    size = len(pages[0])
    with psycopg.connect(dsn) as conn:
        conn.execute("TRUNCATE ods.settlement")
        conn.commit()
        writer = OdsWriter(conn, spec, layouts, "bench", "feiqiu")
        processor = OdsProcessor(spec, SITE, layouts, max_pages=len(pages) + 1)

        def transport(request, send):
            if legacy_gap and request.params["page"] > 1:
                time.sleep(gap)

            def call():
                time.sleep(latency)
                page = request.params["page"]
                records = pages[page - 1] if page <= len(pages) else []
                return {"code": 0, "msg": "ok", "data": {"total": len(pages) * size, "list": records}}
            return send(call)

        lane_gap = 0.0 if legacy_gap else gap
        cfg = PipelineConfig(workers=2, batch_size=100, batch_timeout=1.0, rate_min=lane_gap, rate_max=lane_gap)
        engine = engine_cls(transport, cfg, scheduler=RequestScheduler())
        seed = PipelineRequest(spec.endpoint, {"siteId": SITE, "page": 1, "limit": size}, page_size=size,
                               data_path=spec.data_path, list_key=spec.list_key, scope=("bench",))
        t0 = time.perf_counter()
        result = engine.run([seed], processor, writer.write)
        elapsed = time.perf_counter() - t0
        assert result.status == "SUCCESS", result.errors[:3]
        rows = conn.execute("SELECT count(*) FROM ods.settlement").fetchone()[0]
        assert rows == len(pages) * size == result.total_inserted
    return elapsed, result.total_requests


ENGINES = {
    "legacy serial (full gap after processing)": (SerialReference, True),
    "SerialReference (gap from response end)": (SerialReference, False),
    "UnifiedPipeline": (UnifiedPipeline, False),
}


def scenario(dsn: str, pages: list[list[dict]], gap: float, latency: float, rounds: int) -> None:
    times: dict[str, list[float]] = {name: [] for name in ENGINES}
    requests = 0
    for _ in range(rounds):
        for name, (cls, legacy) in ENGINES.items():
            elapsed, requests = run_once(cls, dsn, pages, gap, latency, legacy_gap=legacy)
            times[name].append(elapsed)
    rows = sum(len(p) for p in pages)
    floor = requests * latency + (requests - 1) * gap
    print(f"\n{requests} requests × (latency {latency} s + gap {gap} s); {rows:,} settlement rows processed and "
          f"upserted; {rounds} alternating rounds; lane floor (latency + gaps) {floor:.2f} s")
    unified = statistics.median(times["UnifiedPipeline"])
    for name, runs in times.items():
        med = statistics.median(runs)
        print(f"  {name:43s} median {med:6.2f} s ({', '.join(f'{t:.2f}' for t in runs)})  "
              f"{rows / med:7,.0f} rows/s  {med / unified:5.2f}x the unified time")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--page-size", type=int, default=200)
    ap.add_argument("--latency", type=float, default=0.02, help="simulated response time, s")
    ap.add_argument("--gaps", default="0.05,0.005", help="comma-separated rate-limit gaps to try, s")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    pages = make_pages(args.pages, args.page_size)
    print(f"$ python benchmarks/bench_pipeline_vs_serial.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    with temporary_server(prefix="feiqiu-bench-") as server:
        create_database(server.dsn("postgres"), "bench")
        dsn = server.dsn("bench")
        with psycopg.connect(dsn) as conn:
            ensure_ods_tables(conn, [load_connector().task("ODS_SETTLEMENT")])
        for gap in (float(g) for g in args.gaps.split(",")):
            scenario(dsn, pages, gap, args.latency, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
