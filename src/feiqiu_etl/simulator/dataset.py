"""The simulator's live data: deterministic generation, API-ordered queries and thread-safe mutation helpers.

What it is for: :class:`Dataset` owns one :class:`~feiqiu_etl.simulator.state.Store` per site, generated from
(seed, scale, anchor, days, site ids) only, and answers what the HTTP layer and the tests ask: the records of a
list endpoint in API order (upstream-api.md §1.3), a window of them (§1.2, half-open, ``""`` never matches), the
``data`` of a detail endpoint (§5.2–§5.4), and edits, deletes, inserts and random churn (§1.5, Q11–Q13). Its clock
moves forward with :meth:`Dataset.advance_trading` (the trading and edits of that time, ``trading``); each state it
reaches is kept as a *mark*, so :meth:`Dataset.minimum_requests` can say what a connector that loaded everything up
to a mark needs next (``minimum``).

What it must never do: hand out a reference to live data through its public methods (they return deep copies), or
change a published record in place. Every method takes the dataset lock, so tests may call it while the server
runs.
"""

from __future__ import annotations

import bisect
import copy
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from faker import Faker

from feiqiu_etl.simulator import edits
from feiqiu_etl.simulator.catalog import (
    DETAIL_BY_PARENT,
    TASK_CODES,
    VOLATILE_FIELDS,
    ListEndpoint,
    list_endpoint,
)
from feiqiu_etl.simulator.config import SimulatorConfig
from feiqiu_etl.simulator.master import MEMBER_TAGS, generate_master
from feiqiu_etl.simulator.minimum import RequestMinimum, classify, minimum_requests
from feiqiu_etl.simulator.params import MAX_LIMIT
from feiqiu_etl.simulator.state import Record, Store
from feiqiu_etl.simulator.timeline import Timeline
from feiqiu_etl.simulator.trading import Trading
from feiqiu_etl.simulator.values import fmt_time

MUTATION_KINDS = ("updated", "deleted", "inserted")
MAX_ADVANCE_HOURS = 24 * 31
"""The most one call of :meth:`Dataset.advance_trading` moves the clock (a month, like a window, §1.2)."""

Tables = dict[str, dict[Any, Record]]
"""One store's records: task code → primary key → record (shallow: records are never changed in place)."""


@dataclass(frozen=True)
class AdvanceSummary:
    """What :meth:`Dataset.advance_trading` did: the clock moved from ``start`` to ``end``; ``changes`` is, per
    store and task, how many records were ``inserted``, ``updated`` (beyond their volatile field),
    ``volatile_only`` (only the Q11 volatile field changed, ``updateTime`` kept) and ``deleted``."""

    start: datetime
    end: datetime
    changes: Mapping[int, Mapping[str, Mapping[str, int]]]

    def to_json(self) -> dict[str, Any]:
        return {"from": fmt_time(self.start), "now": fmt_time(self.end),
                "hours": (self.end - self.start).total_seconds() / 3600,
                "sites": {str(site): dict(tasks) for site, tasks in self.changes.items()}}


@dataclass(frozen=True)
class _SortedView:
    version: int
    keys: list[Any]
    window_values: list[str]


def build_store(config: SimulatorConfig, site_id: int, anchor: datetime, faker: Faker) -> Store:
    """Generate one store's data; depends only on (seed, scale, anchor, days, site_id)."""
    rng = random.Random(f"feiqiu-sim|{config.seed}|{config.scale}|{site_id}|{fmt_time(anchor)}|{config.days}")
    faker.seed_instance(rng.getrandbits(64))
    store = Store(site_id, rng, faker, start=anchor - timedelta(days=config.days), anchor=anchor)
    profile = config.profile_for(site_id)
    generate_master(store, profile)
    Timeline(store, profile).run(config.days)
    return store


def _detail_key(parent_task: str, parent_id: Any) -> Any:
    """Normalise a detail id the way the API accepts it (id64 as number or decimal string, Q2)."""
    if DETAIL_BY_PARENT[parent_task].id_is_int and isinstance(parent_id, str) and parent_id.isdigit():
        return int(parent_id)
    return parent_id


class Dataset:
    """Live records of all simulated stores (see the module docstring)."""

    def __init__(self, config: SimulatorConfig, anchor: datetime | None = None) -> None:
        self._config = config
        self._anchor = anchor or config.resolved_anchor()
        self._now = self._anchor
        self._lock = threading.RLock()
        faker = Faker("zh_CN")
        self._stores = {site: build_store(config, site, self._anchor, faker) for site in config.all_site_ids()}
        self._views: dict[tuple[str, int], _SortedView] = {}
        self._churn_rng = random.Random(f"feiqiu-churn|{config.seed}")
        self._marks: list[tuple[datetime, dict[int, Tables]]] = [(self._anchor, self._tables())]

    # --- clock -------------------------------------------------------------------------------------------------
    @property
    def anchor(self) -> datetime:
        """Where the generated history ends (naive Shanghai local time)."""
        return self._anchor

    def now(self) -> str:
        """The simulator's current local time, ``"YYYY-MM-DD HH:MM:SS"``; edits and inserts are stamped with it."""
        with self._lock:
            return fmt_time(self._now)

    def set_now(self, value: datetime) -> None:
        with self._lock:
            self._now = value.replace(microsecond=0, tzinfo=None)

    def advance(self, seconds: float) -> str:
        """Move the clock only (nothing happens in that time); see :meth:`advance_trading` for a store that trades."""
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._now = self._now.replace(microsecond=0)
            return fmt_time(self._now)

    def advance_trading(self, hours: float) -> AdvanceSummary:
        """Move the clock ``hours`` forward and generate what every store does in that time (module ``trading``:
        trading at the scale's per-day volumes, reopened settlements, member and goods edits, Q11 volatile changes,
        Q13 changes that keep their window field, refunds), stamped inside ``[now, now + hours)``.

        Deterministic for (the data so far, seed, scale, the clock, ``hours``). The state reached is kept as a mark
        for :meth:`minimum_requests`. Raises ``ValueError`` unless ``0 < hours <= MAX_ADVANCE_HOURS``.
        """
        if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not 0 < hours <= MAX_ADVANCE_HOURS:
            raise ValueError(f"hours must be a number > 0 and <= {MAX_ADVANCE_HOURS}, not {hours!r}")
        cfg = self._config
        with self._lock:
            start = self._now
            end = (start + timedelta(hours=hours)).replace(microsecond=0)
            if end <= start:
                raise ValueError("hours must move the clock by at least one second")
            before = self._tables()
            for site_id in sorted(self._stores):
                store = self._stores[site_id]
                rng = random.Random(f"feiqiu-advance|{cfg.seed}|{cfg.scale}|{site_id}|{fmt_time(start)}|{fmt_time(end)}")
                with store.using_rng(rng):
                    store.faker.seed_instance(rng.getrandbits(64))
                    Trading(store, cfg.profile_for(site_id)).run_span(start, end)
            self._now = end
            after = self._tables()
            self._marks.append((end, after))
        changes = {site: {task: classify(task, before[site][task], after[site][task]).counts() for task in TASK_CODES}
                   for site in sorted(after)}
        return AdvanceSummary(start, end, changes)

    def marks(self) -> list[datetime]:
        """The times whose state is kept: the anchor, then the end of every :meth:`advance_trading`."""
        with self._lock:
            return [at for at, _ in self._marks]

    def minimum_requests(self, site_id: int, start: datetime, end: datetime, limit: int = MAX_LIMIT) -> RequestMinimum:
        """The fewest requests a perfect connector needs for ``site_id`` over ``[start, end)`` (module ``minimum``).

        It knows the state of the latest mark at or before ``start`` (none: a first load, every parent in scope is
        new) and compares the data at ``end`` (the live data if ``end`` is now or later, else the latest mark at or
        before it). Raises ``KeyError`` for an unknown site, ``ValueError`` for an empty range or a bad ``limit``.
        """
        with self._lock:
            self._store(site_id)
            known = [tables for at, tables in self._marks if at <= start]
            if end >= self._now:
                after = self._tables(site_id)[site_id]
            else:
                after = ([tables for at, tables in self._marks if at <= end] or [self._marks[0][1]])[-1][site_id]
            before = known[-1][site_id] if known else {}
            return minimum_requests(site_id, before, after, start, end, limit, first_load=not known)

    # --- queries -----------------------------------------------------------------------------------------------
    @property
    def site_ids(self) -> tuple[int, ...]:
        return tuple(self._stores)

    def has_site(self, site_id: int) -> bool:
        return site_id in self._stores

    def records(self, task_code: str, site_id: int) -> list[Record]:
        """Current live records of a list endpoint in API order (upstream-api.md §1.3), as deep copies."""
        endpoint = list_endpoint(task_code)
        with self._lock:
            store = self._stores.get(site_id)
            if store is None:
                return []
            table = store.records[task_code]
            return copy.deepcopy([table[k] for k in self._view(endpoint, store).keys])

    def window(self, task_code: str, site_id: int, start: str, end: str) -> list[Record]:
        """Records whose window field ``f`` satisfies ``start <= f < end`` (§1.2), in API order, deep copies."""
        endpoint = list_endpoint(task_code)
        if not endpoint.windowed:
            raise ValueError(f"{task_code} is a snapshot endpoint; it has no window")
        with self._lock:
            return copy.deepcopy(self.select(endpoint, site_id, start, end))

    def select(self, endpoint: ListEndpoint, site_id: int, start: str | None, end: str | None) -> list[Record]:
        """Live (shared, never mutated) records of a listing in API order; window bounds for windowed ones."""
        with self._lock:
            store = self._stores.get(site_id)
            if store is None:
                return []
            view = self._view(endpoint, store)
            keys = view.keys
            if endpoint.windowed:
                lo = bisect.bisect_left(view.window_values, start)
                hi = bisect.bisect_left(view.window_values, end)
                keys = [k for k, v in zip(keys[lo:hi], view.window_values[lo:hi]) if v]
            table = store.records[endpoint.task_code]
            return [table[k] for k in keys]

    def detail(self, parent_task: str, site_id: int, parent_id: Any) -> dict | None:
        """The ``data`` object of the detail endpoint (§5.2–§5.4); ``None`` if unknown or deleted (→ 40401)."""
        with self._lock:
            return copy.deepcopy(self.detail_data(parent_task, site_id, parent_id))

    def detail_rows(self, parent_task: str, site_id: int, parent_id: Any) -> list[Record]:
        """The detail rows (settlement items, package contents, member cards) of one parent; ``[]`` if none."""
        data = self.detail(parent_task, site_id, parent_id)
        if data is None:
            return []
        spec = DETAIL_BY_PARENT[parent_task]
        node = data
        for key in spec.data_path[1:]:
            node = node[key]
        return node[spec.list_key]

    def detail_data(self, parent_task: str, site_id: int, parent_id: Any) -> dict | None:
        """Like :meth:`detail` but built from shared (never mutated) parts; for the HTTP layer."""
        if parent_task not in DETAIL_BY_PARENT:
            raise KeyError(f"{parent_task} has no detail endpoint; expected one of {sorted(DETAIL_BY_PARENT)}")
        with self._lock:
            store = self._stores.get(site_id)
            if store is None:
                return None
            parent = store.get(parent_task, _detail_key(parent_task, parent_id))
            if parent is None:
                return None
            if parent_task == "ODS_SETTLEMENT":
                return {**parent, "items": store.settlement_items.get(parent["settleId"], [])}
            if parent_task == "ODS_GROUP_PACKAGE":
                extras = store.package_extras.get(parent["packageId"], {"usageRules": {}, "contents": []})
                return {"package": {**parent, "usageRules": extras["usageRules"], "contents": extras["contents"]}}
            return {"member": parent, "tags": store.member_tags.get(parent["memberId"], []),
                    "cards": [self._card_row(store, card) for card in store.cards_of(parent["memberId"])]}

    @staticmethod
    def _card_row(store: Store, card: Record) -> Record:
        """A §5.4 card row from the member card record."""
        return {"memberId": card["memberId"], "cardId": card["cardId"], "cardKind": card["cardKind"],
                "cardTypeName": card["cardTypeName"], "status": card["status"], "balance": card["balance"],
                "giftBalance": card["giftBalance"], "remainingTimes": card["remainingTimes"],
                "isDefault": card["isDefault"], "bindTime": card["openTime"],
                "lastUseTime": store.card_last_use.get(card["cardId"], "")}

    def _view(self, endpoint: ListEndpoint, store: Store) -> _SortedView:
        key = (endpoint.task_code, store.site_id)
        version = store.versions[endpoint.task_code]
        view = self._views.get(key)
        if view is None or view.version != version:
            table = store.records[endpoint.task_code]
            if endpoint.windowed:
                field = endpoint.window_field
                pairs = sorted((r[field], pk) for pk, r in table.items())
                view = _SortedView(version, [pk for _, pk in pairs], [v for v, _ in pairs])
            else:
                view = _SortedView(version, sorted(table), [])
            self._views[key] = view
        return view

    # --- mutations ---------------------------------------------------------------------------------------------
    def update(self, task_code: str, site_id: int, pk_value: Any, changes: dict | None = None) -> Record:
        """Edit a live record (Q11): ``changes`` or, if ``None``, a random realistic change of a tracked field.

        Bumps ``updateTime`` to :meth:`now` where the record has one (unless ``changes`` sets it). A settlement edit
        may reopen, re-settle (with an extra manual discount, changing its items) or void it.
        """
        pk_field = list_endpoint(task_code).pk
        if changes and pk_field in changes and changes[pk_field] != pk_value:
            raise ValueError(f"the primary key {pk_field} of a record cannot be changed")
        with self._lock:
            store, current = self._live(task_code, site_id, pk_value)
            changed = {**current, **changes} if changes is not None else edits.edit(store, task_code, current, self._now)
            if "updateTime" in current and not (changes and "updateTime" in changes):
                changed["updateTime"] = fmt_time(self._now)
            if task_code == "ODS_MEMBER" and changed.get("tags") != current.get("tags"):
                self._sync_tags(store, changed)
            return copy.deepcopy(store.put(task_code, changed))

    def touch_volatile(self, task_code: str, site_id: int, pk_value: Any) -> Record:
        """Change only the volatile field of a record (Q11); ``updateTime`` does not move."""
        with self._lock:
            store, current = self._live(task_code, site_id, pk_value)
            return copy.deepcopy(store.put(task_code, edits.touch_volatile(store, task_code, current)))

    def card_use(self, site_id: int, member_id: int, amount: str = "10.00") -> Record:
        """A member pays with a stored-value card (issue 25 part 6): the card's balance goes down by ``amount``
        (at most what it holds; its ``updateTime`` and the detail's ``lastUseTime`` move to :meth:`now`), a
        ``CONSUME`` ledger entry is recorded, and the member earns points (Q11: the member's ``updateTime`` stays).
        Returns the card after the use. Raises ``KeyError`` for an unknown member, ``ValueError`` when the member
        has no active card."""
        from decimal import Decimal

        from feiqiu_etl.simulator.events import Related, make_balance_change, split_card_amount
        from feiqiu_etl.simulator.values import parse_money

        with self._lock:
            store, member = self._live("ODS_MEMBER", site_id, member_id)
            cards = [c for c in store.cards_of(member_id) if c["status"] == 1
                     and parse_money(c["balance"]) + parse_money(c["giftBalance"]) > 0]
            if not cards:
                raise ValueError(f"member {member_id} has no active card with a balance")
            card = cards[0]
            spend = min(Decimal(amount), parse_money(card["balance"]) + parse_money(card["giftBalance"]))
            principal, gift = split_card_amount(card, spend)
            store.put("ODS_MEMBER_BALANCE_CHANGE", make_balance_change(store, card, self._now, "CONSUME", -principal,
                                                                      -gift, Related(remark="card use")))
            store.put("ODS_MEMBER", {**member, "points": member["points"] + max(1, int(spend))})
            return copy.deepcopy(store.get("ODS_MEMBER_CARD", card["cardId"]))

    def delete(self, task_code: str, site_id: int, pk_value: Any) -> None:
        """Delete master data (Q12): it vanishes from its snapshot and its detail answers 40401."""
        if list_endpoint(task_code).windowed:
            raise ValueError(f"{task_code} holds events, which are never deleted (upstream-api.md Q12)")
        with self._lock:
            store, _ = self._live(task_code, site_id, pk_value)
            store.remove(task_code, pk_value)

    def insert(self, task_code: str, site_id: int) -> Record:
        """Add a new realistic record with a new unique primary key (events get window field = :meth:`now`)."""
        list_endpoint(task_code)
        with self._lock:
            store = self._store(site_id)
            return copy.deepcopy(store.put(task_code, edits.new_record(store, task_code, self._now)))

    def mutate_random(self, fraction: float, rng_seed: int) -> dict[str, dict[str, int]]:
        """Update, delete and insert about ``fraction`` of the records of every task and store.

        Snapshot tasks: 60 % updates, 20 % deletes, 20 % inserts; windowed tasks: 70 % updates, 30 % inserts (events
        are never deleted). Deterministic for (current data, ``fraction``, ``rng_seed``). Returns
        ``{task_code: {"updated": n, "deleted": n, "inserted": n}}`` summed over stores.
        """
        if not 0 <= fraction <= 1:
            raise ValueError("fraction must be between 0 and 1")
        counts = {task: dict.fromkeys(MUTATION_KINDS, 0) for task in TASK_CODES}
        with self._lock:
            for site_id in sorted(self._stores):
                store = self._stores[site_id]
                with store.using_rng(random.Random(f"feiqiu-mutate|{rng_seed}|{site_id}")):
                    for task in TASK_CODES:
                        for kind, number in self._mutate_task(store, task, fraction).items():
                            counts[task][kind] += number
        return counts

    def _mutate_task(self, store: Store, task: str, fraction: float) -> dict[str, int]:
        endpoint = list_endpoint(task)
        keys = self._view(endpoint, store).keys if not endpoint.windowed else sorted(store.records[task])
        if not keys or fraction == 0:
            return {}
        total = min(max(round(fraction * len(keys)), 1), len(keys))
        chosen = store.rng.sample(keys, total)
        inserts = total * 3 // 10 if endpoint.windowed else total // 5
        deletes = 0 if endpoint.windowed else total // 5
        updates = total - inserts - deletes
        for pk in chosen[:updates]:
            self.update(task, store.site_id, pk)
        for pk in chosen[updates:updates + deletes]:
            store.remove(task, pk)
        for _ in range(inserts):
            store.put(task, edits.new_record(store, task, self._now))
        return {"updated": updates, "deleted": deletes, "inserted": inserts}

    def churn(self, task_code: str, site_id: int, probability: float = 0.35) -> str | None:
        """Maybe change one record of a listing between two of its pages (§1.5); returns what was done.

        Deterministic per seed for a given request sequence. The clock advances one second per change so that
        edits land at increasing ``updateTime`` values.
        """
        endpoint = list_endpoint(task_code)
        with self._lock:
            store = self._stores.get(site_id)
            if store is None or self._churn_rng.random() >= probability:
                return None
            kinds = ("updated", "inserted") if endpoint.windowed else ("updated", "deleted", "inserted")
            kind = self._churn_rng.choice(kinds)
            keys = sorted(store.records[task_code])
            if not keys:
                return None
            self._now += timedelta(seconds=1)
            with store.using_rng(random.Random(self._churn_rng.getrandbits(64))):
                pk = store.rng.choice(keys)
                if kind == "updated":
                    self.update(task_code, site_id, pk)
                elif kind == "deleted":
                    store.remove(task_code, pk)
                else:
                    store.put(task_code, edits.new_record(store, task_code, self._now))
            return kind

    # --- helpers -----------------------------------------------------------------------------------------------
    def _tables(self, *sites: int) -> dict[int, Tables]:
        """A shallow copy of every task table of ``sites`` (default: all); records are shared, never changed."""
        return {site: {task: dict(self._stores[site].records[task]) for task in TASK_CODES}
                for site in (sites or self._stores)}

    def _store(self, site_id: int) -> Store:
        store = self._stores.get(site_id)
        if store is None:
            raise KeyError(f"unknown site {site_id}; simulated sites are {sorted(self._stores)}")
        return store

    def _live(self, task_code: str, site_id: int, pk_value: Any) -> tuple[Store, Record]:
        store = self._store(site_id)
        current = store.get(task_code, pk_value)
        if current is None:
            raise KeyError(f"{task_code} has no live record {pk_value!r} in site {site_id}")
        return store, current

    @staticmethod
    def _sync_tags(store: Store, member: Record) -> None:
        catalog = {name: (tag_id, color) for tag_id, name, color in MEMBER_TAGS}
        store.member_tags[member["memberId"]] = [
            {"tagId": catalog.get(name, (900 + index, ""))[0], "tagName": name,
             "color": catalog.get(name, (0, "#6C757D"))[1]}
            for index, name in enumerate(member.get("tags", []))
        ]


__all__ = ["AdvanceSummary", "Dataset", "MAX_ADVANCE_HOURS", "MUTATION_KINDS", "VOLATILE_FIELDS", "build_store"]
