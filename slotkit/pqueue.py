"""A priority queue that knows which download slots can send right now.

:class:`ThrottlingAwarePriorityQueue` keeps one priority sub-queue per
download slot (the key ``downloader.get_slot_key(request)`` gives: with
slotkit's downloader, the request's primary throttling scope, or its site's
when a robots.txt Crawl-delay joined that to a group, or for a request of
several scopes, that set: see ``Downloader.queue_key``), like Scrapy's
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
ranks in :mod:`slotkit.pqueue_rank`, quota shares (the third criterion
of the order) in :mod:`slotkit.pqueue_quota` and the choice of a slot in
:mod:`slotkit.pqueue_choice`; :class:`Readiness` and
:func:`readiness_of` are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from scrapy.pqueues import _path_safe

from slotkit.pqueue_choice import SlotChoice
from slotkit.pqueue_order import Rank, SlotOrder
from slotkit.pqueue_quota import Terms
from slotkit.pqueue_rank import SlotRanks
from slotkit.pqueue_readiness import Readiness, readiness_of
from slotkit.pqueue_slot import (
    CACHED,
    DELAYED,
    _SlotQueue,
    leading_scope,
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


class ThrottlingAwarePriorityQueue(SlotChoice):
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
        #: Sub-queues of a set of scopes (see leading_scope) -> the scope leading them,
        #: and the other way round: a departure of that scope's request concerns them.
        self._led: dict[str, str] = {}
        self._led_by: dict[str, set[str]] = {}
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

    def _head(self, slot: str) -> Request:
        known = self._heads.get(slot)
        if known is not None:
            return known[0]
        head = self.pqueues[slot].peek()
        if head is None:  # pragma: no cover - sub-queues are never kept empty
            raise RuntimeError(f"slot queue {slot!r} is empty")
        scopes = self.readiness.scopes(head)
        self._heads[slot] = (head, scopes)
        base = slot.removesuffix(DELAYED).removesuffix(CACHED)
        leader = leading_scope(base, scopes)
        if self._led.get(slot) != leader:
            self._unlead(slot)  # a custom manager may answer another set now
            if leader != base:
                self._led[slot] = leader
                self._led_by.setdefault(leader, set()).add(slot)
        return head

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
        if request is not None and not slot.endswith(CACHED):
            # A cache hit never reaches the downloader: nothing to wait for.
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
            self._unlead(slot)
        return request

    def _unlead(self, slot: str) -> None:
        """*slot* is no longer led by the scope it was (see ``_led``)."""
        leader = self._led.pop(slot, None)
        if leader is not None:
            led = self._led_by[leader]
            led.discard(slot)
            if not led:
                del self._led_by[leader]

    def departed(self, slot: str) -> None:
        """A request of *slot* left the downloader: a finite wait remembered for it
        may now be too long (``math.inf`` ones are re-asked by generation anyway)."""
        order = self._order
        for key in (slot, f"{slot}{DELAYED}", *self._led_by.get(slot, ())):
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
