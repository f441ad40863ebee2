"""``slotkit.Downloader``: Scrapy's downloader with scopes instead of slots.

Drop-in for ``scrapy.core.downloader.Downloader``: the engine's calls
(``fetch``, ``needs_backout``, ``active``, ``close``), ``middleware``,
``handlers``, the three downloader signals in the same order, and a
``slots`` view are all kept. Only the waiting changed: a request passes the
:class:`~slotkit.gate.Gate` once every one of its scopes allows it.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary, WeakSet

from scrapy import signals
from scrapy.core.downloader.handlers import DownloadHandlers
from scrapy.core.downloader.middleware import DownloaderMiddlewareManager
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.job import job_dir
from scrapy.utils.misc import build_from_crawler
from twisted.internet.defer import CancelledError, Deferred

from slotkit.awaitables import needs_await, resolved
from slotkit.clock import default_clock
from slotkit.closing import REQUEUED, SpiderClosing, requeued, restore_filtering
from slotkit.dns import AddressLookups
from slotkit.feedback import Feedback, current_request
from slotkit.gate import Gate, GateClosedError, Waiter
from slotkit.manager import (
    AUTO_SLOT,
    DOWNLOAD_SLOT,
    ThrottlingManager,
    build_manager,
)
from slotkit.migration import silence_autothrottle
from slotkit.outcomes import cut_by_cancel
from slotkit.persistence import ScopeStateStore
from slotkit.registry import Scope, ScopeRegistry
from slotkit.resend import Resender
from slotkit.robots import CrawlDelays
from slotkit.scheduler import check_priority_queue
from slotkit.scope_control import ScopeControl
from slotkit.scope_managers import check_scope_managers
from slotkit.setting_names import warn_unknown_setting_names
from slotkit.settings import DOMAIN, ThrottlingSettings
from slotkit.signaling import send_if_heard
from slotkit.slots import SlotsView, SlotView, view_of
from slotkit.stats import ThrottlingStats
from slotkit.status import StatusReporter
from slotkit.validation import finite_seconds

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.interfaces import IReactorTime


logger = logging.getLogger("slotkit")

__all__ = ["Downloader"]


class Downloader(ScopeControl, SpiderClosing):
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
        self._kind_hints: dict[str, str] = dict.fromkeys(self.config.slots, DOMAIN)
        self._site_scope_joins: dict[tuple[str, str], bool] = {}
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

        def _left(result: Any) -> Any:
            self.active.discard(request)
            return result

        return dfd.addBoth(_left)

    def needs_backout(self) -> bool:
        """True when ``CONCURRENT_REQUESTS`` requests are already in the downloader (0: no cap)."""
        return 0 < self.total_concurrency <= len(self.active)

    def close(self) -> None:
        """Fail what still waits at the gate, cancel every timer, save states to JOBDIR."""
        reason = f"the spider closed ({self._closing_reason})" if self._closing_reason else None
        self._save_states()
        self.gate.close(list(self.registry.values()), reason or "the downloader closed")
        if self._lookups is not None:
            self._lookups.close()  # after the gate: what it releases must meet it closed
        self.status.stop()
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
        them in one sub-queue.
        """
        scopes = self.known_scopes(request)
        if scopes and self.crawl_delays is not None:
            found = self.crawl_delays.site_delay(request)
            if found is not None and found[0] in scopes:
                return found[0]
        return next(iter(scopes)) if scopes else self.get_slot_key(request)

    def _get_slot(self, request: Request, spider: Spider | None = None) -> tuple[str, SlotView]:
        key = self.get_slot_key(request)
        return key, view_of(self.registry.get(key), self.gate)

    # The path of one request

    async def _download(self, request: Request) -> Response | Request:
        """The download function given to the middlewares.

        1. Find the request's scopes. 2. Wait at the gate until all allow it.
        3. Download. 4. Feed the outcome back to the scopes (backoff, hints).
        5. If the response was a rate-limit signal, send the request again
           after the backoff instead of handing the response on (see
           :mod:`slotkit.resend`). The signals match the stock downloader's:
           reached once, downloaded per transfer, left once.
        """
        if self._lookups is not None:
            # CONCURRENT_REQUESTS_PER_IP: know the address before the first
            # request to a host goes, not once its connection filled the cache.
            lookup = self._lookups.lookup_for(request)
            if lookup is not None:
                await maybe_deferred_to_future(lookup)
        if self._default_get_scopes:
            # The stock manager's answer needs neither its awaitable wrapper nor a check.
            raw = self.manager._default_scopes(request)
        else:
            raw = self._get_scopes(request)
            if needs_await(raw):  # the common, synchronous case skips a coroutine
                raw = await resolved(raw)
        scopes_amounts = self._normalized_scopes(request, raw)
        scopes = self.registry.scopes_for(scopes_amounts)
        # A request that names no amount spends one unit of each quota, for
        # every scope manager alike (the spec's example counts ``amount or 0``).
        amounts: list[float | None] = [
            1.0 if amount is None else amount for amount in scopes_amounts.values()
        ]
        meta = request.meta
        if scopes and meta.get(DOWNLOAD_SLOT, meta.get(AUTO_SLOT)) == meta.get(AUTO_SLOT):
            meta[DOWNLOAD_SLOT] = meta[AUTO_SLOT] = scopes[0].id
        self._scope_ids[request] = scopes_amounts
        send_if_heard(
            self.signals,
            signals.request_reached_downloader,
            request=request,
            spider=self.crawler.spider,
        )
        arrived = self._clock.seconds()
        # When the first rate-limit signal came (BACKOFF_RESEND_TIMEOUT runs from it).
        limited_since: float | None = None
        delay = _request_delay(request)
        try:
            while True:
                try:
                    ticket = await self._acquire(
                        request, scopes, amounts, delay, None if limited_since is None else arrived
                    )
                except GateClosedError:
                    # Each request the close cut off ends here once: at the gate,
                    # arriving after (a lookup released), or waiting for a shared store.
                    self.stats.inc("requests_unsent_at_close")
                    # A copy handed back at close that came straight back was an
                    # engine.download() request (its caller follows a Request
                    # result itself): handed back again it would loop forever.
                    if not self._requeue_at_close or REQUEUED in request.meta:
                        raise
                    # A paused JOBDIR crawl: the engine schedules a Request
                    # result again (as it does a redirect), so the resumed
                    # crawl sends it and no errback hears of a failure.
                    self.stats.inc("requests_requeued")
                    return requeued(request)
                delay = 0.0
                response, signal = await self._transfer(request, ticket)
                if not signal:
                    self.resender.recovered(scopes)
                    return response
                if limited_since is None:
                    limited_since = self._clock.seconds()
                if not self.resender.should_resend(request, response, scopes, limited_since):
                    return response
        finally:
            send_if_heard(
                self.signals,
                signals.request_left_downloader,
                request=request,
                spider=self.crawler.spider,
            )

    async def _acquire(
        self,
        request: Request,
        scopes: list[Scope],
        amounts: list[float | None],
        delay: float,
        arrived: float | None = None,
    ) -> Waiter:
        ticket = None if delay else self.gate.try_acquire(request, scopes, amounts)
        if ticket is not None:
            return ticket
        entered = self._clock.seconds()
        waiting = self.gate.acquire(request, scopes, amounts, request.priority, delay, arrived)
        self.stats.waiting(len(self.gate.waiting))
        if self.config.debug:
            logger.debug("slotkit: %s waits for %s", request, [repr(s) for s in scopes])
        ticket = await maybe_deferred_to_future(waiting)
        self.stats.waited(self._clock.seconds() - entered)
        return ticket

    async def _transfer(self, request: Request, ticket: Waiter) -> tuple[Response, bool]:
        """One transfer; returns the response and whether it was a rate-limit signal.

        The outcome is applied to the scopes *before* the ticket is released,
        so no waiter slips through between the release and the backoff.
        """
        try:
            # Inside: a scope manager's record_started that raises must not
            # leak the ticket (its scopes would stay full for good).
            self.gate.started(ticket)
            try:
                response: Response = await self.handlers.download_request_async(request)
            except Exception as exc:
                if cut_by_cancel(exc):
                    # The caller cancelled the fetch (plain Twisted reactor: it
                    # arrives as a failed response). That says nothing about
                    # the site, and a retry would undo the cancel.
                    raise CancelledError(f"the download of {request} was cancelled") from exc
                backoff = await resolved(self.manager.get_exception_backoff(request, exc))
                self.backoff.apply(ticket, backoff, reason=type(exc).__name__)
                raise
            if response.request is None:
                # The engine sets this later anyway; managers judging the
                # response (get_response_backoff) need it now.
                response.request = request
            send_if_heard(
                self.signals,
                signals.response_downloaded,
                response=response,
                request=request,
                spider=self.crawler.spider,
            )
            token = current_request.set(request)
            try:
                backoff = self.manager.get_response_backoff(response)
                if needs_await(backoff):
                    backoff = await resolved(backoff)
            finally:
                current_request.reset(token)
            self.backoff.apply(ticket, backoff, reason=str(response.status))
            return response, self.backoff.is_signal(response, backoff)
        finally:
            self.gate.release(ticket)

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
            scope_wait = scope.manager.can_send(now, 1.0 if amount is None else amount)
            if scope.live_waiters and scope_wait <= 0:
                scope_wait = math.inf  # others queue ahead; a release will tell
            wait = max(wait, scope_wait)
        return wait

    def _dispatched(self, waiter: Waiter, now: float) -> None:
        if self.config.debug:
            logger.debug("slotkit: dispatch %s", waiter.request)
            self._log_recoveries(waiter.scopes)


def _request_delay(request: Request) -> float:
    """The ``throttling_delay`` meta of *request*, applied once per request."""
    meta = request.meta
    value = meta.get("throttling_delay")
    if not value or meta.get("_slotkit_delayed"):
        return 0.0
    meta["_slotkit_delayed"] = True
    # An infinite delay would keep the crawl open forever. Text is refused
    # even when it reads as a number, as delay_scope() refuses it: "1" in a
    # meta dict is more likely a bug upstream than a choice.
    text = isinstance(value, (str, bytes))
    seconds = None if text else finite_seconds(value)
    if seconds is None:
        logger.warning(
            "Ignoring throttling_delay=%r of %s: expected a finite number of seconds >= 0%s",
            value,
            request,
            ", not text" if text else "",
        )
        return 0.0
    return seconds
