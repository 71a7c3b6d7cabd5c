"""Benchmark: feiqiu-etl as a process versus a naive serial loop and dlt, side by side in one run.

One local HTTP server (this process) serves settlement-shaped pages (``--page-size`` records of about
480 B, ``--rows`` in total, ids above 2^53) at ``/api/settlement/list``; one embedded PostgreSQL holds one
fresh database per contender. Every contender runs as its own process, so the client figures are exactly
that process's: wall time from spawn to exit (interpreter start included), CPU = user + sys
(``os.wait4``), peak RSS (``ru_maxrss``). The server's and PostgreSQL's CPU are not the client's.

Contenders, each doing a first load into an empty database and then an unchanged re-run:

* **feiqiu-etl**: ``python -m feiqiu_etl run --tasks ODS_SETTLEMENT --no-dwd`` with gap 0
  (``--pipeline-rate-min 0 --pipeline-rate-max 0``, plus ``--unsafe-gaps`` where ``run --help`` lists it)
  and a connector file without the settlement detail, so only list pages are requested;
* **naive loop**: the design's "before": request → parse → canonical JSON + SHA-256 → ``executemany``
  upsert by key (only rows whose hash changed are rewritten) → commit, one page at a time;
* **dlt** (``pip install -e '.[bench]'``): the ``rest_api`` source → postgres destination, merge on the key.

Rounds alternate the order of the contenders to share the machine's noise; the medians are reported with
the ratios feiqiu-etl / naive loop. ``--rss-scale`` also runs feiqiu-etl's first load at 10 × ``--rows`` and
reports how its peak RSS grew. The detail endpoint is served but must never be asked for (checked).

    python benchmarks/bench_vs_peers.py --rows 100000 --rounds 2 --rss-scale \
        --output benchmarks/results/vs_peers.txt
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from benchlib import emit
from urllib.parse import parse_qs, urlsplit

SITE = 8640015201004417
BASE_ID = 1872950412356812801  # ids above 2^53 (upstream-api.md Q2)
LIST_PATH = "/api/settlement/list"
DETAIL_PATH = "/api/settlement/detail"
WINDOW = ("2024-03-01 00:00:00", "2024-03-02 00:00:00")
TOKEN = "bench-token"
CONTENDERS = ("feiqiu-etl", "naive", "dlt")
DROPPED_FIELDS = ("payMethods", "tableIds", "memberCardId")  # nested lists would make dlt build child tables


# ---------------------------------------------------------------------------------------------- the server
def make_pages(rows: int, page_size: int) -> list[bytes]:
    """The envelopes of every page (and one empty page after the last full one), as response bytes."""
    from feiqiu_etl.simulator import SimulatorConfig
    from feiqiu_etl.simulator.dataset import Dataset

    base = Dataset(SimulatorConfig(scale="large", days=3)).records("ODS_SETTLEMENT", SITE)
    base = [{k: v for k, v in r.items() if k not in DROPPED_FIELDS} for r in base]
    pages, n = [], 0
    while n < rows or not pages or len(json.loads(pages[-1])["data"]["list"]) == page_size:
        page = []
        for _ in range(min(page_size, rows - n)):
            record = dict(base[n % len(base)])
            record["settleId"] = BASE_ID + n
            page.append(record)
            n += 1
        body = {"code": 0, "msg": "ok", "data": {"total": rows, "list": page}}
        pages.append(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    return pages


class PageServer:
    """Threaded HTTP/1.1 server of ``pages`` on loopback; page number from the JSON body (POST) or the
    query (GET). Counts list and detail requests."""

    def __init__(self, pages: list[bytes]):
        self.pages = pages
        self.list_requests = 0
        self.detail_requests = 0
        owner = self
        empty = json.dumps({"code": 0, "msg": "ok", "data": {"total": 0, "list": []}}).encode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args):  # quiet
                pass

            def _serve(self, page: int) -> None:
                path = urlsplit(self.path).path
                if path == DETAIL_PATH:
                    owner.detail_requests += 1
                    self._send(404, b'{"code":40401,"msg":"not served"}')
                    return
                if path != LIST_PATH:
                    self._send(404, b"{}")
                    return
                owner.list_requests += 1
                self._send(200, owner.pages[page - 1] if 1 <= page <= len(owner.pages) else empty)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                self._serve(int(body.get("page", 1)))

            def do_GET(self):
                query = parse_qs(urlsplit(self.path).query)
                self._serve(int(query.get("page", ["1"])[0]))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "PageServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------------------------------------- contenders
def naive_loop(base: str, dsn: str, page_size: int) -> int:
    """The serial loop the engine replaces: request → parse/hash → executemany upsert → commit, per page."""
    import hashlib

    import httpx
    import psycopg

    ddl = ("CREATE TABLE IF NOT EXISTS public.naive_settlement (site_id bigint NOT NULL, settle_id bigint NOT NULL,"
           " payload jsonb NOT NULL, content_hash text NOT NULL, fetched_at timestamptz NOT NULL DEFAULT now(),"
           " PRIMARY KEY (site_id, settle_id))")
    upsert = ("INSERT INTO public.naive_settlement AS t (site_id, settle_id, payload, content_hash)"
              " VALUES (%s, %s, %s, %s) ON CONFLICT (site_id, settle_id) DO UPDATE SET payload = EXCLUDED.payload,"
              " content_hash = EXCLUDED.content_hash, fetched_at = now()"
              " WHERE t.content_hash IS DISTINCT FROM EXCLUDED.content_hash")
    total = 0
    with httpx.Client(base_url=base, timeout=30) as client, psycopg.connect(dsn) as conn:
        conn.execute(ddl)
        conn.commit()
        page = 1
        while True:
            body = {"siteId": SITE, "page": page, "limit": page_size, "startTime": WINDOW[0], "endTime": WINDOW[1]}
            resp = client.post(LIST_PATH, json=body, headers={"Authorization": f"Bearer {TOKEN}"})
            records = json.loads(resp.content)["data"]["list"]
            rows = []
            for record in records:
                text = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                rows.append((SITE, record["settleId"], text, hashlib.sha256(text.encode()).hexdigest()))
            with conn.cursor() as cur:
                cur.executemany(upsert, rows)
            conn.commit()
            total += len(records)
            if len(records) < page_size:
                return total
            page += 1


def dlt_load(base: str, dsn: str, page_size: int, pipelines_dir: str) -> int:
    """dlt's ``rest_api`` source into its postgres destination, merge on ``settleId``."""
    import dlt
    from dlt.sources.rest_api import rest_api_source

    source = rest_api_source({
        "client": {"base_url": base, "auth": {"type": "bearer", "token": TOKEN}},
        "resources": [{
            "name": "settlement",
            "primary_key": "settle_id",
            "write_disposition": "merge",
            "endpoint": {
                "path": LIST_PATH.lstrip("/"),
                "params": {"siteId": SITE, "limit": page_size, "startTime": WINDOW[0], "endTime": WINDOW[1]},
                "data_selector": "data.list",
                "paginator": {"type": "page_number", "base_page": 1, "page_param": "page", "total_path": None,
                              "stop_after_empty_page": True},
            },
        }],
    })
    from dlt.destinations.impl.postgres.configuration import PostgresCredentials
    from psycopg import conninfo

    parts = conninfo.conninfo_to_dict(dsn)  # the embedded server: a Unix socket folder as host
    credentials = PostgresCredentials()
    credentials.database, credentials.username = parts["dbname"], parts.get("user") or "postgres"
    credentials.password, credentials.host = parts.get("password") or "", "localhost"
    # libpq: the query's host (a socket folder) wins; the embedded server's password is in its passfile
    credentials.query = {k: parts[k] for k in ("host", "passfile") if parts.get(k)}
    credentials.port = int(parts.get("port") or 5432)
    pipeline = dlt.pipeline(pipeline_name="bench_vs_peers",
                            destination=dlt.destinations.postgres(credentials=credentials),
                            dataset_name="dlt_bench", pipelines_dir=pipelines_dir, progress=None)
    info = pipeline.run(source)
    info.raise_on_failed_jobs()
    return int(pipeline.last_trace.last_normalize_info.row_counts.get("settlement", 0))


# ---------------------------------------------------------------------------------------------- measuring
@dataclass
class Sample:
    contender: str
    phase: str  # "load" | "rerun"
    rows: int
    wall: float
    cpu: float
    rss_mb: float

    @property
    def rate(self) -> float:
        return self.rows / self.wall

    @property
    def cpu_per_100k(self) -> float:
        return self.cpu / self.rows * 100_000


def measured(cmd: list[str], env: dict | None = None) -> tuple[float, float, float, str]:
    """Run ``cmd``; return (wall s, user+sys s, peak RSS MiB, stdout). Raises on a non-zero exit.

    A small launcher process forks ``cmd`` and reads its rusage: a child forked straight from this big
    process would inherit this process's RSS high-water mark into its ``ru_maxrss``."""
    launcher = [sys.executable, __file__, "--launch", "--", *cmd]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.run(launcher, stdout=out, stderr=err, env=env)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    usage = json.loads(stderr.strip().splitlines()[-1])
    if usage["exit"] != 0:
        raise RuntimeError(f"{cmd[:4]} exited {usage['exit']}:\n{stderr[-3000:]}\n{stdout[-2000:]}")
    return usage["wall"], usage["cpu"], usage["rss_kib"] / 1024, stdout


def launch(cmd: list[str]) -> int:
    """Launcher body: run ``cmd``, then print its wall time, user+sys CPU and peak RSS as JSON on stderr."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    sys.stderr.flush()
    print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
                      "rss_kib": usage.ru_maxrss}), file=sys.stderr)
    return 0


def product_connector(folder: Path) -> Path:
    """The bundled connector with only ODS_SETTLEMENT, without its detail (list pages only), no DWD."""
    import yaml

    from feiqiu_etl.connector.model import default_connector_path

    data = yaml.safe_load(default_connector_path().read_text(encoding="utf-8"))
    data.pop("dwd_mapping", None)
    data["api"]["pagination"]["max_pages"] = 100_000  # --rss-scale loads 5,000+ pages
    data["tasks"] = [{k: v for k, v in t.items() if k != "detail"} for t in data["tasks"] if t["code"] == "ODS_SETTLEMENT"]
    path = folder / "bench-connector.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def product_command(base: str, dsn: str, connector: Path) -> list[str]:
    cmd = [sys.executable, "-m", "feiqiu_etl", "run", "--api-base", base, "--site-id", str(SITE),
           "--tasks", "ODS_SETTLEMENT", "--window-start", WINDOW[0], "--window-end", WINDOW[1], "--dsn", dsn,
           "--connector", str(connector), "--pipeline-rate-min", "0", "--pipeline-rate-max", "0", "--no-dwd", "--json"]
    helptext = subprocess.run([sys.executable, "-m", "feiqiu_etl", "run", "--help"], capture_output=True,
                              text=True).stdout
    if "--unsafe-gaps" in helptext:
        cmd.append("--unsafe-gaps")
    return cmd


def run_contender(name: str, phase: str, base: str, dsn: str, args, folder: Path) -> Sample:
    env = {**os.environ, "FEIQIU_API_TOKEN": TOKEN, "FEIQIU_ETL_HOME": str(folder / "home")}
    if name == "feiqiu-etl":
        wall, cpu, rss, out = measured(product_command(base, dsn, folder / "bench-connector.yaml"), env)
        result = json.loads(out)
        task = result["tasks"][0]
        if result["status"] != "SUCCESS":
            raise RuntimeError(f"feiqiu-etl run: {result['status']}: {task.get('errors')}")
        rows = task["total_fetched"]
        written = task["total_inserted"] + task["total_updated"]
        expected = rows if phase == "load" else 0
        if written != expected:
            raise RuntimeError(f"feiqiu-etl {phase}: wrote {written} rows, expected {expected}")
    else:
        cmd = [sys.executable, __file__, "--worker", name, "--base", base, "--dsn", dsn,
               "--page-size", str(args.page_size), "--pipelines-dir", str(folder / "dlt")]
        wall, cpu, rss, out = measured(cmd, env)
        rows = int(out.strip().splitlines()[-1])
    return Sample(name, phase, rows, wall, cpu, rss)


def _count(dsn: str, table: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


TABLES = {"feiqiu-etl": "ods.settlement", "naive": "public.naive_settlement", "dlt": "dlt_bench.settlement"}


def one_round(order: list[str], server: PageServer, admin_dsn: str, args, folder: Path, rows: int) -> list[Sample]:
    from psycopg import conninfo

    from feiqiu_etl.db.embedded import create_database

    samples = []
    for name in order:
        database = "bench_" + name.replace("-", "_")
        create_database(admin_dsn, database, drop_first=True)
        dsn = conninfo.make_conninfo(admin_dsn, dbname=database)
        for phase in ("load", "rerun"):
            before = server.list_requests
            sample = run_contender(name, phase, server.url, dsn, args, folder)
            if sample.rows != rows:
                raise RuntimeError(f"{name} {phase}: {sample.rows} rows fetched, expected {rows}")
            pages = server.list_requests - before
            samples.append(sample)
            print(f"  {name:<11} {phase:<6} {sample.rows:>9,} rows {sample.wall:7.2f} s {sample.rate:>9,.0f} rows/s "
                  f"cpu {sample.cpu:6.2f} s  rss {sample.rss_mb:6.0f} MiB  ({pages} list pages)", file=sys.stderr)
        stored = _count(dsn, TABLES[name])
        if stored != rows:
            raise RuntimeError(f"{name}: {stored} rows stored, expected {rows}")
    if server.detail_requests:
        raise RuntimeError(f"the detail endpoint was requested {server.detail_requests} time(s)")
    return samples


def report(samples: list[Sample], contenders: list[str], rows: int) -> list[str]:
    def med(name: str, phase: str, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in samples if s.contender == name and s.phase == phase)

    out = [f"{'contender':<12} {'phase':<7} {'rows/s':>9} {'CPU s/100k rows':>16} {'peak RSS MiB':>13} {'wall s':>7}"
           "   (medians)"]
    for name in contenders:
        for phase in ("load", "rerun"):
            out.append(f"{name:<12} {phase:<7} {med(name, phase, 'rate'):>9,.0f} {med(name, phase, 'cpu_per_100k'):>16.2f} "
                       f"{med(name, phase, 'rss_mb'):>13.0f} {med(name, phase, 'wall'):>7.2f}")
    if "feiqiu-etl" in contenders:
        for peer in (c for c in contenders if c != "feiqiu-etl"):
            for phase in ("load", "rerun"):
                speed = med("feiqiu-etl", phase, "rate") / med(peer, phase, "rate")
                cpu = med("feiqiu-etl", phase, "cpu_per_100k") / med(peer, phase, "cpu_per_100k")
                rss = med("feiqiu-etl", phase, "rss_mb") / med(peer, phase, "rss_mb")
                out.append(f"ratio feiqiu-etl / {peer:<6} {phase:<6}: {speed:5.2f}x rows/s, {cpu:5.2f}x CPU per row, "
                           f"{rss:5.2f}x peak RSS")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--page-size", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset of " + ", ".join(CONTENDERS))
    parser.add_argument("--rss-scale", action="store_true", help="also load 10 x --rows with feiqiu-etl (peak RSS growth)")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--worker", choices=["naive", "dlt"], help=argparse.SUPPRESS)
    parser.add_argument("--base", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--pipelines-dir", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--launch", "--"]:
        return launch(argv[2:])
    args = parser.parse_args(argv)
    if args.worker == "naive":
        print(naive_loop(args.base, args.dsn, args.page_size))
        return 0
    if args.worker == "dlt":
        print(dlt_load(args.base, args.dsn, args.page_size, args.pipelines_dir))
        return 0

    from feiqiu_etl.db.embedded import temporary_server

    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    pages = make_pages(args.rows, args.page_size)
    sizes = [len(json.dumps(r, ensure_ascii=False, separators=(",", ":")).encode())
             for r in json.loads(pages[0])["data"]["list"]]
    lines = [f"$ {command}",
             f"{os.cpu_count()} CPUs, load average at start {load}; {args.rows:,} settlement records of "
             f"{statistics.mean(sizes):.0f} B (compact UTF-8), {args.page_size} per page, {len(pages)} list pages; "
             f"gap 0; {args.rounds} alternating round(s); client = the contender's process (user+sys CPU, ru_maxrss)"]
    with tempfile.TemporaryDirectory(prefix="feiqiu-peers-") as tmp:
        folder = Path(tmp)
        product_connector(folder)
        with temporary_server(prefix="feiqiu-peers-pg-") as server_pg:
            admin = server_pg.dsn("postgres")
            with PageServer(pages) as server:
                samples: list[Sample] = []
                for r in range(args.rounds):
                    order = contenders if r % 2 == 0 else contenders[::-1]
                    print(f"round {r + 1}: {', '.join(order)}", file=sys.stderr)
                    samples += one_round(order, server, admin, args, folder, args.rows)
                lines += report(samples, contenders, args.rows)
                lines.append(f"detail requests: {server.detail_requests} (list pages only)")
            if args.rss_scale and "feiqiu-etl" in contenders:
                big = args.rows * 10
                print(f"rss scale: feiqiu-etl first load of {big:,} rows", file=sys.stderr)
                with PageServer(make_pages(big, args.page_size)) as server:
                    scaled = one_round(["feiqiu-etl"], server, admin, args, folder, big)
                small = statistics.median(s.rss_mb for s in samples if s.contender == "feiqiu-etl" and s.phase == "load")
                lines.append(f"feiqiu-etl peak RSS: {small:.0f} MiB at {args.rows:,} rows, {scaled[0].rss_mb:.0f} MiB at "
                             f"{big:,} rows (+{(scaled[0].rss_mb / small - 1) * 100:.0f} %; load {scaled[0].rate:,.0f} rows/s, "
                             f"{scaled[0].cpu_per_100k:.2f} CPU s/100k rows)")
    text = "\n".join(lines) + "\n"
    emit(text, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
