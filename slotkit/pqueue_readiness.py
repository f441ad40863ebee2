"""What the priority queues know about the downloader (part of :mod:`slotkit.pqueue`).

:class:`Readiness` answers whether a request could be sent now, counts the
requests popped but not yet seen by the downloader, and notices requests
leaving it; :func:`readiness_of` gives the one a crawler's queues share.

**Requests in transit.** Scrapy hands a request to the downloader through an
asyncio task, so the scopes of a request just popped do not count it yet.
Until the downloader reports it (``request_reached_downloader``), a scope it
uses is treated as not ready if one more request could change that: it has a
delay or a quota, its concurrency would be used up, or its scope manager is
not slotkit's (:meth:`Readiness.blocked_scopes`). Without this, one engine
loop could pop several requests for a scope with one free place, and all but
one would wait in the downloader, holding a ``CONCURRENT_REQUESTS`` place
each.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from scrapy import signals

from slotkit.cache_hits import CacheHits
from slotkit.manager import normalize_scopes

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler


class Readiness:
    """What both queues of a scheduler (memory and disk) share about the downloader.

    One per crawler (see :func:`readiness_of`): the readiness query, the
    requests popped but not yet seen by the downloader, and a counter bumped
    whenever a request leaves the downloader.
    """

    def __init__(self, crawler: Crawler, downloader: Any) -> None:
        # Weak: this object lives in a module-level WeakKeyDictionary keyed by the
        # crawler, and the downloader refers to the crawler.
        self._downloader = weakref.ref(downloader)
        #: Whether the downloader answers ``time_until_ready`` (Scrapy's does not).
        self.knows_readiness = callable(getattr(downloader, "time_until_ready", None))
        #: Bumped when a request leaves the downloader (a concurrency place may be free).
        self.generation = 0
        #: Popped requests the downloader has not reported yet -> their scope ids.
        self.transit: dict[Request, tuple[str, ...]] = {}
        self.transit_scopes: Counter[str] = Counter()
        self._waker: weakref.WeakMethod[Callable[[], None]] | None = None
        #: Queues told which slot a departing request belonged to (see on_departure).
        self._queues: weakref.WeakSet[Any] = weakref.WeakSet()
        self._cache_hits = CacheHits(crawler, downloader)
        crawler.signals.connect(self._arrived, signal=signals.request_reached_downloader)
        crawler.signals.connect(self._left, signal=signals.request_left_downloader)

    def set_waker(self, method: Callable[[], None] | None) -> None:
        """Call the bound *method* when a request in transit reaches the downloader.

        Held weakly, like everything here that could keep a crawler alive.
        """
        self._waker = None if method is None else weakref.WeakMethod(method)

    def on_departure(self, queue: Any) -> None:
        """Call ``queue.departed(slot)`` whenever a request of that slot leaves the downloader.

        Held weakly. A wait remembered for a slot can end sooner when one of
        its requests ends: the gap after a scope's first request runs from
        that request's end, so its scope answers "a second from now" while it
        is in flight (see ``OPENING_ALLOWANCE`` in :mod:`slotkit.scope`).
        """
        self._queues.add(queue)

    def slot_of(self, request: Request) -> str:
        """The sub-queue key of *request*: the downloader's ``queue_key`` if it has
        one (slotkit's), else its ``get_slot_key`` (Scrapy's)."""
        queue_key = getattr(self.downloader, "queue_key", None)
        if callable(queue_key):
            return str(queue_key(request))
        return str(self.downloader.get_slot_key(request))

    def key_version(self) -> int:
        """Changes when :meth:`slot_of` may answer differently for a queued request.

        The number of robots.txt Crawl-delays known: one joins its site's
        scope to requests queued under their group's key before it was read.
        ``0`` while none is known (keys never change then).
        """
        delays = getattr(getattr(self.downloader, "crawl_delays", None), "delays", None)
        return len(delays) if delays else 0

    @property
    def downloader(self) -> Any:
        downloader = self._downloader()
        if downloader is None:  # pragma: no cover - the crawl is over
            raise RuntimeError("the downloader of this crawl is gone")
        return downloader

    # What the downloader will do with a request

    def scopes(self, request: Request) -> dict[str, float | None]:
        """Scope id -> quota amount of *request*, as far as a sync answer tells."""
        known = getattr(self.downloader, "known_scopes", None)
        scopes: dict[str, float | None] = known(request) if callable(known) else {}
        if not scopes and isinstance(request.meta.get("throttling_scopes"), Mapping):
            with suppress(Exception):
                scopes = normalize_scopes(request.meta["throttling_scopes"])
        if not scopes:
            scopes = {self.downloader.get_slot_key(request): None}
        return scopes

    def wait(self, request: Request) -> float:
        """Seconds until the downloader would send *request* at once (0.0: now)."""
        if not self.knows_readiness:
            return 0.0
        return max(0.0, float(self.downloader.time_until_ready(request)), self.delay_left(request))

    def cache_answers(self, request: Request) -> bool:
        """Whether the crawl's HTTP cache will answer *request* before the downloader."""
        return self._cache_hits.answers(request)

    def delay_left(self, request: Request) -> float:
        """Seconds left of *request*'s ``throttling_delay``; asking starts it."""
        if not request.meta.get("throttling_delay"):
            return 0.0  # the usual case, without a call
        left = getattr(self.downloader, "delay_left", None)
        return float(left(request)) if callable(left) else 0.0

    def now(self) -> float:
        clock_now = getattr(self.downloader, "now", None)
        return float(clock_now()) if callable(clock_now) else 0.0

    # Requests in transit

    def handed_out(self, request: Request) -> None:
        """*request* left the queue for the downloader; count it until it arrives."""
        if not self.knows_readiness or request in self.transit:
            return
        ids = tuple(self.scopes(request))
        self.transit[request] = ids
        self.transit_scopes.update(ids)

    def blocked_scopes(self) -> set[str]:
        """Scopes that a request in transit may fill or hold; usually none.

        Requests that will never arrive (a middleware answered them) are
        forgotten first.
        """
        if not self.transit:
            return set()
        active = getattr(self.downloader, "active", None)
        if active is not None:
            for request in [r for r in self.transit if r not in active]:
                self._drop(request)
        return {
            scope_id
            for scope_id, count in self.transit_scopes.items()
            if self._transit_matters(scope_id, count)
        }

    def _transit_matters(self, scope_id: str, count: int) -> bool:
        """Could *count* more dispatches make *scope_id* wait? Unknown answers say yes."""
        registry = getattr(self.downloader, "registry", None)
        scope = registry.peek(scope_id) if registry is not None else None
        if scope is None:
            return True  # created when the first request arrives; its limits are unknown
        manager = scope.manager
        if getattr(manager, "quota", None) is not None:
            return True
        if getattr(manager, "server_budget", None) is not None:
            return True  # what the server said is left may be one request
        delay = getattr(manager, "current_delay", None)
        active = getattr(manager, "active", None)
        concurrency = getattr(manager, "concurrency", None)
        if (
            not isinstance(delay, (int, float))
            or not isinstance(active, int)
            or not isinstance(concurrency, int)
        ):
            return True  # a custom scope manager: assume the worst
        return delay > 0 or active + count >= concurrency

    def _drop(self, request: Request) -> bool:
        ids = self.transit.pop(request, None)
        if ids is None:
            return False
        self.transit_scopes.subtract(ids)
        for scope_id in ids:
            if self.transit_scopes[scope_id] <= 0:
                del self.transit_scopes[scope_id]
        return True

    def reset(self) -> None:
        """Forget the requests in transit (the crawl is closing)."""
        self.transit.clear()
        self.transit_scopes.clear()
        self._waker = None

    # Signal handlers

    def _arrived(self, request: Request, spider: Any = None) -> None:
        waker = self._waker() if self._waker is not None else None
        if self._drop(request) and waker is not None:
            waker()

    def _left(self, request: Request, spider: Any = None) -> None:
        self._drop(request)
        self.generation += 1
        if self._queues:
            # Every scope of the request has one fewer busy request: the slots
            # named after them (a group's, with a site's Crawl-delay; one a
            # throttling_scopes meta names) may rank better now.
            keys = dict.fromkeys((self.slot_of(request), *self.scopes(request)))
            for queue in list(self._queues):
                for key in keys:
                    queue.departed(key)


_readiness: WeakKeyDictionary[Crawler, Readiness] = WeakKeyDictionary()


def readiness_of(crawler: Crawler, downloader: Any | None = None) -> Readiness:
    """The :class:`Readiness` of *crawler* (created on first use)."""
    readiness = _readiness.get(crawler)
    if readiness is None or (downloader is not None and readiness._downloader() is not downloader):
        if downloader is None:
            downloader = crawler.engine.downloader
        readiness = _readiness[crawler] = Readiness(crawler, downloader)
    return readiness
