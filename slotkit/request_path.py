"""The path of one request through the downloader: scopes, gate, transfer, feedback.

:class:`RequestPath` is a base of :class:`slotkit.Downloader`, like
:class:`~slotkit.scope_control.ScopeControl` and
:class:`~slotkit.closing.SpiderClosing`. ``Downloader.fetch`` hands its
``_download`` to the downloader middlewares: it finds the request's scopes,
waits at the :class:`~slotkit.gate.Gate` (``_acquire``), downloads and feeds
the outcome back to the scopes (``_transfer``), and sends the request again
after a rate-limit signal (:mod:`slotkit.resend`).

A base class rather than a helper object: subclasses (the shared
downloader, :mod:`slotkit.shared.downloader`) override ``_acquire`` and
``_transfer`` and call them with ``super()``, and the path uses most of the
downloader's parts; a helper would need the downloader handed back to it
for both.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import CancelledError

from slotkit.awaitables import needs_await, resolved
from slotkit.closing import REQUEUED, can_be_saved, requeued
from slotkit.feedback import current_request
from slotkit.gate import GateClosedError
from slotkit.handover import take
from slotkit.manager import AUTO_SLOT, DOWNLOAD_SLOT
from slotkit.meta_keys import MetaKeyCheck
from slotkit.outcomes import as_backoff, cut_by_cancel
from slotkit.redirect_wait import note_redirect_wait, redirect_wait
from slotkit.request_delay import request_delay_left
from slotkit.signaling import send_if_heard

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from weakref import WeakKeyDictionary, WeakSet

    from scrapy import Request
    from scrapy.core.downloader.handlers import DownloadHandlers
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.signalmanager import SignalManager
    from twisted.internet.interfaces import IReactorTime

    from slotkit.crowding import CrowdingWatch
    from slotkit.dns import AddressLookups
    from slotkit.feedback import Feedback
    from slotkit.gate import Gate, Waiter
    from slotkit.registry import Scope, ScopeRegistry
    from slotkit.resend import Resender
    from slotkit.settings import ThrottlingSettings
    from slotkit.stats import ThrottlingStats

logger = logging.getLogger("slotkit")

__all__ = ["ABSENT", "RequestPath"]

#: A meta key that was not there (see ``Downloader.fetch``, which puts it back).
ABSENT = object()

#: Re-sends in a row that went out quickly (see QUICK_RESEND), after which a
#: request's next rate-limited answer is handed on rather than re-sent.
UNHELD_RESENDS = 3
#: A re-send that waited less than this, in seconds, was not really held back:
#: not by a backoff step (BACKOFF_MIN_DELAY), nor by a server's wait worth
#: the name (a reset of 10 ms), nor by a moment's wait for a concurrency place.
QUICK_RESEND = 0.1


class RequestPath:
    """``_download``, ``_acquire`` and ``_transfer`` of the Downloader (a base of it)."""

    # Set up by the Downloader's __init__.
    crawler: Crawler
    signals: SignalManager
    config: ThrottlingSettings
    _clock: IReactorTime
    handlers: DownloadHandlers
    manager: Any
    registry: ScopeRegistry
    gate: Gate
    stats: ThrottlingStats
    backoff: Feedback
    resender: Resender
    _lookups: AddressLookups | None
    _scope_ids: WeakKeyDictionary[Request, dict[str, float | None]]
    _resending: WeakSet[Request]
    _crowding: CrowdingWatch | None
    _meta_keys: MetaKeyCheck
    _lent_dont_retry: WeakKeyDictionary[Request, object]
    _cancelled: WeakSet[Request]
    _default_get_scopes: bool
    _get_scopes: Callable[[Request], Any]
    _requeue_at_close: bool

    if TYPE_CHECKING:
        # ScopeControl's, another base of the Downloader.

        def _normalized_scopes(self, request: Request, raw: Any) -> dict[str, float | None]: ...

        def _log_recoveries(self, scopes: Sequence[Scope]) -> None: ...

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
        self._meta_keys.check(request.meta)
        # When the first rate-limit signal came (BACKOFF_RESEND_TIMEOUT runs from it).
        limited_since: float | None = None
        # Re-sends in a row that went out quickly (see UNHELD_RESENDS).
        unheld = 0
        asked = 0.0
        #: The rate-limited answer this request waits to replace (None: not sent yet),
        #: and the same while Scrapy's downloader stats have not counted it.
        answered: Response | None = None
        uncounted: Response | None = None
        redirect = redirect_wait(request, arrived, self.config.redirect_max_delay)
        if redirect:
            self.stats.inc("redirect_waits")
        delay = max(request_delay_left(request, self._clock.seconds()), redirect)
        try:
            while True:
                try:
                    asked = self._clock.seconds()
                    ticket = await self._acquire(
                        request, scopes, amounts, delay, None if limited_since is None else arrived
                    )
                except GateClosedError:
                    # Each request the close cut off ends here once: at the gate,
                    # arriving after (a lookup released), or waiting for a shared store.
                    # A copy handed back at close that came straight back was an
                    # engine.download() request (its caller follows a Request
                    # result itself): handed back again it would loop forever.
                    # One the job directory cannot store would be lost in the
                    # scheduler's memory queue: it ends as without JOBDIR.
                    came_back = self._requeue_at_close and REQUEUED in request.meta
                    requeue = (
                        self._requeue_at_close
                        and not came_back
                        and can_be_saved(request, self.crawler)
                    )
                    if answered is not None and not requeue:
                        # It went and was answered "later": that answer goes on,
                        # rather than a failure saying it never went. Not to
                        # RetryMiddleware (a retry scheduled while the spider
                        # closes is dropped unheard) but on to HttpError and
                        # the spider; fetch() gives the flag back after that.
                        self._lent_dont_retry[request] = request.meta.get("dont_retry", ABSENT)
                        request.meta["dont_retry"] = True
                        self.stats.inc("backoff/handed_on_at_close")
                        uncounted = None  # the middlewares count it on its way out
                        return answered
                    if came_back:
                        # Counted when it was handed back: it was not requeued after all.
                        self.stats.inc("requests_requeued", -1)
                    elif answered is None:
                        self.stats.inc("requests_unsent_at_close")
                    if not requeue:
                        raise
                    if answered is None:
                        # Counted by Scrapy's stats on its way in; the resumed crawl counts it.
                        self.resender.uncount_unsent(request)
                    # A paused JOBDIR crawl: the engine schedules a Request
                    # result again (as it does a redirect), so the resumed
                    # crawl sends it and no errback hears of a failure.
                    self.stats.inc("requests_requeued")
                    return requeued(request)
                delay = 0.0
                if uncounted is not None:
                    # Only now is the answered attempt replaced: counted with
                    # the attempt that replaces it (handed on at close, the
                    # middlewares count it once themselves).
                    self.resender.count_answer(request, uncounted, resent=True)
                    uncounted = None
                response, signal = await self._transfer(request, ticket)
                if not signal:
                    self.resender.recovered(scopes)
                    return response
                if limited_since is None:
                    limited_since = self._clock.seconds()
                quick = ticket.left_at - asked < QUICK_RESEND
                unheld = unheld + 1 if answered is not None and quick else 0
                if unheld >= UNHELD_RESENDS:
                    # Its last re-sends went out quickly: nothing in its scopes
                    # slows down on a signal (a custom manager that takes no
                    # backoff; a server's reset of 10 ms). Re-sent again and
                    # again it would loop at the server's pace (probes: 1,757
                    # requests in 3 s for one page; 2,569 for two pages taking
                    # turns at one concurrency place); RetryMiddleware's limits
                    # decide instead. One or two are normal: a rampup scope's
                    # 429 within its target, the slow answer of a burst that
                    # already took its step.
                    self.resender.unheld(request, response, scopes)
                    return response
                if not self.resender.should_resend(request, response, scopes, limited_since):
                    return response
                answered = uncounted = response
                self._resending.add(request)
                if self._crowding is not None:
                    self._crowding.soon()
        finally:
            self._resending.discard(request)
            if uncounted is not None:
                # It went and was answered, and no re-send replaced it (requeued
                # at a pause, the wait cancelled): Scrapy's stats still count it.
                self.resender.count_answer(request, uncounted, resent=False)
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
        # A cancel between the gate's admission and this coroutine resuming
        # gives the ticket (and its scopes' slots) back.
        ticket = await take(waiting, self.gate.release)
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
                if request in self._cancelled and cut_by_cancel(exc):
                    # The caller cancelled the fetch (plain Twisted reactor: it
                    # arrives as a failed response). That says nothing about
                    # the site, and a retry would undo the cancel. (A handler
                    # cancelling on its own timeout fails as it says, as stock.)
                    raise CancelledError(f"the download of {request} was cancelled") from exc
                said = await resolved(self.manager.get_exception_backoff(request, exc))
                backoff = as_backoff(said, "get_exception_backoff()")
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
                said = self.manager.get_response_backoff(response)
                if needs_await(said):
                    said = await resolved(said)
            finally:
                current_request.reset(token)
            backoff = as_backoff(said, "get_response_backoff()")
            note_redirect_wait(
                request, response, self._clock.seconds(), self.config.redirect_max_delay
            )
            self.backoff.apply(ticket, backoff, reason=str(response.status))
            return response, self.backoff.is_signal(response, backoff)
        finally:
            self.gate.release(ticket)

    def _dispatched(self, waiter: Waiter, now: float) -> None:
        if self.config.debug:
            logger.debug("slotkit: dispatch %s", waiter.request)
            self._log_recoveries(waiter.scopes)
