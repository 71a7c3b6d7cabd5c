"""The live data of one simulated store, plus the random sources used to grow it.

What it is for: :class:`Store` holds every list record of a store per task code (dicts keyed by primary key), the
detail-only data (settlement items, package usage rules and contents, member tag objects, card last-use times)
and the store's deterministic random generator, id allocator and counters. Generation (``master``, ``events``)
and mutation (``edits``) modules work on it; ``dataset`` wraps it with locking and queries.

What it must never do: change a stored record in place once it has been published. Every change replaces the
record dict (copy-on-write), so a response being serialised on another thread never sees half an edit.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from faker import Faker

from feiqiu_etl.simulator.catalog import TASK_CODES, list_endpoint
from feiqiu_etl.simulator.values import IdAllocator, fmt_time, random_time_between

Record = dict[str, Any]


@dataclass
class Store:
    """One store's records and generators (see the module docstring)."""

    site_id: int
    rng: random.Random
    faker: Faker
    start: datetime
    anchor: datetime
    ids: IdAllocator = field(init=False)
    records: dict[str, dict[Any, Record]] = field(init=False)
    settlement_items: dict[int, list[Record]] = field(default_factory=dict)
    package_extras: dict[str, Record] = field(default_factory=dict)
    member_tags: dict[int, list[Record]] = field(default_factory=dict)
    card_last_use: dict[str, str] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    key_log: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))
    member_cards: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self) -> None:
        self.ids = IdAllocator(self.rng)
        self.records = {task: {} for task in TASK_CODES}

    # --- records -------------------------------------------------------------------------------------------
    def put(self, task: str, record: Record) -> Record:
        """Store (insert or replace) ``record`` under its primary key; bumps the task's version."""
        pk = record[list_endpoint(task).pk]
        table = self.records[task]
        if pk not in table:
            self.key_log[task].append(pk)
            if task == "ODS_MEMBER_CARD":
                self.member_cards[record["memberId"]].append(pk)
        table[pk] = record
        self.versions[task] += 1
        return record

    def remove(self, task: str, pk: Any) -> Record | None:
        self.versions[task] += 1
        removed = self.records[task].pop(pk, None)
        if removed is not None and task == "ODS_MEMBER_CARD":
            self.member_cards[removed["memberId"]].remove(pk)
        return removed

    def cards_of(self, member_id: int) -> list[Record]:
        """Live cards of a member, in the order they were opened."""
        cards = self.records["ODS_MEMBER_CARD"]
        return [cards[card_id] for card_id in self.member_cards.get(member_id, ())]

    def random_key(self, task: str) -> Any | None:
        """A random key ever stored for ``task`` (it may have been deleted since); ``None`` if none."""
        log = self.key_log.get(task)
        return self.rng.choice(log) if log else None

    def get(self, task: str, pk: Any) -> Record | None:
        return self.records[task].get(pk)

    def values(self, task: str) -> list[Record]:
        return list(self.records[task].values())

    def pick(self, task: str, predicate=None) -> Record | None:
        """A random live record of ``task`` (optionally matching ``predicate``), or ``None``."""
        candidates = self.values(task)
        if predicate is not None:
            candidates = [r for r in candidates if predicate(r)]
        return self.rng.choice(candidates) if candidates else None

    @contextmanager
    def using_rng(self, rng: random.Random) -> Iterator[None]:
        """Draw every random choice from ``rng`` inside the block (reproducible scoped mutations)."""
        saved = self.rng
        self.rng = self.ids.rng = rng
        try:
            yield
        finally:
            self.rng = self.ids.rng = saved

    # --- counters and times --------------------------------------------------------------------------------
    def next_number(self, name: str, start: int = 1, step_max: int = 1) -> int:
        """Next value of a named counter (``step_max > 1`` leaves random gaps)."""
        current = self.counters.get(name)
        value = start if current is None else current + self.rng.randint(1, step_max)
        self.counters[name] = value
        return value

    def history_time(self, days_back: int = 720) -> datetime:
        """A time before the windowed history (master data creation and edits)."""
        return random_time_between(self.rng, self.start - timedelta(days=days_back), self.start - timedelta(days=1))

    def later(self, moment: datetime, limit: datetime | None = None) -> datetime:
        """A time after ``moment`` but before ``limit`` (default: the start of the windowed history)."""
        limit = limit or self.start - timedelta(seconds=1)
        return random_time_between(self.rng, moment, limit) if moment < limit else moment

    def stamp(self, moment: datetime) -> str:
        return fmt_time(moment)


def record(pk_field: str, pk_value: Any, site_id: int, **fields: Any) -> Record:
    """A record dict with the primary key first and ``siteId`` second, as in upstream-api.md §6."""
    return {pk_field: pk_value, "siteId": site_id, **fields}
