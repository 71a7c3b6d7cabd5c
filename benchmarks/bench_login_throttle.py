"""Login guessing against ``feiqiu-etl web``: 500 concurrent wrong logins from one address (issue 21, finding 6).

Starts ``feiqiu-etl web`` as a process with a token on a free loopback port, fires ``--burst`` POST /login with
wrong tokens at once from 127.0.0.1 (httpx, one connection each), and reports how long the burst took, the
answers by status, and how many tokens the server really checked (``failed_logins`` of /api/statistics, read
with the right token from another loopback address, 127.0.0.2, which the throttle does not touch). Then a
second burst 2 s later (the address is still waiting or locked). With ``--baseline-src DIR`` (a source tree,
e.g. ``git archive main | tar -x -C DIR``) the same is measured first against a server run from that tree, side
by side.

With ``--addresses N`` (issue 28 item 4) the burst is spread: ``--burst`` wrong logins in all, from N loopback
source addresses (127.0.1.x …), a few per address (under the per-address free checks, so only the global cap
stops them); then the right token is tried from one of the attacking addresses.

Usage: python benchmarks/bench_login_throttle.py [--burst 500] [--addresses 200] [--baseline-src DIR]
(starts its own PostgreSQL)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from collections import Counter

import httpx

from feiqiu_etl.db.embedded import temporary_server

TOKEN = "bench-login-token-0123456789abcdef"


def start_web(dsn: str, src: str | None) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "FEIQIU_WEB_TOKEN"}
    env["FEIQIU_WEB_TOKEN"] = TOKEN
    if src:
        env["PYTHONPATH"] = os.path.join(src, "src")
    proc = subprocess.Popen([sys.executable, "-m", "feiqiu_etl", "web", "--port", "0", "--dsn", dsn],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        found = re.search(r"serving (http://[^/]+)/", line)
        if found:
            return proc, found.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("the web server did not start")


def source(i: int) -> str:
    return f"127.0.{1 + i // 200}.{10 + i % 200}"


async def burst(url: str, n: int, addresses: int = 1) -> tuple[float, Counter]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    clients = [httpx.AsyncClient(base_url=url, limits=limits, timeout=120,
                                 transport=httpx.AsyncHTTPTransport(local_address=source(a)) if addresses > 1 else None)
               for a in range(addresses)]
    try:
        async def one(i: int) -> int:
            r = await clients[i % addresses].post("/login", data={"token": f"wrong-guess-{i:06d}-xxxxxxxx",
                                                                  "next": "/"}, follow_redirects=False)
            return r.status_code

        started = time.perf_counter()
        codes = await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - started, Counter(codes)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


def checked(url: str) -> dict:
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=url, transport=transport, timeout=30) as client:
        return client.get("/api/statistics", headers={"Authorization": f"Bearer {TOKEN}"}).json()["security"]


def measure(label: str, dsn: str, n: int, src: str | None, addresses: int = 1) -> None:
    proc, url = start_web(dsn, src)
    try:
        for round_ in (1, 2):
            took, codes = asyncio.run(burst(url, n, addresses))
            stats = checked(url)
            shown = ", ".join(f"{code}: {count}" for code, count in sorted(codes.items()))
            print(f"{label:9} burst {round_}: {n} wrong logins in {took:.2f} s; answers {shown}; tokens checked "
                  f"so far {stats['failed_logins']}; 429s counted {stats.get('throttled', '-')}, locked addresses "
                  f"{stats.get('locked_addresses', '-')}", flush=True)
            if addresses > 1:
                with httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address=source(0))) as c:
                    right = c.post("/login", data={"token": TOKEN}, follow_redirects=False).status_code
                print(f"{label:9} the right token from attacking address {source(0)}: HTTP {right}", flush=True)
            time.sleep(2)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--addresses", type=int, default=1, help="spread the burst over this many source addresses")
    parser.add_argument("--baseline-src", help="a source tree to measure first (e.g. main's)")
    args = parser.parse_args()
    with temporary_server(prefix="bench-login-") as server:
        dsn = server.dsn("postgres")
        if args.baseline_src:
            measure("baseline", dsn, args.burst, args.baseline_src, args.addresses)
        measure("this tree", dsn, args.burst, None, args.addresses)


if __name__ == "__main__":
    main()
