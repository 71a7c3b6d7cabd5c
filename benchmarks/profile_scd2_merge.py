"""Profile: where an incremental SCD2 merge of 10 % changed keys spends its time inside PostgreSQL.

Builds the same 1 M-row ``dwd.dim_member`` as ``bench_scd2_merge.py``, changes 10 % of the members, then runs
``merge_dim_scd2(incremental=True)`` with its two writing statements (close the current rows, insert the new
versions) under ``EXPLAIN (ANALYZE, BUFFERS, WAL)``, rolled back. It prints each plan with its buffer and WAL
counts: what PostgreSQL itself must do for these writes, whatever the merge's SQL around them.

    python benchmarks/profile_scd2_merge.py --rows 1000000 > benchmarks/results/scd2_merge_profile.txt
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta

import psycopg
from psycopg import conninfo, sql

import bench_scd2_merge as B
from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.embedded import create_database, temporary_server
from feiqiu_etl.tasks.dwd import load_dwd_mapping, scd2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    print("$ python benchmarks/profile_scd2_merge.py " + " ".join(sys.argv[1:]))
    with temporary_server(prefix="feiqiu-profile-") as server:
        admin = server.dsn("postgres")
        create_database(admin, "profile_scd2", drop_first=True)
        dsn = conninfo.make_conninfo(admin, dbname="profile_scd2")
        table = load_dwd_mapping().table("dim_member")
        B._prepare(dsn, load_dwd_mapping(), args.rows)
        with connect(dsn) as conn:
            scd2.merge_dim_scd2(conn, table, now=B.T0 + timedelta(hours=1), run_id="p1", incremental=True)
        B._change(dsn, 10, B.T0 + timedelta(hours=2))
        with connect(admin, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        plain = psycopg.Connection.execute

        def explained(self, query, params=None, **kw):
            text = query.as_string(self) if hasattr(query, "as_string") else str(query)
            if not (text.startswith("UPDATE") and "valid_to" in text or text.startswith('INSERT INTO "dwd"')):
                return plain(self, query, params, **kw)
            started = time.perf_counter()
            rows = plain(self, sql.SQL("EXPLAIN (ANALYZE, BUFFERS, WAL, TIMING OFF) ") + query, params, **kw)
            print(f"--- {time.perf_counter() - started:.2f} s: {text[:90]}")
            for (line,) in rows.fetchall():
                print("   ", line)
            return type("NoRows", (), {"rowcount": 0})()

        psycopg.Connection.execute = explained
        try:
            with connect(dsn) as conn:
                conn.execute("SELECT 1")  # the merge runs in a savepoint: everything is rolled back
                scd2.merge_dim_scd2(conn, table, now=B.T0 + timedelta(hours=3), run_id="p2", incremental=True)
                conn.rollback()
        finally:
            psycopg.Connection.execute = plain
    return 0


if __name__ == "__main__":
    sys.exit(main())
