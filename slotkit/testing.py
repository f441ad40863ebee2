"""Test and benchmark helpers for slotkit.

The main piece is :class:`InMemoryDownloadHandler`, a Scrapy download handler
that never opens a socket. It answers every request with a tiny HTML page
(or with the status, body and latency asked for in the request meta) and
writes down *when* the downloader handed each request over, so tests and
benchmarks can check concurrency limits and delays without a web server.

Enable it for plain and secure HTTP::

    DOWNLOAD_HANDLERS = {
        "http": "slotkit.testing.InMemoryDownloadHandler",
        "https": "slotkit.testing.InMemoryDownloadHandler",
    }

Scrapy builds one handler object per URL scheme, so the two entries above
produce two objects. Both write to a single :class:`InMemoryRecorder` that
belongs to the crawler; fetch it with :func:`get_recorder` (or read
``handler.recorder`` / ``handler.log`` on either object).

Per-request knobs (all optional), read from :attr:`Request.meta
<scrapy.Request.meta>`:

``inmemory_status`` (int)
    HTTP status of the fake response. Default: the ``INMEMORY_STATUS``
    setting, itself 200 by default.
``inmemory_latency`` (float, seconds)
    How long the fake transfer lasts before the response is returned. The
    wait goes through the event loop (never blocks the thread). Default: the
    ``INMEMORY_LATENCY`` setting, itself 0 (answer at once).
``inmemory_body`` (bytes or str)
    Body of the fake response. Default: a small HTML page naming the URL.

If the latency is longer than the request's ``download_timeout`` meta key
(set by Scrapy's ``DownloadTimeoutMiddleware``), the handler waits for the
timeout only and then raises :exc:`scrapy.exceptions.DownloadTimeoutError`,
like a real handler would.
"""

from __future__ import annotations

import asyncio
import html
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast, runtime_checkable
from weakref import WeakKeyDictionary

from scrapy.exceptions import DownloadTimeoutError
from scrapy.http import HtmlResponse
from scrapy.utils.asyncio import sleep as _scrapy_sleep
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.reactor import is_reactor_installed
from twisted.internet.task import deferLater

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = [
    "META_BODY",
    "META_LATENCY",
    "META_STATUS",
    "Clock",
    "Dispatch",
    "InMemoryDownloadHandler",
    "InMemoryRecorder",
    "get_recorder",
]

META_STATUS = "inmemory_status"
"""Request meta key: HTTP status of the fake response."""
META_LATENCY = "inmemory_latency"
"""Request meta key: simulated transfer time, in seconds."""
META_BODY = "inmemory_body"
"""Request meta key: body of the fake response (bytes or str)."""


@runtime_checkable
class Clock(Protocol):
    """Anything with a ``seconds()`` method returning the current time.

    Twisted reactors and :class:`twisted.internet.task.Clock` qualify. If the
    object also has ``callLater()`` (i.e. it is a full ``IReactorTime``),
    simulated latencies are scheduled on it too, so a fake clock can drive
    them in unit tests.
    """

    def seconds(self) -> float:
        """Return the current time in seconds."""


class _LoopClock:
    """Clock reading the running asyncio event loop.

    Used when Scrapy runs without a Twisted reactor
    (``TWISTED_REACTOR_ENABLED = False``), where importing
    ``twisted.internet.reactor`` is not allowed.
    """

    def seconds(self) -> float:
        return asyncio.get_event_loop().time()


def _default_clock() -> Clock:
    """Return the installed reactor, or a loop-based clock if there is none."""
    if is_reactor_installed():
        from twisted.internet import reactor

        return cast("Clock", reactor)
    return _LoopClock()


class Dispatch(NamedTuple):
    """One request handed to the handler by the downloader."""

    host: str
    """Host name of the request URL (``""`` if the URL has none)."""
    time: float
    """Clock reading, in seconds, when the handler received the request."""


@dataclass
class InMemoryRecorder:
    """What the in-memory handlers of one crawler have seen.

    Shared by every :class:`InMemoryDownloadHandler` of the same crawler.
    """

    log: list[Dispatch] = field(default_factory=list)
    """Every dispatch, in the order received."""
    in_flight: dict[str, int] = field(default_factory=dict)
    """Number of requests being "downloaded" right now, per host."""
    peak_in_flight: dict[str, int] = field(default_factory=dict)
    """Highest value :attr:`in_flight` reached, per host."""
    total_in_flight: int = 0
    """Number of requests being "downloaded" right now, all hosts together."""
    peak_total_in_flight: int = 0
    """Highest value :attr:`total_in_flight` reached."""

    def times(self, host: str | None = None) -> list[float]:
        """Return the dispatch times, optionally only those for *host*."""
        return [d.time for d in self.log if host is None or d.host == host]

    def gaps(self, host: str | None = None) -> list[float]:
        """Return the intervals between consecutive dispatches (to *host*)."""
        times = self.times(host)
        return [b - a for a, b in itertools.pairwise(times)]

    def clear(self) -> None:
        """Forget everything recorded so far (requests in flight stay counted)."""
        self.log.clear()
        self.peak_in_flight = dict(self.in_flight)
        self.peak_total_in_flight = self.total_in_flight

    def begin(self, host: str, now: float) -> None:
        """Note that a request to *host* was dispatched at time *now*."""
        self.log.append(Dispatch(host, now))
        count = self.in_flight.get(host, 0) + 1
        self.in_flight[host] = count
        if count > self.peak_in_flight.get(host, 0):
            self.peak_in_flight[host] = count
        self.total_in_flight += 1
        self.peak_total_in_flight = max(self.peak_total_in_flight, self.total_in_flight)

    def end(self, host: str) -> None:
        """Note that a request to *host* finished (or failed)."""
        count = self.in_flight[host] - 1
        if count:
            self.in_flight[host] = count
        else:
            del self.in_flight[host]
        self.total_in_flight -= 1


_recorders: WeakKeyDictionary[Crawler, InMemoryRecorder] = WeakKeyDictionary()


def get_recorder(crawler: Crawler) -> InMemoryRecorder:
    """Return the recorder shared by the in-memory handlers of *crawler*.

    It is created on first use, so calling this before the crawl starts is
    fine.
    """
    recorder = _recorders.get(crawler)
    if recorder is None:
        recorder = _recorders[crawler] = InMemoryRecorder()
    return recorder


_DEFAULT_BODY = b"<!DOCTYPE html><html><head><title>ok</title></head><body>%s</body></html>"


class InMemoryDownloadHandler:
    """Download handler that fakes every download without any I/O.

    See the module documentation for the meta keys and settings it reads.

    :param crawler: crawler whose recorder and settings to use; without
        one, the handler keeps a private recorder and uses the defaults.
    :param clock: time source for the dispatch log (and, if it has
        ``callLater()``, for latencies). Defaults to the installed Twisted
        reactor, or to the running asyncio loop when there is no reactor.
    """

    lazy: bool = False
    """Built when the crawl starts rather than on the first request, so the
    recorder exists before anything is downloaded."""

    def __init__(
        self,
        crawler: Crawler | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._clock: Clock = clock if clock is not None else _default_clock()
        if crawler is not None:
            self.recorder: InMemoryRecorder = get_recorder(crawler)
            settings = crawler.settings
            self.default_status: int = settings.getint("INMEMORY_STATUS", 200)
            self.default_latency: float = settings.getfloat("INMEMORY_LATENCY", 0.0)
        else:
            self.recorder = InMemoryRecorder()
            self.default_status = 200
            self.default_latency = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> InMemoryDownloadHandler:
        """Build a handler bound to *crawler* (Scrapy calls this)."""
        return cls(crawler)

    @property
    def clock(self) -> Clock:
        """The time source used for the dispatch log."""
        return self._clock

    @property
    def log(self) -> list[Dispatch]:
        """Shortcut for ``self.recorder.log``: ``(host, time)`` per dispatch."""
        return self.recorder.log

    async def download_request(self, request: Request) -> Response:
        """Record the dispatch, wait for the simulated latency, and answer."""
        host = urlparse_cached(request).hostname or ""
        meta = request.meta
        self.recorder.begin(host, self._clock.seconds())
        try:
            latency = float(meta.get(META_LATENCY, self.default_latency))
            timeout = meta.get("download_timeout")
            if timeout and latency > timeout:
                await self._wait(float(timeout))
                msg = f"{request.url} took longer than {timeout} seconds (simulated)."
                raise DownloadTimeoutError(msg)
            if latency > 0:
                await self._wait(latency)
            return self._build_response(request)
        finally:
            self.recorder.end(host)

    def _build_response(self, request: Request) -> HtmlResponse:
        status = int(request.meta.get(META_STATUS, self.default_status))
        body: bytes | str | None = request.meta.get(META_BODY)
        if body is None:
            body = _DEFAULT_BODY % html.escape(request.url).encode("utf-8", "replace")
        elif isinstance(body, str):
            body = body.encode("utf-8")
        return HtmlResponse(
            url=request.url,
            status=status,
            headers={"Content-Type": "text/html; charset=utf-8"},
            body=body,
            encoding="utf-8",
            request=request,
        )

    async def _wait(self, seconds: float) -> None:
        """Let *seconds* pass without blocking the event loop."""
        if hasattr(self._clock, "callLater"):
            clock: Any = self._clock
            await maybe_deferred_to_future(deferLater(clock, seconds))
        else:
            await _scrapy_sleep(seconds)

    async def close(self) -> None:
        """Nothing to release; present because Scrapy expects it."""
