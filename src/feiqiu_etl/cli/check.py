"""``check``: the first contact with an upstream — authentication, the grant of every store, one page of every list
endpoint, the fields against the connector — bounded in time and requests (:mod:`feiqiu_etl.runner.check`)."""

from __future__ import annotations

import sys
import threading

import click

from feiqiu_etl.cli.options import (DURATION, common_options, run_options, setup_logging, to_run_options,
                                    with_pipeline_options)
from feiqiu_etl.textsafe import escape, terminal_json

_CHECK_OPTIONS = {"--api-base", "--site-id", "--token", "--fleet", "--lanes", "--stores", "--tasks", "--now", "--dsn",
                  "--connector"}


def _check_options(fn):
    """The run's options that say what to check (token, stores, tasks, connector, database), none of its windows."""
    for option in reversed(run_options):
        probe = option(lambda **_: None)
        if any(name in _CHECK_OPTIONS for p in probe.__click_params__ for name in p.opts):
            fn = option(fn)
    return with_pipeline_options(fn)


@click.command()
@_check_options
@click.option("--wait-for-lane", type=DURATION, metavar="DURATION",
              help="if a run holds a token's lane, wait up to this long: 45m, 90s or plain seconds (default: exit 6 at once)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on stdout")
@common_options
def check(wait_for_lane, as_json, verbose, log_format, **p) -> None:
    """Check the token(s), the grant of every store and one page of every list endpoint (limit 200).

    Sends one request per list endpoint and store through the lane, at the configured gaps; says first how many
    and how long. Records each list's total as the store's measured size (a first run's plan uses it). Exit 0:
    all answered; 10: a token refused; 11: a store not granted; 12: the API not reachable; 4: another failure."""
    setup_logging(verbose, log_format)
    from feiqiu_etl.config.settings import reveal
    from feiqiu_etl.formats import duration
    from feiqiu_etl.runner.check import run_check
    from feiqiu_etl.app.database import check_database, connector_for, database
    from feiqiu_etl.app.errors import UsageFailure
    from feiqiu_etl.app.planning import prepare_inputs
    from feiqiu_etl.runner.flow_runner import prepare_database

    inputs = prepare_inputs(to_run_options({**p, "no_dwd": True}, None, wait_for_lane))
    if not inputs.lanes or not any(lane.stores for lane in inputs.lanes):
        raise UsageFailure("nothing to check: give --site-id (and a token) or --fleet")
    timeout = inputs.settings.db.connect_timeout

    def announce(requests: int, seconds: float, bound: float) -> None:
        lanes = len(inputs.lanes)
        click.echo(escape(f"check: {requests} request(s) ({lanes} lane(s), one per list endpoint and store) at the "
                          f"configured gaps: about {duration(seconds)}, at most {duration(bound)}"), err=True)

    with database(reveal(inputs.settings.db_dsn), connect_timeout=timeout) as dsn:
        progress = _progress_printer(sum(len(lane.stores) * len(lane.specs) for lane in inputs.lanes))
        check_database(dsn, None, timeout)
        connect = connector_for(timeout)
        with connect(dsn) as conn:
            prepare_database(conn, inputs.connector, stale_after=inputs.settings.run.stale_after)
        result = _signalled(lambda cancellation: run_check(inputs, dsn, connect=connect, cancellation=cancellation,
                                                           wait_for_lane=wait_for_lane, announce=announce,
                                                           progress=progress))
    data = result.to_dict()
    code, line = result.verdict()
    if as_json:
        click.echo(terminal_json(data))
    else:
        click.echo("\n".join(escape(x) for x in report_lines(data)))
    if line:
        click.echo(escape(f"Error: {line}"), err=True)
    sys.exit(code)


def _progress_printer(planned: int):
    """A ``progress`` callback for :func:`~feiqiu_etl.runner.check.run_check`: one stderr line per endpoint as it
    is answered (``check [3/21] lane north, store 8640015201004417, ODS_MEMBER: ok, total 2000, 412 ms``), so
    minutes at the real gaps are not minutes of silence (fresh-user trial). Lanes call it from their threads."""
    lock, done = threading.Lock(), [0]

    def progress(lane: str, site_id: int, task) -> None:
        with lock:
            done[0] += 1
            bits = [task.outcome]
            if task.total is not None:
                bits.append(f"total {task.total}")
            if task.latency is not None:
                bits.append(f"{task.latency * 1000:.0f} ms")
            if task.error:
                bits.append(task.error)
            click.echo(escape(f"check [{done[0]}/{planned}] lane {lane}, store {site_id}, {task.task}: "
                              + ", ".join(bits)), err=True)
    return progress


def _signalled(work):
    """``work(cancellation)`` with SIGINT/SIGTERM cancelling it (a second one aborts)."""
    from feiqiu_etl.pipeline.cancellation import CancellationToken
    from feiqiu_etl.cli.signals import signals_cancel

    cancellation = CancellationToken()
    try:
        with signals_cancel(cancellation):
            return work(cancellation)
    finally:
        cancellation.dispose()


def _fields(f: dict) -> str:
    parts = []
    if f.get("new"):
        parts.append("new " + ", ".join(f"{k} ({n})" for k, n in sorted(f["new"].items())))
    if f.get("missing"):
        parts.append("missing " + ", ".join(f"{k} ({n})" for k, n in sorted(f["missing"].items())))
    if f.get("other_type"):
        parts.append("other type " + ", ".join(f"{k}: " + "/".join(f"{t} ({n})" for t, n in sorted(v.items()))
                                                for k, v in sorted(f["other_type"].items())))
    return "; ".join(parts)


def report_lines(data: dict) -> list[str]:
    """The check's report as plain lines: per lane, its token and answer; per store, one line per list endpoint
    (outcome, total, latency, gap and class, fields)."""
    out = [f"check: {data['planned_requests']} request(s) planned, {sum(l['requests_sent'] for l in data['lanes'])} "
           f"sent in {data['seconds']:.1f} s; {data['sizes_recorded']} store size(s) recorded"]
    for lane in data["lanes"]:
        auth = {True: "authenticated", False: "REFUSED", None: "not answered"}[lane["authenticated"]]
        out.append(f"lane {lane['lane']} ({lane['token_source']}, {lane['api_base']}): token {auth}; "
                   f"{lane['requests_sent']} request(s), {lane['throttled']} throttled (42901/42902)"
                   + (f"; {lane['busy']}" if lane["busy"] else "") + (f"; {lane['reason']}" if lane["reason"] else ""))
        for store in lane["stores"]:
            grant = {True: "granted", False: "NOT GRANTED (40103)", None: "not answered"}[store["granted"]]
            out.append(f"  store {store['site_id']}" + (f" ({store['name']})" if store["name"] else "") + f": {grant}")
            for t in store["tasks"]:
                bits = [f"    {t['task']:<26} {t['outcome']:<8}"]
                if t["total"] is not None:
                    bits.append(f"total {t['total']}")
                if t["latency_s"] is not None:
                    bits.append(f"{t['latency_s'] * 1000:.0f} ms")
                if t["gap_s"] is not None:
                    bits.append(f"after {t['gap_s']:.2f} s ({t['gap_class']})")
                if t["error"] or t["problems"]:
                    bits.append(t["error"] or "; ".join(t["problems"]))
                drift = _fields(t["fields"])
                if drift:
                    bits.append(f"fields: {drift}")
                out.append("  ".join(bits))
    return out
