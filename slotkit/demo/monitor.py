"""Watching a slotkit crawl: scope samples on a timer, transfers from Scrapy's signals.

:class:`Monitor` reads only public state: the downloader's live scopes
(``crawler.engine.downloader.registry.values()``, snapshotted with
:func:`slotkit.status.scope_state`), its ``scope_ids(request)``, and the
``response_downloaded`` / ``response_received`` signals. It changes nothing.

``response_downloaded`` fires once per transfer, so it also sees the 429s
that slotkit answers by re-sending the request and never hands on;
``response_received`` fires for what reaches the spider.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.task import LoopingCall

from slotkit.status import ScopeState, scope_state

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.interfaces import IReactorTime

__all__ = ["CrawlTotals", "Monitor", "ScopeTimeline"]

#: Status codes the chart and the summary single out.
NOTED_STATUSES = (429, 503)


@dataclass
class ScopeTimeline:
    """Everything seen of one scope, with times in seconds since the monitor started."""

    id: str
    #: ``(t, state)`` every sampling interval while the scope was alive.
    samples: list[tuple[float, ScopeState]] = field(default_factory=list)
    #: When each transfer of the scope ended (sorted).
    transfers: list[float] = field(default_factory=list)
    #: ``(t, status)`` of the responses with a status in :data:`NOTED_STATUSES`.
    noted: list[tuple[float, int]] = field(default_factory=list)
    #: When the scope stepped its backoff up (seen between two samples).
    steps: list[float] = field(default_factory=list)
    #: ``(t, seconds)`` when a hard hold (Retry-After, RateLimit reset) started or grew.
    holds: list[tuple[float, float]] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    #: Responses that reached the spider, and those among them that were pages (200s).
    delivered: int = 0
    pages: int = 0

    @property
    def last(self) -> ScopeState | None:
        return self.samples[-1][1] if self.samples else None

    def rate(self, now: float, window: float = 1.0) -> float:
        """Transfers per second over the *window* seconds before *now*."""
        start = bisect.bisect_right(self.transfers, now - window)
        end = bisect.bisect_right(self.transfers, now)
        return (end - start) / window


@dataclass(frozen=True)
class CrawlTotals:
    """Crawl-wide numbers at one instant."""

    in_downloader: int
    at_gate: int
    in_scheduler: int
    transfers: int
    pages: int


class Monitor:
    """Samples a crawl's scopes every *interval* seconds and records its transfers."""

    def __init__(
        self,
        crawler: Crawler,
        clock: IReactorTime,
        interval: float = 0.25,
        order: Callable[[str], Any] | None = None,
    ) -> None:
        self.crawler = crawler
        self.clock = clock
        self.interval = interval
        self._order = order
        self.started: float | None = None
        self.timelines: dict[str, ScopeTimeline] = {}
        self._loop: LoopingCall | None = None
        crawler.signals.connect(self._engine_started, signal=signals.engine_started)
        crawler.signals.connect(self._response_downloaded, signal=signals.response_downloaded)
        crawler.signals.connect(self._response_received, signal=signals.response_received)
        crawler.signals.connect(self.stop, signal=signals.spider_closed)

    # Time

    def now(self) -> float:
        """Seconds since the crawl's engine started (0 before)."""
        if self.started is None:
            return 0.0
        return self.clock.seconds() - self.started

    # Lifecycle

    def _engine_started(self) -> None:
        self.started = self.clock.seconds()
        loop = LoopingCall(self.sample)
        loop.clock = self.clock
        self._loop = loop
        loop.start(self.interval, now=True)

    def stop(self) -> None:
        """Take a last sample and stop sampling."""
        loop, self._loop = self._loop, None
        if loop is not None and loop.running:
            self.sample()
            loop.stop()

    # Reading the crawl

    @property
    def downloader(self) -> Any:
        engine = getattr(self.crawler, "engine", None)
        return getattr(engine, "downloader", None)

    def _timeline(self, scope_id: str) -> ScopeTimeline:
        timeline = self.timelines.get(scope_id)
        if timeline is None:
            timeline = self.timelines[scope_id] = ScopeTimeline(scope_id)
            order = self._order
            if order is not None:
                ordered = sorted(self.timelines.items(), key=lambda item: order(item[0]))
                self.timelines = dict(ordered)
        return timeline

    def _scope_ids(self, request: Request) -> list[str]:
        downloader = self.downloader
        scope_ids = getattr(downloader, "scope_ids", None)
        ids = list(scope_ids(request)) if callable(scope_ids) else []
        return ids or [urlparse_cached(request).hostname or ""]

    def sample(self) -> None:
        """Snapshot every live scope now; note backoff steps and holds since the last sample."""
        downloader = self.downloader
        registry = getattr(downloader, "registry", None)
        if registry is None:
            return
        now = self.clock.seconds()
        t = self.now()
        for scope in registry.values():
            state = scope_state(scope, now)
            timeline = self._timeline(state.id)
            previous = timeline.last
            if previous is not None:
                if state.steps > previous.steps:
                    timeline.steps.append(t)
                # A hold that started, or was pushed further out, since the last sample.
                if state.hold_remaining > previous.hold_remaining + self.interval / 2:
                    timeline.holds.append((t, state.hold_remaining))
            elif state.hold_remaining > 0:
                timeline.holds.append((t, state.hold_remaining))
            elif state.steps:
                timeline.steps.append(t)
            timeline.samples.append((t, state))

    def _response_downloaded(self, response: Response, request: Request, spider: Any) -> None:
        t = self.now()
        for scope_id in self._scope_ids(request):
            timeline = self._timeline(scope_id)
            timeline.transfers.append(t)
            timeline.statuses[response.status] += 1
            if response.status in NOTED_STATUSES:
                timeline.noted.append((t, response.status))

    def _response_received(self, response: Response, request: Request, spider: Any) -> None:
        is_page = response.status == 200 and urlparse_cached(request).path != "/robots.txt"
        for scope_id in self._scope_ids(request):
            timeline = self._timeline(scope_id)
            timeline.delivered += 1
            timeline.pages += is_page

    def totals(self) -> CrawlTotals:
        downloader = self.downloader
        engine = getattr(self.crawler, "engine", None)
        scheduler = getattr(engine, "scheduler", None)
        try:
            queued = len(scheduler) if scheduler is not None else 0
        except TypeError:
            queued = 0
        gate = getattr(downloader, "gate", None)
        return CrawlTotals(
            in_downloader=len(getattr(downloader, "active", ())),
            at_gate=len(getattr(gate, "waiting", ())),
            in_scheduler=queued,
            transfers=sum(len(timeline.transfers) for timeline in self.timelines.values()),
            pages=sum(timeline.pages for timeline in self.timelines.values()),
        )
