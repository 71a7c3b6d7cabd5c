"""Plain-text lines about a run's summary that more than one surface shows the same way: the reconcile section
(``show RUN`` in the terminal and the run page). Text only: the CLI colours it, the web page escapes it."""

from __future__ import annotations


def reconcile_lines(tasks: list[dict]) -> list[tuple[str, str]]:
    """The reconcile section of ``show RUN`` (issue 25, tasks/ods/reconcile.py) as ``(text, verdict)`` lines:
    the verdict counts of every listing, then one line per listing that was not ``ok`` the first time. Empty for
    a run recorded before issue 25."""
    counts: dict[str, int] = {}
    used = budget = 0
    lines: list[tuple[str, str]] = []
    for t in tasks:
        r = t.get("reconcile")
        if not r:
            continue
        used += r.get("refetches", 0)
        budget += r.get("budget", 0)
        for verdict, n in r.get("verdicts", {}).items():
            counts[verdict] = counts.get(verdict, 0) + n
        for listing in r.get("listings", []):
            where = "snapshot" if listing["kind"] == "snapshot" else f"{listing['window'][0]} … {listing['window'][1]}"
            ods = listing["ods"]
            lines.append((f"  {t['task']} {t['site_id']} {where}: {listing['verdict']}: {listing.get('reason') or ''}; "
                          f"{listing['listings']} listing(s), {listing['pages']} pages, {listing['rows']} rows, "
                          f"{listing['distinct_keys']} keys of total {listing.get('first_total')}"
                          f"{' (moved: ' + ', '.join(map(str, listing['totals_moved'])) + ')' if listing.get('totals_moved') else ''}"
                          f"; ODS new {ods['inserted']} chg {ods['updated']} same {ods['unchanged']} "
                          f"del {ods['soft_deleted']}", listing["verdict"]))
    if not counts:
        return []
    order = ("ok", "refetched", "short", "over", "unexpected_zero", "incomplete")
    head = ", ".join(f"{counts[v]} {v}" for v in order if counts.get(v))
    return [(f"reconcile: {sum(counts.values())} listing(s): {head}; {used} refetched of a budget of {budget} "
             f"(integrity.refetch_listings per task)", "ok" if len(lines) == 0 else "head"), *lines]
