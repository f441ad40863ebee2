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
2. **Readiness.** Slots are asked, in that order, whether their head request
   could be sent now (``downloader.time_until_ready(head)``);
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
3. **Requests in transit.** Scrapy hands a request to the downloader through
   an asyncio task, so the scopes of a request just popped do not count it
   yet. Until the downloader reports it (``request_reached_downloader``), a
   scope it uses is treated as not ready if one more request could change
   that: it has a delay or a quota, its concurrency would be used up, or its
   scope manager is not slotkit's. Without this, one engine loop could pop
   several requests for a scope with one free place, and all but one would
   wait in the downloader, holding a ``CONCURRENT_REQUESTS`` place each.

``CONCURRENT_REQUESTS_PER_IP`` is supported: an IP scope is just another
scope of the request, so it counts through ``time_until_ready``.

With a downloader that has no ``time_until_ready`` (Scrapy's own), every slot
counts as ready, and the queue behaves like ``DownloaderAwarePriorityQueue``.

The per-crawler readiness state (points 2 and 3) lives in
:mod:`slotkit.pqueue_readiness` and one slot's sub-queue in
:mod:`slotkit.pqueue_slot`; :class:`Readiness` and :func:`readiness_of` are
re-exported here; quota shares (the third criterion of the order) are
computed by :mod:`slotkit.pqueue_quota`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Iterable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.pqueues import ScrapyPriorityQueue, _path_safe

from slotkit.pqueue_quota import QuotaShares
from slotkit.pqueue_readiness import Readiness, readiness_of
from slotkit.pqueue_slot import _SlotQueue

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.pqueues import QueueProtocol
    from typing_extensions import Self

__all__ = ["Readiness", "ThrottlingAwarePriorityQueue", "readiness_of"]

logger = logging.getLogger("slotkit")

#: What the key of a slot's delayed sub-queue adds to the slot's (see
#: ThrottlingAwarePriorityQueue._key).
DELAYED = " (throttling_delay)"

#: Sort key of a ready slot; smaller goes first (see ``ThrottlingAwarePriorityQueue.rank``).
Rank = tuple[float, ...]


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
        self._shares = QuotaShares(self.readiness)
        #: slot key -> that slot's priority queue (never empty).
        self.pqueues: dict[str, _SlotQueue] = {}
        #: slot key -> its next request and that request's scopes (asked once per head).
        self._heads: dict[str, tuple[Request, dict[str, float | None]]] = {}
        #: slot key -> (not ready before, readiness generation when cached).
        self._due: dict[str, tuple[float, int]] = {}
        #: slot key -> when it was last served (a counter), for fairness among equals.
        self._served: dict[str, int] = {}
        #: slot key -> the key version (Readiness.key_version) its head was filed under.
        self._keyed: dict[str, int] = {}
        self._turn = itertools.count(1)
        self.readiness.on_departure(self)
        if isinstance(slot_startprios, Mapping):
            for slot, startprios in slot_startprios.items():
                queue = self.pqfactory(slot, startprios)
                if queue:
                    self.pqueues[slot] = queue
                else:  # nothing left on disk for it: never keep an empty slot queue
                    queue.close()
        elif slot_startprios:
            self._migrate(list(slot_startprios))

    def pqfactory(self, slot: str, startprios: Iterable[int] = ()) -> _SlotQueue:
        """The priority queue of *slot* (stored under ``key/<path-safe slot>`` on disk)."""
        return _SlotQueue(
            self.crawler,
            self.downstream_queue_cls,
            self.key + "/" + _path_safe(slot),
            startprios,
            start_queue_cls=self._start_queue_cls,
        )

    def _migrate(self, startprios: list[int]) -> None:
        """Resume a job saved by ``ScrapyPriorityQueue``: move its requests into slot queues."""
        if not all(isinstance(p, int) for p in startprios):
            raise ValueError(
                f"{type(self).__name__} cannot resume this job directory: its queue state "
                f"{startprios!r} was written by an unknown priority queue. Resume it with the "
                "SCHEDULER_PRIORITY_QUEUE it was started with, or start a new JOBDIR."
            )
        legacy = ScrapyPriorityQueue(
            self.crawler,
            self.downstream_queue_cls,
            self.key,
            startprios,
            start_queue_cls=self._start_queue_cls,
        )
        moved = 0
        while (request := legacy.pop()) is not None:
            self.push(request)
            moved += 1
        legacy.close()
        logger.info("slotkit: moved %d queued requests into per-slot queues", moved)

    # Queue protocol

    def push(self, request: Request) -> None:
        slot = self._key(request)
        queue = self.pqueues.get(slot)
        if queue is None:
            queue = self.pqueues[slot] = self.pqfactory(slot)
        try:
            queue.push(request)
        except Exception:
            # An unserializable request (the scheduler then keeps it in memory):
            # leave no empty slot queue behind.
            if not queue:
                del self.pqueues[slot]
                queue.close()
            raise
        self._forget(slot)

    def pop(self) -> Request | None:
        """The best ready request; if none is ready, the one due soonest."""
        slot, _ = self._choose(fallback=True)
        return None if slot is None else self._take(slot)

    def pop_ready(self) -> Request | None:
        """The best request the downloader would send at once, or ``None``."""
        slot, _ = self._choose(fallback=False)
        return None if slot is None else self._take(slot)

    def next_ready_in(self) -> float:
        """Seconds until some slot may be ready (``inf``: only a finished download can tell)."""
        slot, wait = self._choose(fallback=False)
        return 0.0 if slot is not None else wait

    def peek(self) -> Request | None:
        """The request :meth:`pop` would return, left in the queue."""
        slot, _ = self._choose(fallback=True)
        return None if slot is None else self._head(slot)

    def close(self) -> dict[str, list[int]]:
        active = {slot: queue.close() for slot, queue in self.pqueues.items()}
        self.pqueues.clear()
        self._heads.clear()
        self._due.clear()
        self._keyed.clear()
        return active

    def __len__(self) -> int:
        return sum(len(queue) for queue in self.pqueues.values())

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
        known = self._heads.get(slot)
        scopes = known[1] if known is not None and known[0] is head else None
        share = self._shares.share(head, scopes) if self._shares.may_have_share(scopes) else 0.0
        return (self.busy(slot), -head.priority, -share, self._served.get(slot, 0))

    def busy(self, slot: str) -> int:
        """Requests of *slot* in the downloader (waiting or in flight)."""
        slot = slot.removesuffix(DELAYED)  # a delayed sub-queue counts as its slot
        registry = getattr(self.downloader, "registry", None)
        if registry is not None:
            scope = registry.peek(slot)
            return len(scope.requests) if scope is not None else 0
        slots = getattr(self.downloader, "slots", None)
        view = slots.get(slot) if slots is not None else None
        return len(view.active) if view is not None else 0

    def quota_share(
        self, request: Request, scopes: Mapping[str, float | None] | None = None
    ) -> float:
        """The largest share of a scope's remaining quota that *request* would use
        (see :meth:`slotkit.pqueue_quota.QuotaShares.share`)."""
        return self._shares.share(request, scopes)

    def _choose(self, *, fallback: bool) -> tuple[str | None, float]:
        """The slot to pop from, or ``(None, seconds until the soonest one may be)``.

        1. Slots with a cached "not yet" are skipped (see the module docstring).
        2. The others are ranked, and asked for readiness best first; the
           first ready one wins, so most slots are never asked.
        With *fallback*, a slot is returned whenever any request is queued.
        """
        readiness = self.readiness
        if not readiness.knows_readiness:  # Scrapy's downloader: everything is ready
            ranked = [(self.rank(slot, self._head(slot)), slot) for slot in self.pqueues]
            return (min(ranked)[1], 0.0) if ranked else (None, math.inf)
        version = readiness.key_version()
        if version:
            for slot in [s for s in self.pqueues if self._keyed.get(s) != version]:
                self._refile(slot, version)
        now = readiness.now()
        soonest = math.inf
        soonest_slot: str | None = None
        candidates: list[tuple[Rank, str]] = []
        for slot in self.pqueues:
            wait = self._cached_wait(slot, now)
            if wait is None:
                candidates.append((self.rank(slot, self._head(slot)), slot))
            elif wait < soonest or soonest_slot is None:
                soonest, soonest_slot = wait, slot
        heapq.heapify(candidates)
        blocked = readiness.blocked_scopes()
        while candidates:
            _, slot = heapq.heappop(candidates)
            wait = self._ask(slot, now, blocked)
            if wait <= 0:
                return slot, 0.0
            if wait < soonest or soonest_slot is None:
                soonest, soonest_slot = wait, slot
        return (soonest_slot if fallback else None), soonest

    def _cached_wait(self, slot: str, now: float) -> float | None:
        """The remembered wait of *slot*, or ``None`` if it must be asked."""
        cached = self._due.get(slot)
        if cached is None:
            return None
        due, generation = cached
        if math.isinf(due):
            return math.inf if generation == self.readiness.generation else None
        return due - now if now < due else None

    def _ask(self, slot: str, now: float, blocked: set[str]) -> float:
        """Ask the downloader how long the head of *slot* must wait; remember a "not yet"."""
        readiness = self.readiness
        head = self._head(slot)
        wait = readiness.wait(head)
        if wait > 0:
            self._due[slot] = (now + wait, readiness.generation)
            return wait
        if blocked and not blocked.isdisjoint(self._heads[slot][1]):
            return math.inf  # not remembered: the arrival of the request in transit decides
        return 0.0

    def _head(self, slot: str) -> Request:
        known = self._heads.get(slot)
        if known is not None:
            return known[0]
        try:
            head = self.pqueues[slot].peek()
        except (AttributeError, NotImplementedError) as exc:
            queue_cls = self.downstream_queue_cls
            raise TypeError(
                f"{type(self).__name__} needs queues that can peek; "
                f"{queue_cls.__module__}.{queue_cls.__qualname__} cannot. "
                "Use one of Scrapy's SCHEDULER_DISK_QUEUE / SCHEDULER_MEMORY_QUEUE "
                "classes (queuelib >= 1.6.2) or add a peek() method."
            ) from exc
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
            key = self._key(head)
            if key == slot:
                self._keyed[slot] = version
                return
            request = self._pop_from(slot)
            if request is not None:
                self.push(request)

    def _key(self, request: Request) -> str:
        """The sub-queue of *request*: its slot's, or while its ``throttling_delay``
        runs, its slot's delayed sub-queue.

        The delayed request waits here rather than in the downloader, where it
        would hold a ``CONCURRENT_REQUESTS`` place, and its slot's other
        requests go on meanwhile (a delayed head would hold them back). One
        delayed sub-queue per slot, as many files as Scrapy's own per-slot
        queues: delayed requests of one slot leave in queue order (one due
        later can hold back one due sooner behind it, never the reverse).
        """
        slot = self.readiness.slot_of(request)
        return f"{slot}{DELAYED}" if self.readiness.delay_left(request) > 0 else slot

    def _take(self, slot: str) -> Request | None:
        request = self._pop_from(slot)
        if slot in self.pqueues:
            self._served[slot] = next(self._turn)
        if request is not None:
            self.readiness.handed_out(request)
        return request

    def _pop_from(self, slot: str) -> Request | None:
        """Pop the head of *slot*, dropping the sub-queue once it is empty."""
        queue = self.pqueues[slot]
        request = queue.pop()
        self._forget(slot)
        if not queue:
            del self.pqueues[slot]
            self._served.pop(slot, None)
            queue.close()
            if self.key:
                # The slot's directory goes once its queues removed their files.
                with suppress(OSError):
                    Path(self.key, _path_safe(slot)).rmdir()
        return request

    def departed(self, slot: str) -> None:
        """A request of *slot* left the downloader: a finite wait remembered for it
        may now be too long (``math.inf`` ones are re-asked by generation anyway)."""
        for key in (slot, f"{slot}{DELAYED}"):
            cached = self._due.get(key)
            if cached is not None and not math.isinf(cached[0]):
                del self._due[key]

    def _forget(self, slot: str) -> None:
        self._heads.pop(slot, None)
        self._due.pop(slot, None)
        self._keyed.pop(slot, None)
