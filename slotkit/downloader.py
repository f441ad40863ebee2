"""``slotkit.Downloader``: Scrapy's downloader with scopes instead of slots.

Drop-in for ``scrapy.core.downloader.Downloader``: the engine's calls
(``fetch``, ``needs_backout``, ``active``, ``close``), ``middleware``,
``handlers``, the three downloader signals in the same order, and a
``slots`` view are all kept. Only the waiting changed: a request passes the
:class:`~slotkit.gate.Gate` once every one of its scopes allows it (the
path of one request is :mod:`slotkit.request_path`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary, WeakSet

from scrapy import signals
from scrapy.core.downloader.handlers import DownloadHandlers
from scrapy.core.downloader.middleware import DownloaderMiddlewareManager
from scrapy.utils.datatypes import LocalCache
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.job import job_dir
from scrapy.utils.misc import build_from_crawler
from twisted.internet.defer import Deferred

from slotkit.clock import default_clock
from slotkit.closing import REQUEUED, SpiderClosing, restore_filtering
from slotkit.crowding import CrowdingWatch
from slotkit.dns import AddressLookups, address_of
from slotkit.domains import registrable_domain
from slotkit.feedback import Feedback
from slotkit.gate import Gate
from slotkit.manager import (
    AUTO_SLOT,
    DOWNLOAD_SLOT,
    ThrottlingManager,
    build_manager,
)
from slotkit.meta_keys import MetaKeyCheck
from slotkit.migration import silence_autothrottle
from slotkit.persistence import ScopeStateStore
from slotkit.registry import Scope, ScopeRegistry
from slotkit.request_delay import request_delay_left
from slotkit.request_path import ABSENT, RequestPath
from slotkit.resend import Resender
from slotkit.robots import CrawlDelays
from slotkit.scheduler import check_priority_queue, uses_throttling_scheduler
from slotkit.scope_control import ScopeControl
from slotkit.scope_entries import forget_setting_warnings
from slotkit.scope_ids import netloc_keys
from slotkit.scope_managers import check_scope_managers
from slotkit.setting_names import warn_unknown_setting_names
from slotkit.settings import ThrottlingSettings
from slotkit.slots import SlotsView, SlotView, view_of
from slotkit.stats import ThrottlingStats
from slotkit.status import StatusReporter

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.interfaces import IReactorTime

__all__ = ["Downloader"]

logger = logging.getLogger("slotkit")

#: Scope kinds remembered for ids a request said are sites (see ScopeControl._kind_of).
KIND_HINTS_KEPT = 100_000


#: Between the scopes in the sub-queue key of a request of several (see queue_key).
SCOPES_JOINED = " & "


class Downloader(ScopeControl, SpiderClosing, RequestPath):
    """The Scrapy ``DOWNLOADER`` that throttles by scopes."""

    DOWNLOAD_SLOT = DOWNLOAD_SLOT

    def __new__(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Downloader:
        # Shared throttling (slotkit.shared, docs/shared.rst): THROTTLING_REDIS_URL
        # turns slotkit.Downloader into its Redis-backed subclass.
        if cls is Downloader and crawler.settings.get("THROTTLING_REDIS_URL"):
            from slotkit.shared.downloader import SharedDownloader

            cls = SharedDownloader
        return super().__new__(cls)

    def __init__(self, crawler: Crawler, clock: IReactorTime | None = None) -> None:
        self.crawler = crawler
        self.settings = crawler.settings
        self.signals = crawler.signals
        # 1. Validate everything first: a bad setting must fail before any I/O is set up.
        forget_setting_warnings()
        self.config = ThrottlingSettings.from_settings(crawler.settings)
        warn_unknown_setting_names(crawler.settings)
        check_scope_managers(self.config)
        check_priority_queue(crawler.settings)
        self.manager = build_manager(crawler, self.config.manager)
        if hasattr(self.manager, "attach"):
            self.manager.attach(self)
        crawler.throttler = self.manager  # type: ignore[attr-defined]
        if self.config.autothrottle is not None:
            silence_autothrottle(crawler)
        # 2. Then the Scrapy parts, as the stock downloader builds them.
        self._clock = clock if clock is not None else default_clock()
        self.active: set[Request] = set()
        self.handlers = DownloadHandlers(crawler)
        self.middleware = build_from_crawler(DownloaderMiddlewareManager, crawler)
        self.total_concurrency = self.config.total_concurrency
        self.domain_concurrency = self.config.domain_concurrency
        self.ip_concurrency = self.config.ip_concurrency
        self._lookups = (
            AddressLookups.for_crawl(self._clock, crawler.settings) if self.ip_concurrency else None
        )
        self._default_delay: float | None = None
        #: Scope id -> kind, for ids a request said are sites (see _kind_of);
        #: the oldest go first past KIND_HINTS_KEPT (a broad crawl's download_slot
        #: values would grow it for good).
        self._kind_hints: LocalCache[str, str] = LocalCache(KIND_HINTS_KEPT)
        #: (first scope, site) -> whether the site's Crawl-delay scope joins; a
        #: cache, worked out again for an entry dropped.
        self._site_scope_joins: LocalCache[tuple[str, str], bool] = LocalCache(10_000)
        self.stats = ThrottlingStats(crawler.stats, self.config.warn_threshold)
        self.gate = Gate(self._clock, on_dispatch=self._dispatched)
        self.registry = ScopeRegistry(
            self._new_scope,
            self._clock,
            limit=self.config.scope_limit,
            max_idle=self.config.scope_max_idle,
            on_evict=self._evicted,
        )
        self.slots = SlotsView(self.registry, self.gate)
        self.status = StatusReporter.attach(self)
        self.crawl_delays = (
            CrawlDelays(crawler, self.config.robots_max_delay, self._crawl_delay_found)
            if self.config.robots_obey
            else None
        )
        self.backoff = Feedback(self.config, self.registry, self.gate, self._clock, self.stats)
        self.resender = Resender(
            self._clock,
            self.stats,
            enabled=self.config.resend,
            timeout=self.config.resend_timeout,
            middlewares=self.middleware.middlewares,
            retry_enabled=self.settings.getbool("RETRY_ENABLED", True),
        )
        #: Each request's scopes on its last trip, id -> the amount it named (or None).
        self._scope_ids: WeakKeyDictionary[Request, dict[str, float | None]] = WeakKeyDictionary()
        #: Requests answered with a rate-limit signal, waiting to be sent again.
        self._resending: WeakSet[Request] = WeakSet()
        #: Requests handed on at close with ``dont_retry`` set: their own value.
        self._lent_dont_retry: WeakKeyDictionary[Request, object] = WeakKeyDictionary()
        #: Requests whose fetch was cancelled by its caller (see fetch).
        self._cancelled: WeakSet[Request] = WeakSet()
        #: Requests whose ``get_scopes`` must wait for something (see known_scopes).
        self._scopes_wait: WeakSet[Request] = WeakSet()
        jobdir = job_dir(self.settings)
        self._store = ScopeStateStore(jobdir, self._clock) if jobdir else None
        self._saved: dict[str, dict[str, float]] = {}
        if self._store is not None:
            self._saved, saved_delays = self._store.load()
            if self.crawl_delays is not None:
                self.crawl_delays.delays.update(saved_delays)
        self._closing_reason: str | None = None
        self._evicted_recoveries = 0
        self.signals.connect(self._engine_started, signal=signals.engine_started)
        self._get_scopes = self.manager.get_scopes
        # The stock manager's scopes can be computed without the awaitable wrapper.
        self._default_get_scopes = type(self.manager).get_scopes is ThrottlingManager.get_scopes
        #: THROTTLING_DEBUG only: recoveries already logged, per scope id.
        self._recoveries_seen: dict[str, int] = {}
        #: THROTTLING_DEBUG only: rampup's step count (and delay) last seen, per scope id.
        self._rampup_seen: dict[str, tuple[int, float]] = {}
        self._netloc_scopes = netloc_keys(crawler.settings)
        #: Says once per crawl which meta keys look misspelt.
        self._meta_keys = MetaKeyCheck()
        #: Scrapy's own scheduler only: says once when slowed sites fill every place.
        self._crowding = (
            None
            if uses_throttling_scheduler(crawler.settings) or not self.total_concurrency
            else CrowdingWatch(
                self._clock,
                self.total_concurrency,
                self.active,
                self._live_scopes,
                self._resending,
            )
        )
        # Scrapy names no DOWNLOADER in its log: this line tells a user it is on.
        logger.info(
            "slotkit: %s throttles by scope (CONCURRENT_REQUESTS_PER_DOMAIN=%d, "
            "delay %g s%s, %s); `python -m slotkit explain <url>` shows a URL's limits",
            type(self).__name__,
            self.domain_concurrency,
            self.config.delay,
            "" if self.config.autothrottle is None else " from the AutoThrottle mapping",
            "slotkit's scheduler"
            if uses_throttling_scheduler(crawler.settings)
            else "Scrapy's scheduler",
        )

    @property
    def clock(self) -> IReactorTime:
        """The crawl's clock (the reactor, the asyncio loop, or a test's Clock)."""
        return self._clock

    # The default delay of new scopes; AutoThrottle writes it (AUTOTHROTTLE_START_DELAY).

    @property
    def _delay(self) -> float:
        return self.config.delay if self._default_delay is None else self._default_delay

    @_delay.setter
    def _delay(self, value: float) -> None:
        self._default_delay = float(value)

    # Engine API

    def fetch(self, request: Request, spider: Spider | None = None) -> Deferred[Response | Request]:
        """Download *request* through the middlewares and the gate; fires exactly once."""
        if REQUEUED in request.meta and not self._requeue_at_close:
            restore_filtering(request)  # back from a paused job's queue
        self.active.add(request)
        dfd: Deferred[Response | Request] = deferred_from_coro(
            # Scrapy types the download function as returning a Response; a
            # Request is handled too (see _download) and passed on unchanged.
            self.middleware.download_async(self._download, request)  # type: ignore[arg-type]
        )

        cancel = dfd.cancel

        def cancelled_by_caller() -> None:
            # On the plain Twisted reactor the cancel reaches the transfer as a
            # failed response, the same failure a handler's own cancel-based
            # timeout gives: only this mark tells the caller's cancel apart.
            # Not once it ended: the mark would outlive it, and a later fetch
            # of the same request would take its own timeout for a cancel.
            if not dfd.called:
                self._cancelled.add(request)
            cancel()

        dfd.cancel = cancelled_by_caller  # type: ignore[method-assign]

        def _left(result: Any) -> Any:
            self.active.discard(request)
            self._cancelled.discard(request)
            lent = self._lent_dont_retry.pop(request, None)
            if lent is not None:
                # Set for the middlewares at close (RequestPath._download): the
                # spider's request, maybe yielded again, keeps its own value.
                if lent is ABSENT:
                    request.meta.pop("dont_retry", None)
                else:
                    request.meta["dont_retry"] = lent
            return result

        return dfd.addBoth(_left)

    def needs_backout(self) -> bool:
        """True when ``CONCURRENT_REQUESTS`` requests are already in the downloader (0: no cap)."""
        full = 0 < self.total_concurrency <= len(self.active)
        if full and self._crowding is not None:
            self._crowding.check()
        return full

    def _live_scopes(self, request: Request) -> list[Scope]:
        """The live scopes *request* went through on its last trip."""
        peek = self.registry.peek
        return [scope for scope in map(peek, self._scope_ids.get(request, ())) if scope]

    def close(self) -> None:
        """Fail what still waits at the gate, cancel every timer, save states to JOBDIR."""
        reason = f"the spider closed ({self._closing_reason})" if self._closing_reason else None
        self._save_states()
        self.gate.close(list(self.registry.values()), reason or "the downloader closed")
        if self._lookups is not None:
            self._lookups.close()  # after the gate: what it releases must meet it closed
        self.status.stop()
        if self._crowding is not None:
            self._crowding.stop()
        self.stats.set("scopes_alive", len(self.slots))
        recoveries = self._evicted_recoveries + sum(
            int(getattr(scope.manager, "recoveries", 0)) for scope in self.registry.values()
        )
        if recoveries:
            self.stats.set("backoff/recoveries", recoveries)

    def throttling_status(self) -> str:
        """Scopes alive, backing off, requests waiting, and the slowest scopes."""
        return self.status.describe()

    # Slot compatibility

    def get_slot_key(self, request: Request) -> str:
        """The primary scope of *request*, as Scrapy's ``download_slot`` key."""
        scopes = self.known_scopes(request)
        if scopes:
            return next(iter(scopes))
        meta = request.meta
        slot = meta.get(DOWNLOAD_SLOT)
        if slot is not None and slot != meta.get(AUTO_SLOT):
            return str(slot)
        return urlparse_cached(request).hostname or ""

    def queue_key(self, request: Request) -> str:
        """The sub-queue of *request* in :class:`~slotkit.ThrottlingAwarePriorityQueue`.

        Its primary scope, unless a robots.txt Crawl-delay joined its site's
        scope to a group (see ``_add_site_scope``): then that site's own, so
        the site's paced requests do not hold the rest of the group behind
        them in one sub-queue. A request of several scopes gets a sub-queue
        of its own for that set (``"api & users"``): at the head of its first
        scope's, waiting on another scope, it held back every request that
        needed the first scope alone (a probe: none of 20 sent in 8 s). The
        address ``CONCURRENT_REQUESTS_PER_IP`` adds does not count, nor does
        the group a paced site joined: they follow the site.
        """
        scopes = self.known_scopes(request)
        if not scopes:
            return self.get_slot_key(request)
        first = next(iter(scopes))
        if len(scopes) == 1:
            return first
        # Scopes that follow from the site, as the first one does: they hold
        # all of a sub-queue's requests alike.
        derived = {address_of(request) if self.config.ip_concurrency else None}
        if self.crawl_delays is not None:
            found = self.crawl_delays.site_delay(request)
            if found is not None and found[0] in scopes and found[0] != first:
                if self._groups(request, first, found[0]):
                    derived.add(first)  # the group the paced site joined
                first = found[0]
        others = sorted(s for s in scopes if s != first and s not in derived)
        return SCOPES_JOINED.join([first, *others]) if others else first

    def _groups(self, request: Request, scope_id: str, site: str) -> bool:
        """Whether *scope_id* is the group *request*'s *site* belongs to (its
        registrable domain, its ``download_slot``), not a scope named for it."""
        if self.config.domain_grouping == "registrable_domain" and scope_id == registrable_domain(
            site
        ):
            return True
        meta = request.meta
        slot = meta.get(DOWNLOAD_SLOT)
        return slot is not None and slot != meta.get(AUTO_SLOT) and str(slot) == scope_id

    def delay_left(self, request: Request) -> float:
        """Seconds left of *request*'s ``throttling_delay`` (0.0: none, or over).

        The delay starts the first time it is asked about: here, when
        slotkit's priority queue takes the request in (it keeps the request
        queued meanwhile, so that it holds no ``CONCURRENT_REQUESTS`` place),
        or at the gate when another queue hands it over.
        """
        return request_delay_left(request, self._clock.seconds())

    def _get_slot(self, request: Request, spider: Spider | None = None) -> tuple[str, SlotView]:
        key = self.get_slot_key(request)
        return key, view_of(self.registry.get(key), self.gate)

    def time_until_ready(self, request: Request) -> float:
        """Seconds until every scope of *request* would let it through (for schedulers).

        ``0.0``: now. ``math.inf``: a scope is full and only a finished
        download can free it. Only sync ``get_scopes`` results (or the
        defaults) are considered; scopes not alive yet count as free. Creates
        no scope and changes no state.
        """
        scopes = self.known_scopes(request)
        if not scopes:
            scopes = {self.get_slot_key(request): None}
        now = self._clock.seconds()
        wait = 0.0
        for scope_id, amount in scopes.items():
            scope = self.registry.peek(scope_id)
            if scope is None:
                continue
            try:
                scope_wait = scope.manager.can_send(now, 1.0 if amount is None else amount)
            except Exception:
                # A scope manager's bug: the gate fails the request with the
                # error. Raised here, it came back at every engine pass and
                # the request never ended (a review).
                return 0.0
            if scope.live_waiters and scope_wait <= 0:
                scope_wait = math.inf  # others queue ahead; a release will tell
            wait = max(wait, scope_wait)
        return wait
