"""``TenantQueue``: who gets the request lane next — round-robin between tenants (the stores of one account),
or, once :meth:`TenantQueue.rank` gave the tenants an order, the first tenant in that order with a request
waiting (issue 30: stores complete one after another)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Hashable, Iterable


@dataclass
class Ticket:
    """One request waiting for the lane, of ``tenant``; ``granted`` once the lane is its."""

    tenant: Hashable | None
    granted: bool = False


class TenantQueue:
    """The waiting tickets of one lane and whether the lane is taken (``busy``). Not locked: the lane calls it
    with its own lock held, and notifies its waiters when :meth:`grant` granted a ticket."""

    def __init__(self) -> None:
        self._rank: dict[Hashable | None, int] = {}
        self._waiting: deque[Ticket] = deque()
        self._order: deque[Hashable | None] = deque()  # round-robin order of tenants seen
        self.busy = False

    @property
    def ranked(self) -> bool:
        """True once :meth:`rank` gave the tenants an order."""
        return bool(self._rank)

    @property
    def waiting(self) -> int:
        """Tickets waiting for the lane."""
        return len(self._waiting)

    def tenants_waiting(self) -> int:
        """Distinct tenants with a ticket waiting."""
        return len({t.tenant for t in self._waiting})

    def rank(self, tenants: Iterable[Hashable | None]) -> None:
        """Grant to the first of ``tenants`` (in this order) with a ticket waiting; the others after them."""
        self._rank = {t: i for i, t in enumerate(tenants)}

    def rank_of(self, tenant: Hashable | None) -> int:
        """``tenant``'s place in the ranking (tenants not ranked share the place after the last)."""
        return self._rank.get(tenant, len(self._rank))

    def earlier_waits(self, tenant: Hashable | None) -> bool:
        """True when a ticket of a tenant ranked before ``tenant`` waits."""
        mine = self.rank_of(tenant)
        return any(self.rank_of(t.tenant) < mine for t in self._waiting)

    def join(self, ticket: Ticket) -> None:
        """Queue ``ticket`` behind the others (its tenant joins the round-robin order if new)."""
        if ticket.tenant not in self._order:
            self._order.append(ticket.tenant)
        self._waiting.append(ticket)

    def leave(self, ticket: Ticket) -> None:
        """Take a waiting ``ticket`` off the queue (cancelled, or the lane tripped)."""
        self._waiting.remove(ticket)

    def give_back(self, ticket: Ticket) -> None:
        """The granted ``ticket`` frees the lane and waits again, first in the queue."""
        ticket.granted = False
        self.busy = False
        self._waiting.appendleft(ticket)

    def release(self) -> None:
        """The lane is free."""
        self.busy = False

    def grant(self) -> bool:
        """Give the free lane to the first waiting ticket of the first-ranked tenant waiting, else of the next
        tenant in round-robin order; True if a ticket was granted."""
        if self.busy or not self._waiting:
            return False
        if self._rank:
            best = min(self.rank_of(t.tenant) for t in self._waiting)
            if best < len(self._rank):
                return self._take(next(t for t in self._waiting if self.rank_of(t.tenant) == best))
        for _ in range(len(self._order)):
            tenant = self._order[0]
            self._order.rotate(-1)
            for ticket in self._waiting:
                if ticket.tenant == tenant:
                    return self._take(ticket)
        return False

    def _take(self, ticket: Ticket) -> bool:
        self._waiting.remove(ticket)
        ticket.granted = True
        self.busy = True
        return True
