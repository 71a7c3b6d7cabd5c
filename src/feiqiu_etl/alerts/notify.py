"""When alerts are evaluated and sent: at a run's end, when a killed run is found INTERRUPTED, and by the
freshness command. Each entry point gathers the findings (:mod:`.rules`), claims them against storms
(:mod:`.record`), writes one message per target (:mod:`.messages`) and sends them all under one time bound
(:mod:`.sending`), then records the outcome.

None of these functions raises or blocks past ``alerts.timeout_seconds`` (plus a few bounded database
statements): an alert that cannot be sent is logged (target redacted) and recorded as failed, and the run,
the sweep or the command goes on. With no configuration (no ``--alerts``/``FEIQIU_ALERTS`` file and no
``FEIQIU_ALERT_URLS``) they return at once. When the database cannot be used for the record (it is the
reason the run failed), messages are still sent, without the protection against repeats.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from typing import Any, Callable, Iterable

import psycopg

from feiqiu_etl.alerts import record, rules
from feiqiu_etl.alerts.choice import FROM_ENVIRONMENT
from feiqiu_etl.alerts.config import AlertChoice, AlertConfig, resolve
from feiqiu_etl.alerts.messages import run_message, test_message
from feiqiu_etl.alerts.sending import Delivery, deliver
from feiqiu_etl.errortext import one_line
from feiqiu_etl.common.status import Status

log = logging.getLogger("feiqiu_etl.alerts")
HOST = socket.gethostname()


def warm_up(config: AlertChoice = FROM_ENVIRONMENT) -> None:
    """Load Apprise (about a second: it imports its plugins) in a daemon thread while the run works, so that
    sending at the run's end spends only the bound, not the import. Does nothing without alerts (``config``
    None, or :data:`~feiqiu_etl.alerts.choice.FROM_ENVIRONMENT` and none in the environment)."""
    cfg = resolve(config)
    if cfg is None:
        return

    def load() -> None:
        try:
            import apprise  # noqa: F401
        except Exception:  # noqa: BLE001 - sending reports it later
            pass

    threading.Thread(target=load, name="alerts-warm-up", daemon=True).start()


def after_run(dsn: str, summary: dict[str, Any], *, connect: Callable[[str], psycopg.Connection] | None = None,
              config: AlertChoice = FROM_ENVIRONMENT, read_history: bool = True) -> list[dict[str, Any]]:
    """Evaluate and send the alerts about a finished run (``summary``: ``RunResult.to_dict()``, already
    recorded): its status and reasons, each store's streak of failed runs, and the freshness of every
    (store, task) it planned. Returns the deliveries for ``run --json`` (``alerts``). ``read_history`` False
    (the database is away, or a signal ended the run): no connection at all, the run's own reasons are sent.
    ``config``: the run's alert configuration (None: none; default: the environment's)."""
    cfg = resolve(config)
    if cfg is None:
        return []
    since = time.monotonic()  # the bound covers reading the history too
    findings = rules.run_findings(summary, cfg.rules)
    conn = None
    if not read_history:
        return dispatch(None, cfg, findings, summary, summary["run_id"], since=since)
    try:
        conn = _open(dsn, connect)
        findings += _streaks(conn, summary["run_id"], _stores(summary), cfg)
        findings += _stale(conn, summary, cfg)
    except Exception as exc:  # noqa: BLE001 - the database may be the reason the run failed
        log.warning("alerts: cannot read the run history (%s); sending without it", one_line(exc, 200))
        conn = _close(conn)
    try:
        return dispatch(conn, cfg, findings, summary, summary["run_id"], since=since)
    finally:
        _close(conn)


def after_sweep(conn: psycopg.Connection, run_ids: Iterable[str], config: AlertChoice = FROM_ENVIRONMENT) -> None:
    """Alert about runs just marked INTERRUPTED (``registry.sweep_interrupted``, on ``conn``) to ``config``
    (None: nobody; default: the environment's): once each, however many processes sweep (the sweep marks a run
    once; the record is claimed once)."""
    ids = list(run_ids)
    cfg = resolve(config) if ids else None
    if cfg is None:
        return
    from feiqiu_etl import registry

    for run_id in ids:
        try:
            rec = registry.get_run(conn, run_id, with_log=False) or registry.RunDetail(run_id)
            run = {"run_id": run_id, "status": Status.INTERRUPTED, "exit_code": None, "error": rec.error,
                   "host": rec.host, "finished_at": _iso(rec.finished_at),
                   "lanes": list(rec.lanes or []), "stores": list(rec.stores or [])}
            findings = rules.run_findings(run, cfg.rules) + _streaks(conn, run_id, run["stores"], cfg)
            dispatch(conn, cfg, findings, run, run_id)
        except Exception as exc:  # noqa: BLE001 - a sweep never fails because of an alert
            log.warning("alerts: run %s found INTERRUPTED, but the alert failed: %s", run_id, one_line(exc, 200))
            _rollback(conn)


def sweep_and_alert(conn: psycopg.Connection, stale_after: float = 30.0,
                    config: AlertChoice = FROM_ENVIRONMENT) -> list[str]:
    """:func:`feiqiu_etl.registry.late.record_late` (the records kept because the database did not answer when
    their run ended are written first), :func:`feiqiu_etl.registry.sweep_interrupted` (vanished runs →
    ``INTERRUPTED``), then :func:`after_sweep` about the runs this sweep marked, to ``config`` (the command's or
    the run's alert configuration; default: the environment's): once each, since only this sweep marked them
    (its UPDATE is conditional). What every command that opens the database calls; returns the run ids marked."""
    from feiqiu_etl import registry
    from feiqiu_etl.registry.late import record_late

    record_late(conn)
    marked = registry.sweep_interrupted(conn, stale_after)
    if marked:
        after_sweep(conn, marked, config)
    return marked


def after_freshness(conn: psycopg.Connection, connector: str, rows: list[dict], hours: float,
                    config: AlertChoice = FROM_ENVIRONMENT) -> list[dict[str, Any]]:
    """``STALE`` alerts for the stale ``rows`` of a freshness check (each store/task once per age) to ``config``
    (None: nobody; default: the environment's)."""
    cfg = resolve(config)
    if cfg is None or cfg.rules.stale_hours is None:
        return []
    return dispatch(conn, cfg, rules.stale_findings(connector, rows, hours), None, None)


def send_test(cfg: AlertConfig, target: str | None = None) -> list[Delivery]:
    """``feiqiu-etl alerts test [TARGET]``: a sample message to every target (or the one named), not recorded."""
    targets = [t for t in cfg.targets if target is None or t.name == target]
    jobs = [(t, test_message(t.label, language=cfg.language, host=HOST)) for t in targets]
    return deliver(jobs, timeout=cfg.timeout_seconds, attempts=cfg.attempts)


def dispatch(conn: psycopg.Connection | None, cfg: AlertConfig, findings: list[rules.Finding],
             run: dict[str, Any] | None, run_id: str | None, *, since: float | None = None) -> list[dict[str, Any]]:
    """Claim, write, send and record: one message per target with the findings it wants and has not had yet.
    ``conn`` None: no record (every finding is sent). ``since``: when the bound started (monotonic s; default
    now). Returns ``[{target, reasons, ok, error, latency_s,
    attempts, sent_at}]``."""
    if not findings:
        return []
    wanted = {t.name: [f for f in findings if t.wants(f.reason)] for t in cfg.targets}
    claimed: set[tuple[str, str, str]] | None = None
    if conn is not None:
        try:
            claimed = record.claim(conn, [(f.reason, f.subject, t.label, run_id)
                                          for t in cfg.targets for f in wanted[t.name]])
        except Exception as exc:  # noqa: BLE001
            log.warning("alerts: cannot record them (%s); sending without the record", one_line(exc, 200))
            _rollback(conn)
            conn = None
    jobs, keys = [], []
    for t in cfg.targets:
        mine = [f for f in wanted[t.name] if claimed is None or (f.reason, f.subject, t.label) in claimed]
        if not mine:
            continue
        message = run_message(mine, run, language=cfg.language, web_url=cfg.web_url, host=HOST)
        jobs.append((t, message))
        keys.append([(f.reason, f.subject, t.label) for f in mine])
    deliveries = deliver(jobs, timeout=cfg.timeout_seconds, attempts=cfg.attempts, since=since)
    out = []
    for (t, message), delivery, k in zip(jobs, deliveries, keys):
        item = {"target": delivery.target, "reasons": list(message.reasons), **_outcome(delivery)}
        out.append(item)
        if conn is not None:
            try:
                record.finish(conn, uuid.uuid4().hex, k, delivery.to_dict())
            except Exception as exc:  # noqa: BLE001
                log.warning("alerts: cannot record the delivery to %s: %s", t.label, one_line(exc, 200))
                _rollback(conn)
    return out


def _outcome(d: Delivery) -> dict[str, Any]:
    return {"ok": d.ok, "error": d.error, "latency_s": d.latency_s, "attempts": d.attempts, "sent_at": d.sent_at}


def _stores(summary: dict[str, Any]) -> list[int]:
    return [s["site_id"] for lane in summary.get("lanes") or [] if isinstance(lane, dict)
            for s in lane.get("stores") or []]


def _streaks(conn: psycopg.Connection, run_id: str, stores: list[int], cfg: AlertConfig) -> list[rules.Finding]:
    n = cfg.rules.consecutive_failures
    if not n or not stores:
        return []
    streaks = {}
    for site in stores:
        rows = conn.execute(
            "SELECT run_id, status, exit_code, summary->'lanes' FROM etl_meta.run WHERE %s = ANY(stores) "
            "AND status <> 'RUNNING' ORDER BY started_at DESC LIMIT %s", (site, 3 * n + 10)).fetchall()
        history = [{"run_id": r[0], "status": r[1], "exit_code": r[2], "lanes": r[3]} for r in rows]
        streaks[site] = rules.failure_streak(history, site)
    conn.commit()
    return rules.streak_findings(run_id, streaks, cfg.rules)


def _stale(conn: psycopg.Connection, summary: dict[str, Any], cfg: AlertConfig) -> list[rules.Finding]:
    hours = cfg.rules.stale_hours
    pairs = [(t["site_id"], t["task"]) for t in [*(summary.get("tasks") or []), *(summary.get("skipped_tasks") or [])]]
    if hours is None or not pairs:
        return []
    from feiqiu_etl.registry.freshness import Schedule, freshness_rows

    rows = freshness_rows(conn, summary["connector"], Schedule.of_pairs(pairs), hours * 3600.0)
    return rules.stale_findings(summary["connector"], rows, hours)


def _open(dsn: str, connect: Callable[[str], psycopg.Connection] | None) -> psycopg.Connection:
    if connect is None:
        from feiqiu_etl.db.connection import connect as db_connect

        connect = db_connect
    conn = connect(dsn)
    conn.execute("SET statement_timeout = '10s'")
    conn.commit()
    return conn


def _close(conn: psycopg.Connection | None) -> None:
    if conn is not None:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
    return None


def _rollback(conn: psycopg.Connection) -> None:
    try:
        conn.rollback()
    except Exception:  # noqa: BLE001
        pass


def _iso(value: Any) -> str | None:
    return value.isoformat() if hasattr(value, "isoformat") else value
