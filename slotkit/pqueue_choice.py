"""How :class:`~slotkit.pqueue.ThrottlingAwarePriorityQueue` chooses the slot
to pop from (part of :mod:`slotkit.pqueue`).

:class:`SlotChoice` takes the slots out of the rank heap best first
(:mod:`slotkit.pqueue_order`), asks each whether its head could be sent now,
remembers the "not yet" answers, and keeps every slot either filed or
remembered as waiting, whatever a custom scope manager or a job directory
raises meanwhile.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from slotkit.pqueue_order import Rank, SlotOrder
from slotkit.pqueue_quota import Terms
from slotkit.pqueue_slot import CACHED, CannotPeek, sub_queue_key

if TYPE_CHECKING:
    from scrapy import Request

    from slotkit.pqueue_rank import SlotRanks
    from slotkit.pqueue_readiness import Readiness
    from slotkit.pqueue_store import SlotQueues

__all__ = ["RANK_RETRY", "SlotChoice"]

logger = logging.getLogger("slotkit")

#: Seconds before a slot whose ranking (or reading) raised is tried again.
RANK_RETRY = 1.0


class SlotChoice:
    """The choosing half of :class:`~slotkit.pqueue.ThrottlingAwarePriorityQueue`
    (a base class of it, like the scope manager's ``scope_*`` parts)."""

    if TYPE_CHECKING:
        readiness: Readiness
        pqueues: SlotQueues
        _order: SlotOrder
        _ranks: SlotRanks
        _heads: dict[str, tuple[Request, dict[str, float | None]]]
        _keyed: dict[str, int]
        _failing: set[str]
        _version: int

        def push(self, request: Request) -> None: ...

        def _rank_and_terms(self, slot: str, head: Request) -> tuple[Rank, Terms]: ...

        def _head(self, slot: str) -> Request: ...

        def _pop_from(self, slot: str) -> Request | None: ...

        def _forget(self, slot: str) -> None: ...

    def _choose(self, *, fallback: bool) -> tuple[str | None, float]:
        """The slot to pop from, or ``(None, seconds until the soonest one may be)``.

        1. Slots remembered as "not yet" are left out until their wait is
           over (see the module docstring).
        2. The others come out of the rank heap best first (see
           :mod:`slotkit.pqueue_order`) and are asked for readiness; the
           first ready one wins, so most slots are never asked or ranked.
        With *fallback*, a slot is returned whenever any request is queued.
        """
        if not self.pqueues:
            return None, math.inf
        readiness = self.readiness
        order = self._order
        knows = readiness.knows_readiness
        now = readiness.now() if knows else 0.0
        if knows:
            for slot in order.due_again(now, readiness.generation):
                self._offer(slot)
        version = readiness.key_version() if knows else 0
        if version != self._version:
            # A Crawl-delay became known: a slot waiting behind a head that now
            # belongs to its site's sub-queue must be refiled now, not once
            # that head's wait is over (refiling happens as slots surface).
            self._version = version
            for slot in list(order.due):
                order.forget_wait(slot)
                self._offer(slot)
        blocked = readiness.blocked_scopes() if knows else set()
        available: dict[str, float | None] = {}
        for terms in order.groups():
            # A quota share grows as others spend the quota, unannounced.
            try:
                order.refresh(terms, self._ranks.group_share(terms, available))
            except Exception:  # a custom manager's: its share is only a tie-break
                logger.debug("slotkit: could not read the quota of %r", terms, exc_info=True)
        # Slots taken off the heap and neither chosen nor remembered as waiting
        # go back when the choice is made (the chosen one too: peek() leaves it).
        back: list[str] = []
        refiled: set[str] = set()
        chosen: str | None = None
        soonest, soonest_slot = math.inf, None
        current: tuple[Rank, str, Terms | None] | None = None
        try:
            while (current := order.take_best()) is not None:
                filed, slot, _ = current
                if slot not in self.pqueues:  # pragma: no cover - entries go with their queue
                    continue
                if version and self._keyed.get(slot) != version:
                    self._refile(slot, version)  # may move its head elsewhere
                    if slot in self.pqueues:
                        self._offer(slot)
                    continue
                ranked = self._current_rank(slot)
                if ranked is None:
                    # Filed back under its old rank, it would come out first
                    # and raise again at every choice, starving the rest.
                    continue
                rank, terms = ranked
                if slot.endswith(CACHED):
                    if readiness.cache_answers(self._head(slot)):
                        chosen = slot  # the HTTP cache answers it: no scope holds it
                        back.append(slot)
                        break
                    # No longer (an entry expired while queued, a job resumed with
                    # the cache off): back to its own sub-queue, throttled there.
                    self._refile(slot, version)
                    if slot in self.pqueues:
                        self._offer(slot)
                    continue
                if rank > filed and slot not in refiled:
                    # Busier than when filed: file it again. Once per choice: a
                    # rank that worsens with time (a quota filling up) would
                    # otherwise come straight back out, again and again.
                    refiled.add(slot)
                    order.offer(slot, rank, terms or None)
                    continue
                wait = self._ask(slot, now, blocked) if knows else 0.0
                if wait <= 0:
                    chosen = slot
                    back.append(slot)
                    break
                if slot not in order.due:  # a request in transit decides: ask again next time
                    back.append(slot)
                if wait < soonest or soonest_slot is None:
                    soonest, soonest_slot = wait, slot
            current = None
        finally:
            if current is not None:
                # Something raised while this slot was off the heap (a custom
                # manager, a disk queue): file it back, or it would never go.
                filed, slot, group = current
                if slot in self.pqueues and not order.offered(slot) and slot not in order.due:
                    order.offer(slot, filed, group)
            for slot in back:
                self._offer(slot)
        if chosen is not None:
            return chosen, 0.0
        remembered, remembered_slot = order.soonest(now)
        if remembered < soonest or soonest_slot is None:
            soonest, soonest_slot = remembered, remembered_slot
        if soonest_slot is None:
            soonest_slot = next(iter(self.pqueues))
        return (soonest_slot if fallback else None), soonest

    def _offer(self, slot: str) -> None:
        """File *slot* in the rank heap under its current rank (it may be ready).

        A head that spends a quota joins the group of its quota terms, whose
        share is read again at every choice: it grows as other slots spend
        the same quota.
        """
        if slot not in self.pqueues:
            return
        # Raising would lose a request just popped, or have one just pushed
        # pushed again; not filing the slot would strand its requests.
        ranked = self._current_rank(slot)
        if ranked is not None:
            self._order.offer(slot, ranked[0], ranked[1] or None)

    def _current_rank(self, slot: str) -> tuple[Rank, Terms] | None:
        """The rank and quota terms of *slot* now, or ``None`` if that raised
        (then :meth:`_rank_failed` has put the slot aside)."""
        try:
            ranked = self._rank_and_terms(slot, self._head(slot))
        except CannotPeek:
            raise  # the crawl's setup is wrong: no point asking again
        except Exception:
            self._rank_failed(slot)
            return None
        self._failing.discard(slot)
        return ranked

    def _rank_failed(self, slot: str) -> None:
        """Ranking *slot* raised (a custom manager's or a disk queue's error):
        log it once, and rank the slot again a little later."""
        if slot not in self._failing:
            # One traceback while the trouble lasts: out of descriptors, every
            # slot whose files are closed fails alike.
            log = logger.debug if self._failing else logger.exception
            self._failing.add(slot)
            log("slotkit: could not read or rank slot %r; trying again in 1 s", slot, exc_info=True)
        self._order.discard(slot)  # an entry filed before, for an older head
        self._order.remember_wait(
            slot, self.readiness.now() + RANK_RETRY, self.readiness.generation
        )

    def _ask(self, slot: str, now: float, blocked: set[str]) -> float:
        """Ask the downloader how long the head of *slot* must wait; remember a "not yet"."""
        readiness = self.readiness
        head = self._head(slot)
        wait = readiness.wait(head)
        if wait > 0:
            self._order.remember_wait(slot, now + wait, readiness.generation)
            return wait
        if blocked and not blocked.isdisjoint(self._heads[slot][1]):
            return math.inf  # not remembered: the arrival of the request in transit decides
        return 0.0

    def _refile(self, slot: str, version: int) -> None:
        """Move the head requests of *slot* that now belong to another sub-queue there.

        A robots.txt Crawl-delay read after requests were queued under their
        group's key (``THROTTLING_DOMAIN_GROUPING``, a ``download_slot``) joins
        their site's scope: at the head of the group's sub-queue, the paced
        site's requests would hold every other site of the group behind them.
        """
        while slot in self.pqueues:
            head = self._head(slot)
            key = sub_queue_key(self.readiness, head)
            if key == slot:
                self._keyed[slot] = version
                return
            request = self._pop_from(slot)
            if request is None:  # pragma: no cover - the head was just peeked
                continue
            try:
                self.push(request)
            except Exception:
                # Where it was, it is paced by its group, not lost.
                logger.warning("slotkit: could not move %s to %r", request, key, exc_info=True)
                self.pqueues.push(slot, request)
                self._forget(slot)
                self._keyed[slot] = version
                return
