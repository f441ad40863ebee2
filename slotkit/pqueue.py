"""A priority queue that knows which download slots can send right now.

:class:`ThrottlingAwarePriorityQueue` keeps one priority sub-queue per
download slot (the key ``downloader.get_slot_key(request)`` gives: with
slotkit's downloader, the request's primary throttling scope, or its site's
when a robots.txt Crawl-delay joined that to a group), like Scrapy's
``DownloaderAwarePriorityQueue`` and with the same disk layout, so either
class can resume a job directory the other wrote. On top of that:

1. **Order** (:meth:`~ThrottlingAwarePriorityQueue.rank`): the least busy
   slot first, then the higher request priority, then the request using the
   larger share of a scope's remaining quota, then the slot served longest
   ago.
2. **Readiness.** Slots are asked, in that order (kept in a heap, see
   :mod:`slotkit.pqueue_order`), whether their head request could be sent
   now (``downloader.time_until_ready(head)``);
   :meth:`~ThrottlingAwarePriorityQueue.pop_ready` takes from the first that
   answers ``0.0``, so most slots are never asked, and
   :meth:`~ThrottlingAwarePriorityQueue.next_ready_in` says when the soonest
   held-back slot comes due. A "not yet" is remembered per slot: a finite
   wait until it has passed, ``math.inf`` (full until a download finishes)
   until any request leaves the downloader; a finite wait also ends when a
   request of that slot leaves (a scope's first request holds the next one
   until it ends). Only a loosened limit (say,
   AutoThrottle lowering a delay) makes a scope ready earlier than
   remembered; the slot then goes at the old time, never too early.
3. **Requests in transit**, popped but not yet counted by the downloader,
   hold back the scopes one more request could fill (see
   :mod:`slotkit.pqueue_readiness`).

``CONCURRENT_REQUESTS_PER_IP`` is supported: an IP scope is just another
scope of the request, so it counts through ``time_until_ready``.

With a downloader that has no ``time_until_ready`` (Scrapy's own), every slot
counts as ready, and the queue behaves like ``DownloaderAwarePriorityQueue``.

The per-crawler readiness state (points 2 and 3) lives in
:mod:`slotkit.pqueue_readiness`, one slot's sub-queue in
:mod:`slotkit.pqueue_slot`, all of them in :mod:`slotkit.pqueue_store`,
ranks in :mod:`slotkit.pqueue_rank` and quota shares (the third criterion
of the order) in :mod:`slotkit.pqueue_quota`; :class:`Readiness` and
:func:`readiness_of` are re-exported here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from scrapy.pqueues import _path_safe

from slotkit.pqueue_order import Rank, SlotOrder
from slotkit.pqueue_quota import Terms
from slotkit.pqueue_rank import SlotRanks
from slotkit.pqueue_readiness import Readiness, readiness_of
from slotkit.pqueue_slot import (
    DELAYED,
    CannotPeek,
    _SlotQueue,
    resume_legacy_job,
    sub_queue_key,
)
from slotkit.pqueue_store import SlotQueues

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.pqueues import QueueProtocol
    from typing_extensions import Self

__all__ = ["DELAYED", "Readiness", "ThrottlingAwarePriorityQueue", "readiness_of"]

logger = logging.getLogger("slotkit")


#: Seconds before a slot whose ranking raised is ranked again.
RANK_RETRY = 1.0


class ThrottlingAwarePriorityQueue:
    """Per-slot priority queues; pops from slots whose scopes can send now.

    Use it as ``SCHEDULER_PRIORITY_QUEUE``. With Scrapy's stock scheduler,
    :meth:`pop` still returns a request while any is queued (the one due
    soonest when none is ready); :class:`~slotkit.scheduler.ThrottlingAwareScheduler`
    calls :meth:`pop_ready` instead, which returns ``None`` rather than a
    request that would wait in the downloader.
    """

    @classmethod
    def from_crawler(
        cls,
        crawler: Crawler,
        downstream_queue_cls: type[QueueProtocol],
        key: str,
        startprios: Mapping[str, Iterable[int]] | Iterable[int] | None = None,
        *,
        start_queue_cls: type[QueueProtocol] | None = None,
    ) -> Self:
        return cls(crawler, downstream_queue_cls, key, startprios, start_queue_cls=start_queue_cls)

    def __init__(
        self,
        crawler: Crawler,
        downstream_queue_cls: type[QueueProtocol],
        key: str,
        slot_startprios: Mapping[str, Iterable[int]] | Iterable[int] | None = None,
        *,
        start_queue_cls: type[QueueProtocol] | None = None,
        downloader: Any | None = None,
    ) -> None:
        self.crawler = crawler
        self.downstream_queue_cls = downstream_queue_cls
        self._start_queue_cls = start_queue_cls
        self.key = key
        self.readiness = readiness_of(crawler, downloader)
        self.downloader = self.readiness.downloader
        #: Busy counts, quota shares and turns served of the slots (pqueue_rank).
        self._ranks = SlotRanks(self.readiness)
        #: slot key -> that slot's priority queue (never empty).
        self.pqueues = SlotQueues(lambda slot, prios: self.pqfactory(slot, prios), key)
        #: slot key -> its next request and that request's scopes (asked once per head).
        self._heads: dict[str, tuple[Request, dict[str, float | None]]] = {}
        #: The slots in rank order, and the waits remembered for them (pqueue_order).
        self._order = SlotOrder()
        #: slot key -> the key version (Readiness.key_version) its head was filed under.
        self._keyed: dict[str, int] = {}
        #: Slots whose last ranking raised (logged once until one succeeds).
        self._failing: set[str] = set()
        #: The key version when slots were last chosen.
        self._version = 0
        self.readiness.on_departure(self)
        if isinstance(slot_startprios, Mapping):
            for slot in self.pqueues.resume(slot_startprios):
                self._offer(slot)
        elif slot_startprios:
            resume_legacy_job(self, list(slot_startprios))

    def pqfactory(self, slot: str, startprios: Iterable[int] = ()) -> _SlotQueue:
        """The priority queue of *slot* (stored under ``key/<path-safe slot>`` on disk)."""
        return _SlotQueue(
            self.crawler,
            self.downstream_queue_cls,
            self.key + "/" + _path_safe(slot),
            startprios,
            start_queue_cls=self._start_queue_cls,
            open_queues=self.pqueues.open_queues,
        )

    # Queue protocol

    def push(self, request: Request) -> None:
        slot = sub_queue_key(self.readiness, request)
        self.pqueues.push(slot, request)
        self._forget(slot)
        self._offer(slot)

    def pop(self) -> Request | None:
        """The best ready request; if none is ready, the one due soonest."""
        for _ in range(3):  # the fallback may name a slot that just failed again
            slot, _ = self._choose(fallback=True)
            if slot is None:
                return None
            if (request := self._take(slot)) is not None:
                return request
        return None

    def pop_ready(self) -> Request | None:
        """The best request the downloader would send at once, or ``None``."""
        while True:  # a slot whose queue cannot be read now waits: at most each once
            slot, _ = self._choose(fallback=False)
            if slot is None:
                return None
            if (request := self._take(slot)) is not None:
                return request

    def next_ready_in(self) -> float:
        """Seconds until some slot may be ready (``inf``: only a finished download can tell)."""
        slot, wait = self._choose(fallback=False)
        return 0.0 if slot is not None else wait

    def peek(self) -> Request | None:
        """The request :meth:`pop` would return, left in the queue."""
        slot, _ = self._choose(fallback=True)
        return None if slot is None else self._head(slot)

    def close(self) -> dict[str, list[int]]:
        active = self.pqueues.close_all()
        self._heads.clear()
        self._order.clear()
        self._keyed.clear()
        return active

    def __len__(self) -> int:
        return self.pqueues.requests()

    def __contains__(self, slot: str) -> bool:
        return slot in self.pqueues

    # Choosing a slot

    def rank(self, slot: str, head: Request) -> Rank:
        """Sort key of *slot*, whose next request is *head*; smaller goes first.

        Least busy slot, then higher priority, then larger quota share (so a
        big request is not starved by small ones), then longest unserved.
        Only slots that can send now compete, but the rank is computed before
        readiness is known: readiness is then asked in rank order, and the
        first ready slot wins.
        """
        return self._rank_and_terms(slot, head)[0]

    def _rank_and_terms(self, slot: str, head: Request) -> tuple[Rank, Terms]:
        """:meth:`rank`, and the quota terms of *head* (see :mod:`slotkit.pqueue_quota`)."""
        known = self._heads.get(slot)
        scopes = known[1] if known is not None and known[0] is head else None
        return self._ranks.rank_and_terms(slot, head, scopes)

    def busy(self, slot: str) -> int:
        """Requests of *slot* in the downloader (waiting or in flight)."""
        return self._ranks.busy(slot)

    def quota_share(
        self, request: Request, scopes: Mapping[str, float | None] | None = None
    ) -> float:
        """The largest share of a scope's remaining quota that *request* would use
        (see :meth:`slotkit.pqueue_quota.QuotaShares.share`)."""
        return self._ranks.shares.share(request, scopes)

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
                try:
                    rank, terms = self._rank_and_terms(slot, self._head(slot))
                except CannotPeek:
                    raise
                except Exception:
                    # Filed back under its old rank, it would come out first
                    # and raise again at every choice, starving the rest.
                    self._rank_failed(slot)
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
        try:
            rank, terms = self._rank_and_terms(slot, self._head(slot))
        except CannotPeek:
            raise  # the crawl's setup is wrong: no point asking again
        except Exception:
            # Raising would lose a request just popped, or have one just pushed
            # pushed again; not filing the slot would strand its requests.
            self._rank_failed(slot)
            return
        self._failing.discard(slot)
        self._order.offer(slot, rank, terms or None)

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

    def _head(self, slot: str) -> Request:
        known = self._heads.get(slot)
        if known is not None:
            return known[0]
        head = self.pqueues[slot].peek()
        if head is None:  # pragma: no cover - sub-queues are never kept empty
            raise RuntimeError(f"slot queue {slot!r} is empty")
        self._heads[slot] = (head, self.readiness.scopes(head))
        return head

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

    def _take(self, slot: str) -> Request | None:
        """Pop the head of *slot*, or ``None`` if its job directory cannot be read now."""
        try:
            request = self._pop_from(slot)
        except OSError:
            # No descriptor left to reopen its files: an OSError would end the
            # engine's loop. Its requests wait on disk; another slot may go.
            self._rank_failed(slot)
            return None
        if slot in self.pqueues:
            self._ranks.served(slot)
            self._offer(slot)
        if request is not None:
            self.readiness.handed_out(request)
        return request

    def _pop_from(self, slot: str) -> Request | None:
        """Pop the head of *slot*, dropping the sub-queue once it is empty."""
        request, emptied = self.pqueues.pop_head(slot)
        self._forget(slot)
        if emptied:
            self._order.discard(slot)
            self._ranks.forget(slot)
            self._failing.discard(slot)
        return request

    def departed(self, slot: str) -> None:
        """A request of *slot* left the downloader: a finite wait remembered for it
        may now be too long (``math.inf`` ones are re-asked by generation anyway)."""
        order = self._order
        for key in (slot, f"{slot}{DELAYED}"):
            if order.waits_finitely(key):
                order.forget_wait(key)
                self._offer(key)
            elif order.offered(key):
                self._offer(key)  # one fewer busy: its rank may have improved

    def _forget(self, slot: str) -> None:
        """Forget what was known of *slot*'s head; the caller offers it again."""
        self._heads.pop(slot, None)
        self._order.forget_wait(slot)
        self._keyed.pop(slot, None)
