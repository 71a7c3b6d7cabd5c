"""From a finished :class:`~feiqiu_etl.runner.results.RunResult` to what Dagster shows: metadata per store
(partition) and the one rule that decides whether a materialization fails.

Pure functions over the result, no Dagster import: :mod:`feiqiu_etl.dagster.definitions` turns the
dictionaries into materialization metadata and the verdicts into ``dagster.Failure``.

The rule (docs/scale-out.md says the same):

* a store (partition) that is **FAILED** (refused with 40103, not one request succeeded, its lane stopped:
  invalid token 40101, lane busy, upstream unreachable) or **CANCELLED** fails the step, with the reason;
* a store that is **PARTIAL** (some items failed; they are in ``errors`` and, for details, owed to the next
  run) is materialized with ``status: PARTIAL`` in its metadata and a warning — unless ``fail_on_partial``;
* a DWD load fails the step when it is FAILED (every table failed, or the database went away); a PARTIAL
  DWD load (some tables rolled back) is materialized with the failed tables in its metadata, the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from feiqiu_etl.common.status import Status
from feiqiu_etl.runner.results import LaneResult, RunResult, StoreResult

MAX_LISTED_ERRORS = 5


@dataclass(frozen=True)
class Verdict:
    """``failure`` is None when the materialization succeeds; else one line saying why it failed.
    ``metadata`` maps partition key (site id as text; ``""`` for unpartitioned) to that partition's metadata.
    ``warnings`` are lines to log (PARTIAL stores)."""

    metadata: dict[str, dict[str, Any]]
    failure: str | None = None
    warnings: list[str] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)


def _errors(texts: list[str]) -> str:
    shown = texts[:MAX_LISTED_ERRORS]
    more = len(texts) - len(shown)
    return "\n".join(shown) + (f"\n… and {more} more (feiqiu-etl show RUN_ID)" if more > 0 else "")


def _error_line(task: str, error: Any) -> str:
    if isinstance(error, dict):
        return f"{task} {error.get('stage', '?')}: {error.get('error', error)}"
    return f"{task}: {error}"


def store_metadata(result: RunResult, lane: LaneResult, store: StoreResult) -> dict[str, Any]:
    """Metadata of one store's materialization: status, rows (inserted/updated/unchanged), requests,
    rejections (42901/42902 answers), bans (42902 answers the lane got in this run: a ban is the token's, it
    stops every store of the lane) and the seconds this store's tasks waited banned, errors, tasks done, the
    lane (name and key — a token fingerprint, never the token) and the feiqiu-etl run id
    (``feiqiu-etl show RUN_ID``)."""
    tasks = [t for t in store.tasks if t.skipped is None]
    inserted = sum(t.result.total_inserted for t in tasks)
    updated = sum(t.result.total_updated for t in tasks)
    unchanged = sum(t.result.total_skipped for t in tasks)
    errors = [_error_line(t.task_code, e) for t in tasks for e in t.result.errors]
    meta: dict[str, Any] = {
        "status": str(store.status),  # a plain str: Dagster serializes no foreign enum
        "rows": inserted + updated + unchanged,
        "rows_inserted": inserted,
        "rows_updated": updated,
        "rows_unchanged": unchanged,
        "requests": sum(t.result.total_requests for t in tasks),
        "rejections": sum(t.result.rate_limited for t in tasks),
        "bans": lane.statistics.banned if lane.statistics is not None else 0,
        "banned_seconds": round(sum(t.result.banned_seconds for t in tasks), 3),
        "errors": len(errors),
        "tasks_done": f"{len(tasks)}/{len(store.tasks)}",
        "site_id": store.site_id,
        "lane": lane.name,
        "lane_key": lane.key,
        "feiqiu_run_id": result.run_id,
        "feiqiu_run_status": str(result.status),
    }
    if store.name:
        meta["store"] = store.name
    if lane.statistics is not None:
        meta["lane_seconds"] = float(lane.statistics.seconds)
    reason = store.reason or lane.reason
    if reason:
        meta["reason"] = reason
    if errors:
        meta["first_errors"] = _errors(errors)
    return meta


def judge_ods(result: RunResult, site_ids: list[int], *, fail_on_partial: bool = False) -> Verdict:
    """The verdict of an ODS materialization of ``site_ids`` (the run's partitions)."""
    metadata: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    warnings: list[str] = []
    found: set[int] = set()
    for lane in result.lanes:
        for store in lane.stores:
            if store.site_id not in site_ids:
                continue
            found.add(store.site_id)
            meta = store_metadata(result, lane, store)
            metadata[str(store.site_id)] = meta
            why = meta.get("reason") or ("cancelled" if store.status == Status.CANCELLED else None)
            if store.status in (Status.FAILED, Status.CANCELLED, Status.BUSY) or \
                    (store.status == Status.PARTIAL and fail_on_partial):
                failed.append(f"store {store.site_id} {store.status}" + (f": {why}" if why else ""))
            elif store.status == Status.PARTIAL:
                warnings.append(f"store {store.site_id} PARTIAL: {meta['errors']} error(s) recorded; "
                                "everything "
                                "else is loaded and the next run fetches what is owed")
    for site in site_ids:
        if site not in found:  # cannot happen for a plan built from the same fleet; say so rather than pass
            failed.append(f"store {site}: not in the run (is it still in the fleet file?)")
    if result.status == Status.CANCELLED and not failed:
        failed.append(f"run {result.run_id} was cancelled")
    if result.error and failed and result.status in (Status.FAILED, Status.CANCELLED, Status.BUSY):
        failed.append(result.error)
    totals = {**result.totals(), "status": str(result.status), "feiqiu_run_id": result.run_id}
    failure = None
    if failed:
        failure = f"feiqiu-etl run {result.run_id} {result.status}: " + "; ".join(dict.fromkeys(failed))
    return Verdict(metadata, failure, warnings, totals)


def judge_dwd(result: RunResult) -> Verdict:
    """The verdict of a DWD load (``--dwd-only`` run)."""
    dwd = result.dwd or {}
    tables = dwd.get("tables", [])
    meta: dict[str, Any] = {
        "status": str(dwd.get("status", result.status)),
        "tables_succeeded": int(dwd.get("succeeded", 0)),
        "tables_failed": int(dwd.get("failed", 0)),
        "rows_inserted": sum(int(t.get("inserted", 0)) for t in tables),
        "rows_updated": sum(int(t.get("updated", 0)) for t in tables),
        "versions_closed": sum(int(t.get("closed", 0)) for t in tables),
        "feiqiu_run_id": result.run_id,
    }
    errors = [f"{e.get('table')}: {e.get('error')}" for e in dwd.get("errors", [])]
    if errors:
        meta["first_errors"] = _errors(errors)
    status = meta["status"]
    failure = None
    warnings = []
    if result.status in (Status.FAILED, Status.CANCELLED) or status in (Status.FAILED, Status.CANCELLED):
        failure = f"feiqiu-etl run {result.run_id} {result.status}: DWD load {status}" + (
            f": {errors[0]}" if errors else (f": {result.error}" if result.error else ""))
    elif status == Status.PARTIAL:
        warnings.append(f"DWD load PARTIAL: {meta['tables_failed']} table(s) rolled back: "
                        + "; ".join(errors[:3]))
    return Verdict({"": meta}, failure, warnings, meta)
