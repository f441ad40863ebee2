"""Throttling-aware scheduling: a request waits in the scheduler, not the downloader.

With Scrapy's scheduler, a request whose throttling scope must wait (a delay,
a backoff, a full quota) enters the downloader anyway and waits there,
holding one of the ``CONCURRENT_REQUESTS`` places. A crawl that mixes a
heavily throttled site with others then stalls on the throttled one
(head-of-line blocking).

:class:`ThrottlingAwareScheduler` hands the engine only requests that the
downloader would send at once:

1. ``next_request()`` asks the priority queue
   (:class:`~slotkit.pqueue.ThrottlingAwarePriorityQueue`) for a ready
   request, from memory first, then from disk.
2. If none is ready it returns ``None``; the held requests stay where they
   are queued (on disk with ``JOBDIR``, so they survive a pause), and they
   still count as pending, so the spider does not close.
3. One timer (at most one pending, re-armed only to an earlier time) wakes
   the engine when the soonest held request comes due. A scope that is full
   until a download finishes needs no timer: the engine asks the scheduler
   again whenever a download finishes.

Enable it with::

    DOWNLOADER = "slotkit.Downloader"
    SCHEDULER = "slotkit.ThrottlingAwareScheduler"
    SCHEDULER_PRIORITY_QUEUE = "slotkit.ThrottlingAwarePriorityQueue"
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from scrapy.core.scheduler import Scheduler
from scrapy.pqueues import DownloaderAwarePriorityQueue, ScrapyPriorityQueue
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.misc import load_object

from slotkit.clock import default_clock
from slotkit.pqueue import ThrottlingAwarePriorityQueue, readiness_of
from slotkit.validation import SettingsError, per_ip_limit

if TYPE_CHECKING:
    from queuelib.queue import BaseQueue
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import IDelayedCall, IReactorTime
    from typing_extensions import Self

__all__ = [
    "ThrottlingAwarePriorityQueue",
    "ThrottlingAwareScheduler",
    "check_priority_queue",
]

logger = logging.getLogger("slotkit")

PRIORITY_QUEUE_PATH = "slotkit.ThrottlingAwarePriorityQueue"
SCHEDULER_PATH = "slotkit.ThrottlingAwareScheduler"

#: Scrapy's own priority queues, which the scheduler replaces by its own.
_STOCK_QUEUES = (ScrapyPriorityQueue, DownloaderAwarePriorityQueue)


class ThrottlingAwareScheduler(Scheduler):
    """Scrapy's scheduler, handing out only requests whose scopes can send now.

    Needs ``DOWNLOADER = "slotkit.Downloader"`` (or any downloader with a
    ``time_until_ready(request)`` method). If ``SCHEDULER_PRIORITY_QUEUE`` is
    one of Scrapy's own queues, :class:`ThrottlingAwarePriorityQueue` is used
    instead; both store requests on disk the same way, so a job directory
    started with Scrapy's ``DownloaderAwarePriorityQueue`` (the default) can
    be resumed, and one started with ``ScrapyPriorityQueue`` is moved into
    per-slot queues when resumed.

    Stats: ``throttling/scheduler/held_back`` counts the times every queued
    request had to wait; ``throttling/scheduler/wakeups`` the timer wake-ups.
    """

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        downloader = crawler.engine.downloader
        if not callable(getattr(downloader, "time_until_ready", None)):
            raise SettingsError(
                f"SCHEDULER = {SCHEDULER_PATH!r} needs a downloader that can tell when a request "
                f"may be sent; {type(downloader).__module__}.{type(downloader).__qualname__} "
                "has no time_until_ready(). Set DOWNLOADER = 'slotkit.Downloader'."
            )
        return super().from_crawler(crawler)

    def __init__(
        self,
        dupefilter: BaseDupeFilter,
        jobdir: str | None = None,
        dqclass: type[BaseQueue] | None = None,
        mqclass: type[BaseQueue] | None = None,
        logunser: bool = False,
        stats: StatsCollector | None = None,
        pqclass: type[Any] | None = None,
        crawler: Crawler | None = None,
        *,
        clock: IReactorTime | None = None,
    ) -> None:
        super().__init__(
            dupefilter,
            jobdir=jobdir,
            dqclass=dqclass,
            mqclass=mqclass,
            logunser=logunser,
            stats=stats,
            pqclass=_throttling_aware(pqclass),
            crawler=crawler,
        )
        self._clock = clock
        self._timer: IDelayedCall | None = None
        #: True after next_request() held everything back, until it hands one out.
        self._starved = False

    def open(self, spider: Spider) -> Deferred[None] | None:
        result = super().open(spider)
        self._readiness = readiness_of(self._crawler)
        self._readiness.set_waker(self._on_arrival)
        if self._clock is None:
            self._clock = _clock_of(self._readiness.downloader)
        return result

    def close(self, reason: str) -> Deferred[None] | None:
        self._cancel_timer()
        readiness = getattr(self, "_readiness", None)
        if readiness is not None:
            readiness.reset()
        return super().close(reason)

    def next_request(self) -> Request | None:
        """A request the downloader can send now, or ``None`` (and a wake-up is armed)."""
        request: Request | None = self.mqs.pop_ready()  # type: ignore[attr-defined]
        source = "memory"
        if request is None and self.dqs is not None:
            request = self.dqs.pop_ready()  # type: ignore[attr-defined]
            source = "disk"
        if request is None:
            if len(self):
                self._hold()
            return None
        self._starved = False
        self._inc(f"scheduler/dequeued/{source}")
        self._inc("scheduler/dequeued")
        return request

    # Waking the engine

    def _hold(self) -> None:
        """Every queued request must wait: wake the engine when the first comes due."""
        self._starved = True
        self._inc("throttling/scheduler/held_back")
        wait = self.mqs.next_ready_in()  # type: ignore[attr-defined]
        if self.dqs is not None:
            wait = min(wait, self.dqs.next_ready_in())  # type: ignore[attr-defined]
        self._arm(wait)

    def _arm(self, wait: float) -> None:
        """Make sure the engine is woken within *wait* seconds; one timer at most."""
        if math.isinf(wait):
            return  # a finished download wakes the engine
        clock = self._clock_now()
        due = clock.seconds() + wait
        timer = self._timer
        if timer is not None and timer.active():
            if timer.getTime() <= due:
                return
            timer.cancel()
        self._timer = clock.callLater(wait, self._wake)

    def _wake(self) -> None:
        self._timer = None
        self._inc("throttling/scheduler/wakeups")
        self._wake_engine()

    def _on_arrival(self) -> None:
        # A request in transit reached the downloader: requests held back because of
        # it can be judged now.
        if self._starved:
            self._wake_engine()

    def _wake_engine(self) -> None:
        """Ask the engine to pull from the scheduler on its next turn.

        Scrapy 2.19 has no public call for this; ``engine._slot.nextcall`` is
        what the engine itself schedules after each download (it runs at
        most once per reactor turn however often it is scheduled). Without
        it, the engine's 5-second heartbeat still comes.
        """
        engine = getattr(self._crawler, "engine", None)
        nextcall = getattr(getattr(engine, "_slot", None), "nextcall", None)
        if nextcall is not None:
            nextcall.schedule()

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    # Helpers

    @property
    def _crawler(self) -> Crawler:
        if self.crawler is None:
            raise RuntimeError(f"{type(self).__name__} needs a crawler")
        return self.crawler

    def _clock_now(self) -> IReactorTime:
        if self._clock is None:
            self._clock = default_clock()
        return self._clock

    def _inc(self, name: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(name)


def _throttling_aware(pqclass: type[Any] | None) -> type[Any] | None:
    """The priority queue class to use: Scrapy's own become slotkit's; others must fit."""
    if pqclass is None or callable(getattr(pqclass, "pop_ready", None)):
        return pqclass
    if pqclass in _STOCK_QUEUES:
        logger.debug(
            "slotkit: %s replaces SCHEDULER_PRIORITY_QUEUE %s.%s",
            SCHEDULER_PATH,
            pqclass.__module__,
            pqclass.__qualname__,
        )
        return ThrottlingAwarePriorityQueue
    raise SettingsError(
        f"SCHEDULER = {SCHEDULER_PATH!r} needs a priority queue that can hold back requests; "
        f"SCHEDULER_PRIORITY_QUEUE = '{pqclass.__module__}.{pqclass.__qualname__}' has no "
        f"pop_ready() and next_ready_in(). Set SCHEDULER_PRIORITY_QUEUE = {PRIORITY_QUEUE_PATH!r} "
        "or subclass it."
    )


def _clock_of(downloader: Any) -> IReactorTime:
    """The clock the downloader's scopes run on, so both agree on what *now* is."""
    for name in ("clock", "_clock"):
        clock = getattr(downloader, name, None)
        if clock is not None and callable(getattr(clock, "callLater", None)):
            return clock  # type: ignore[no-any-return]
    return default_clock()


def check_priority_queue(settings: BaseSettings) -> None:
    """Refuse Scrapy's ``DownloaderAwarePriorityQueue`` with ``CONCURRENT_REQUESTS_PER_IP``.

    Scrapy's queue raises a bare ``ValueError`` when the scheduler opens;
    this says, earlier, what to set instead. Meant for the downloader's
    ``__init__`` (the engine builds the downloader before the scheduler).
    """
    per_ip = per_ip_limit(settings)
    if not per_ip:
        return
    if uses_throttling_scheduler(settings):
        return  # it swaps Scrapy's queues for its own
    queue = _loaded(settings.get("SCHEDULER_PRIORITY_QUEUE"))
    if isinstance(queue, type) and issubclass(queue, DownloaderAwarePriorityQueue):
        if settings.getpriority("SCHEDULER_PRIORITY_QUEUE") == SETTINGS_PRIORITIES["default"]:
            # Nobody chose Scrapy's queue; it is only the default, and it would
            # refuse to open. Ours balances slots the same way and knows IP scopes.
            _use_throttling_queue(settings)
            logger.info(
                "slotkit: CONCURRENT_REQUESTS_PER_IP = %s; using SCHEDULER_PRIORITY_QUEUE = %r "
                "(Scrapy's default queue does not support per-IP limits)",
                per_ip,
                PRIORITY_QUEUE_PATH,
            )
            return
        raise SettingsError(
            f"SCHEDULER_PRIORITY_QUEUE = '{queue.__module__}.{queue.__qualname__}' (Scrapy's "
            f"default) does not support CONCURRENT_REQUESTS_PER_IP (got {per_ip}). With slotkit, "
            f"per-IP limits are ordinary throttling scopes: set SCHEDULER_PRIORITY_QUEUE = "
            f"{PRIORITY_QUEUE_PATH!r}, which balances slots the same way and supports them "
            "(or enable ADDONS = {'slotkit.Addon': 0}, or set CONCURRENT_REQUESTS_PER_IP = 0)."
        )


def uses_throttling_scheduler(settings: BaseSettings) -> bool:
    """Whether ``SCHEDULER`` is :class:`ThrottlingAwareScheduler` or a subclass."""
    scheduler = _loaded(settings.get("SCHEDULER"))
    # Not issubclass(): Scrapy's scheduler metaclass makes every scheduler pass it.
    return isinstance(scheduler, type) and ThrottlingAwareScheduler in scheduler.__mro__


def _use_throttling_queue(settings: BaseSettings) -> None:
    """Set slotkit's priority queue, at default priority, even in frozen settings.

    The engine builds the downloader before the scheduler reads this
    setting, and a crawler's settings are frozen by then; unfreezing them
    for one default-priority value is the only way to pick the queue here.
    """
    frozen = settings.frozen
    settings.frozen = False
    try:
        settings.set("SCHEDULER_PRIORITY_QUEUE", PRIORITY_QUEUE_PATH, priority="default")
    finally:
        settings.frozen = frozen


def _loaded(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return load_object(value)
        except (ImportError, NameError, ValueError):
            return None
    return value
