"""How :class:`~slotkit.pqueue.ThrottlingAwarePriorityQueue` ranks its slots
(part of :mod:`slotkit.pqueue`).

A slot's rank is the tuple ``(busy, -priority, -quota share, last served)``
of its head request; smaller goes first (see
:meth:`~slotkit.pqueue.ThrottlingAwarePriorityQueue.rank`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from slotkit.pqueue_order import Rank
from slotkit.pqueue_quota import QuotaShares, Terms
from slotkit.pqueue_slot import CACHED, DELAYED, leading_scope

if TYPE_CHECKING:
    from scrapy import Request

    from slotkit.pqueue_readiness import Readiness

__all__ = ["SlotRanks"]


class SlotRanks:
    """Ranks the slots of one queue: busy counts, quota shares, turns served."""

    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness
        self.shares = QuotaShares(readiness)
        #: slot key -> when it was last served (a counter), for fairness among equals.
        self._served: dict[str, int] = {}
        self._turn = itertools.count(1)

    def rank_and_terms(
        self, slot: str, head: Request, scopes: Mapping[str, float | None] | None
    ) -> tuple[Rank, Terms]:
        """The rank of *slot*, whose next request is *head* (with *scopes*, if
        known), and the quota terms of *head* (see :mod:`slotkit.pqueue_quota`)."""
        terms: Terms = ()
        share = 0.0
        if self.shares.may_have_share(scopes):
            terms, share = self.shares.terms_and_share(head, scopes)
        busy = self.busy(slot, scopes)
        return (busy, -head.priority, -share, self._served.get(slot, 0)), terms

    def group_share(self, terms: Terms, available: dict[str, float | None]) -> float:
        """The share component of a rank whose head has quota *terms*, now
        (*available*: see :meth:`~slotkit.pqueue_quota.QuotaShares.share_of`)."""
        return -self.shares.share_of(terms, available)

    def busy(self, slot: str, scopes: Mapping[str, float | None] | None = None) -> int:
        """Requests of *slot* in the downloader (waiting or in flight).

        A slot of several scopes (see ``Downloader.queue_key``) counts as its
        head's first scope (*scopes*), as it would under that scope's name.
        """
        if slot.endswith(CACHED):
            return 0  # the cache answers its requests: no scope holds them
        slot = slot.removesuffix(DELAYED)  # a delayed sub-queue counts as its slot
        slot = leading_scope(slot, scopes)
        downloader: Any = self.readiness.downloader
        registry = getattr(downloader, "registry", None)
        if registry is not None:
            scope = registry.peek(slot)
            return len(scope.requests) if scope is not None else 0
        slots = getattr(downloader, "slots", None)
        view = slots.get(slot) if slots is not None else None
        return len(view.active) if view is not None else 0

    def served(self, slot: str) -> None:
        """*slot* was just served: equals go before it from now on."""
        self._served[slot] = next(self._turn)

    def forget(self, slot: str) -> None:
        """*slot* has nothing queued any more."""
        self._served.pop(slot, None)
