"""Closing the spider while requests wait for their scopes.

The engine waits for every request in progress before it closes the
downloader, and a request held at the gate is in progress: without this hook
``CLOSESPIDER_TIMEOUT`` during a 30 s Retry-After would wait the 30 s out.
:class:`SpiderClosing` (a base of :class:`slotkit.Downloader`) ends those
requests as the spider starts closing, and saves scope states under JOBDIR.
"""

from __future__ import annotations

import functools
import logging
import marshal
import math
import pickle
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

if TYPE_CHECKING:
    from weakref import WeakSet

    from scrapy import Request
    from scrapy.crawler import Crawler
    from twisted.internet.interfaces import IReactorTime

    from slotkit.dns import AddressLookups
    from slotkit.gate import Gate
    from slotkit.persistence import ScopeStateStore
    from slotkit.registry import ScopeRegistry
    from slotkit.robots import CrawlDelays
    from slotkit.stats import ThrottlingStats

logger = logging.getLogger("slotkit")

__all__ = ["REQUEUED", "SpiderClosing", "can_be_saved", "requeued", "restore_filtering"]

#: Meta key of a request put back in the scheduler at close: its own ``dont_filter``.
REQUEUED = "_slotkit_requeued_dont_filter"


def requeued(request: Request) -> Request:
    """The copy of *request* the engine schedules again when a paused crawl closes.

    The dupefilter saw the request already, so the copy must pass it once;
    its own ``dont_filter`` is kept in the meta and restored when it comes
    back (:func:`restore_filtering`), so that what it leads to (a redirect,
    say, which copies the flag) is filtered as usual.
    """
    original = request.meta.get(REQUEUED, request.dont_filter)
    return request.replace(dont_filter=True, meta={**request.meta, REQUEUED: original})


def can_be_saved(request: Request, crawler: Crawler) -> bool:
    """Whether the scheduler's disk queue can store *request* in the job directory.

    One it cannot (a callback that is not a spider method, a meta value that
    does not pickle, or does not marshal for a marshal queue) goes to Scrapy's
    memory queue, which is dropped when the crawl stops: put back at close it
    would end without a word, neither sent on resume nor failed. It ends as
    without ``JOBDIR`` instead. Start requests go to their own disk queue
    (``SCHEDULER_START_DISK_QUEUE``) when one is set.
    """
    settings = crawler.settings
    queue = settings.get("SCHEDULER_DISK_QUEUE")
    if request.meta.get("is_start_request"):
        queue = settings.get("SCHEDULER_START_DISK_QUEUE") or queue
    try:
        data = request.to_dict(spider=crawler.spider)
        if _marshals(queue):
            marshal.dumps(data)
        else:
            pickle.dumps(data, protocol=4)
    except Exception:
        return False
    return True


@functools.lru_cache(maxsize=16)
def _marshals(queue: Any) -> bool:
    """Whether the disk queue class *queue* (or its import path) stores with marshal."""
    from scrapy import squeues

    queue_cls = load_object(queue) if isinstance(queue, str) else queue
    marshal_queues = tuple(
        cls
        for name, cls in vars(squeues).items()
        if name.startswith("Marshal") and isinstance(cls, type)
    )
    return isinstance(queue_cls, type) and issubclass(queue_cls, marshal_queues)


def restore_filtering(request: Request) -> None:
    """Give a request put back at close its own ``dont_filter`` again."""
    request.dont_filter = bool(request.meta.pop(REQUEUED))


class SpiderClosing:
    """Ends requests waiting at the gate when the spider closes (a base of the Downloader)."""

    # Set up by the Downloader's __init__.
    crawler: Crawler
    _clock: IReactorTime
    registry: ScopeRegistry
    gate: Gate
    stats: ThrottlingStats
    crawl_delays: CrawlDelays | None
    _store: ScopeStateStore | None
    _saved: dict[str, dict[str, float]]
    _closing_reason: str | None
    _lookups: AddressLookups | None
    _resending: WeakSet[Request]
    #: Set as the spider closes: requests cut off at the gate go back to the scheduler.
    _requeue_at_close: bool = False

    def _engine_started(self) -> None:
        engine = self.crawler.engine
        close_spider = engine.close_spider_async

        async def close_spider_async(*, reason: str = "cancelled") -> None:
            self._spider_closing(reason)
            await close_spider(reason=reason)

        engine.close_spider_async = close_spider_async  # type: ignore[method-assign]

    def _spider_closing(self, reason: str) -> None:
        """The spider is closing: requests still waiting for their scopes end now.

        Without ``JOBDIR`` they fail with :class:`~slotkit.GateClosedError`.
        With it they end as a copy of themselves (not filtered as a
        duplicate), which the engine puts back in the scheduler as it does a
        redirect, before the scheduler saves the job: the resumed crawl sends
        them, and the first run never reports them as failures (see
        :meth:`slotkit.Downloader._download`).
        """
        if self._closing_reason is not None:
            return
        self._closing_reason = reason
        self._requeue_at_close = self._store is not None
        waiting = self._requests_waiting()
        self._save_states()
        if waiting:
            answered = sum(1 for request in waiting if request in self._resending)
            unsaved = 0
            if self._store is not None:
                unsaved = sum(1 for request in waiting if not can_be_saved(request, self.crawler))
            if self._store is not None and not unsaved:
                fate = "; they go back to the scheduler (JOBDIR)"
            elif unsaved:
                fate = (
                    f"; {len(waiting) - unsaved} go back to the scheduler (JOBDIR), "
                    f"{unsaved} cannot be saved there (a callback that is not a spider "
                    "method, or meta that cannot be serialized) and end as without JOBDIR"
                )
            elif answered:
                unsent = len(waiting) - answered
                were = "was" if unsent == 1 else "were"
                end = "ends" if answered == 1 else "end"
                fate = "; " + (f"{unsent} {were} not sent, and " if unsent else "")
                fate += (
                    f"{answered} answered with a rate-limit signal and waiting to go again "
                    f"{end} with that answer (not retried)"
                )
            else:
                fate = "; they were not sent"
            logger.info(
                "slotkit: the spider closed (%s) while %d request(s) waited for their "
                "throttling scopes%s",
                reason,
                len(waiting),
                fate,
            )
        self.gate.close(list(self.registry.values()), f"the spider closed ({reason})")
        if self._lookups is not None:
            # Only now: on a plain Twisted reactor a released request resumes at
            # once, and must find the gate already closed.
            self._lookups.close()

    def _requests_waiting(self) -> list[Request]:
        """Every request the close cuts off while it waits for its scopes."""
        waiting = [waiter.request for waiter in self.gate.waiting]
        if self._lookups is not None:
            waiting += self._lookups.waiting_requests()
        return waiting

    def _save_states(self) -> None:
        if self._store is None:
            return
        now = self._clock.seconds()
        states = {
            scope_id: state
            for scope_id, state in self._saved.items()
            # A state loaded for a scope this run never used is kept while it matters.
            if state.get("hold_until", -math.inf) > now
            or "backoff_delay" in state
            or state.get("quota_until", -math.inf) > now
        }
        for scope in self.registry.values():
            export = getattr(scope.manager, "export_state", None)
            state = export(now) if callable(export) else None
            if state:
                states[scope.id] = state
            else:
                states.pop(scope.id, None)
        delays = dict(self.crawl_delays.delays) if self.crawl_delays is not None else {}
        self._store.save(states, delays)
