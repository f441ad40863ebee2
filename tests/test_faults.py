"""Fault injection: real crawls on loopback where the network, the server or a handler misbehaves.

Every test checks the same two promises besides its own point:

1. Nothing is lost: every request the engine gives the downloader ends exactly
   once, as a response or as a failure that names its cause, and the spider
   hears of every request that ended (see :class:`Ledger`).
2. Nothing goes unhandled: no "Unhandled error in Deferred" and no stray
   traceback in the crawl log.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.http import Response
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web import server

from tests.crawl import (
    EPOLL_REACTOR,
    CrawlResult,
    ListSpider,
    run_crawl,
    run_crawl_subprocess_async,
)
from tests.server import MockSite, Reply, fail_first

pytestmark = pytest.mark.integration

SLOTKIT: dict[str, Any] = {
    "DOWNLOADER": "slotkit.Downloader",
    "DOWNLOAD_DELAY_JITTER": 0,
    "BACKOFF_JITTER": 0,
}
HOST, OTHER = "127.0.0.1", "127.0.0.2"
SHORT_TIMEOUT = 0.5  # download_timeout of requests to /hang
HOLD = 30.0  # a hold (Retry-After, DOWNLOAD_DELAY) far longer than any test may take
CLOSE_AFTER = 1  # CLOSESPIDER_TIMEOUT while such a hold is running
PROMPT = 5.0  # "the crawl ended promptly": well under HOLD, generous for a loaded machine


# ------------------------------------------------------------ bookkeeping


@dataclass
class Ledger:
    """Counts what the engine gives the downloader and how each of those fetches ends.

    Attached with ``run_crawl(..., on_crawler=ledger.attach)``; it wraps
    ``engine.downloader.fetch`` (and notes the gate's dispatches) once the
    spider is open.
    """

    given: list[Request] = field(default_factory=list)
    endings: dict[int, list[Any]] = field(default_factory=dict)
    #: ``(time, request)`` of every dispatch the gate made, on the crawl's clock.
    dispatches: list[tuple[float, Request]] = field(default_factory=list)
    downloader: Any = None

    def attach(self, crawler: Crawler) -> None:
        def opened(spider: Spider) -> None:
            assert crawler.engine is not None
            downloader: Any = crawler.engine.downloader  # slotkit's, not the stock type
            self.downloader = downloader
            fetch = downloader.fetch

            def counted(request: Request, spider: Spider | None = None) -> Deferred[Any]:
                self.given.append(request)
                self.endings[id(request)] = []
                dfd: Deferred[Any] = fetch(request)

                def ended(result: Any) -> Any:
                    self.endings[id(request)].append(result)
                    return result

                return dfd.addBoth(ended)

            downloader.fetch = counted
            gate = downloader.gate
            on_dispatch = gate._on_dispatch

            def dispatched(waiter: Any, now: float) -> None:
                self.dispatches.append((now, waiter.request))
                if on_dispatch is not None:
                    on_dispatch(waiter, now)

            gate._on_dispatch = dispatched

        crawler.signals.connect(opened, signals.spider_opened, weak=False)

    def outcomes(self) -> Counter[str]:
        """How the fetches ended: ``"200"``-like statuses or exception class names."""
        names: Counter[str] = Counter()
        for results in self.endings.values():
            for result in results:
                if isinstance(result, Failure):
                    names[type(result.value).__name__] += 1
                elif isinstance(result, Response):
                    names[str(result.status)] += 1
                else:
                    names[type(result).__name__] += 1
        return names

    def failures(self) -> list[BaseException]:
        return [
            result.value
            for results in self.endings.values()
            for result in results
            if isinstance(result, Failure) and result.value is not None
        ]

    def final_urls(self) -> Counter[str]:
        """URLs of fetches that ended for good (not handed back as a new request, e.g. a retry)."""
        return Counter(
            request.url
            for request in self.given
            for result in self.endings[id(request)]
            if not isinstance(result, Request)
        )

    def assert_each_fetch_ended_once(self) -> None:
        assert self.given, "the downloader was given nothing"
        never = [r for r in self.given if not self.endings[id(r)]]
        twice = [r for r in self.given if len(self.endings[id(r)]) > 1]
        assert not never, f"fetches that never ended: {never}"
        assert not twice, f"fetches that ended more than once: {twice}"
        for failure in self.failures():
            # "A failure that says why": at least a specific exception class.
            assert type(failure) is not Exception, repr(failure)

    def assert_downloader_drained(self) -> None:
        """After the crawl the downloader holds nothing: no request, waiter or timer."""
        downloader = self.downloader
        assert downloader is not None
        assert not downloader.active
        assert not downloader.gate.waiting
        for scope in downloader.registry.values():
            assert not scope.requests, scope
            assert not scope.in_flight, scope
            assert scope.live_waiters == 0, scope
            assert scope.timer is None or not scope.timer.active(), scope


def ended_in_spider(result: CrawlResult) -> Counter[str]:
    """URLs the spider heard of: a callback, or an errback (HttpError included, once)."""
    ended = Counter(r.request_url for r in result.responses if r.via == "callback")
    ended.update(e.url for e in result.errors)
    return ended


def assert_stats_balance(stats: dict[str, Any]) -> None:
    """Every pass through the downloader middlewares produced a response or an exception."""
    requests = stats.get("downloader/request_count", 0)
    answered = stats.get("downloader/response_count", 0) + stats.get(
        "downloader/exception_count", 0
    )
    assert requests == answered, {k: v for k, v in stats.items() if k.startswith("downloader/")}


def assert_nothing_lost(result: CrawlResult, ledger: Ledger, urls: Sequence[str]) -> None:
    """Each URL ended exactly once in the spider, each fetch exactly once, nothing unhandled."""
    result.assert_no_unhandled_errors()
    assert ended_in_spider(result) == Counter(urls)
    ledger.assert_each_fetch_ended_once()
    assert ended_in_spider(result) == ledger.final_urls()
    ledger.assert_downloader_drained()
    assert_stats_balance(result.stats)


async def crawl(
    urls: Sequence[Any],
    settings: dict[str, Any],
    *,
    spider: type[Spider] = ListSpider,
    crawl_timeout: float = 20.0,
    **kwargs: Any,
) -> tuple[CrawlResult, Ledger]:
    ledger = Ledger()
    result = await run_crawl(
        spider,
        {**SLOTKIT, **settings},
        urls=list(urls),
        on_crawler=ledger.attach,
        crawl_timeout=crawl_timeout,
        **kwargs,
    )
    return result, ledger


# ------------------------------------------------------------ connection reset mid-body

QUICK_BACKOFF = {"BACKOFF_MIN_DELAY": 0.05, "BACKOFF_MAX_DELAY": 0.2}


@pytest.mark.parametrize("mode", ["lose", "abort"])
@pytest.mark.parametrize("retry", [True, False], ids=["retry", "no-retry"])
@pytest_twisted.ensureDeferred
async def test_connection_cut_mid_body(mock_site: MockSite, mode: str, retry: bool) -> None:
    """Bodies cut short (FIN or RST) end as failures, retried or not; healthy pages still arrive."""
    dropped = [mock_site.url(HOST, "/drop", mode=mode, i=i) for i in range(4)]
    healthy = [mock_site.url(OTHER, f"/page/{i}") for i in range(4)]
    settings = {**QUICK_BACKOFF, "RETRY_ENABLED": retry, "RETRY_TIMES": 2}
    result, ledger = await crawl(dropped + healthy, settings)
    assert_nothing_lost(result, ledger, dropped + healthy)
    assert {e.url for e in result.errors} == set(dropped)
    assert sum(1 for r in result.responses if r.status == 200) == len(healthy)
    attempts = 3 if retry else 1
    assert mock_site.recorder.count(HOST, "/drop") == attempts * len(dropped)
    failure = "ResponseDataLossError" if mode == "lose" else "DownloadFailedError"
    assert {e.type for e in result.errors} == {failure}
    # Both are default BACKOFF_EXCEPTIONS: the cut host slowed down, the healthy one did not.
    assert result.stats[f"throttling/backoff/triggers/{failure}"] == attempts * len(dropped)
    assert result.stats["throttling/backoff/steps"] >= 1


# ------------------------------------------------------------ timeouts

TIMEOUT_BACKOFF = 0.1  # the first backoff step after the timeouts


@pytest.mark.parametrize("retry", [True, False], ids=["retry", "no-retry"])
@pytest_twisted.ensureDeferred
async def test_timeouts_fail_and_back_the_scope_off(mock_site: MockSite, retry: bool) -> None:
    """Requests to a host that never answers time out, say so, and back the host's scope off."""
    hung = [mock_site.url(HOST, "/hang", i=i) for i in range(3)]
    healthy = [mock_site.url(OTHER, f"/page/{i}") for i in range(3)]
    # The short timeout only for /hang, so a loaded machine cannot time the healthy pages out.
    specs = [{"url": url, "meta": {"download_timeout": SHORT_TIMEOUT}} for url in hung] + healthy
    settings = {
        **QUICK_BACKOFF,
        "BACKOFF_MIN_DELAY": TIMEOUT_BACKOFF,
        "RETRY_ENABLED": retry,
        "RETRY_TIMES": 1,
    }
    result, ledger = await crawl(specs, settings)
    assert_nothing_lost(result, ledger, hung + healthy)
    assert {(e.url, e.type) for e in result.errors} == {(u, "DownloadTimeoutError") for u in hung}
    assert all(f"took longer than {SHORT_TIMEOUT} seconds" in e.message for e in result.errors)
    assert sorted(r.status for r in result.responses) == [200] * len(healthy)
    # DownloadTimeoutError is a default BACKOFF_EXCEPTIONS member: the silent host backs off,
    # the healthy one does not.
    attempts = 2 if retry else 1
    assert result.stats["throttling/backoff/triggers/DownloadTimeoutError"] == attempts * len(hung)
    assert result.stats["throttling/backoff/steps"] >= 1
    assert ledger.downloader.registry.peek(HOST).manager.backoff_delay is not None
    assert ledger.downloader.registry.peek(OTHER).manager.backoff_delay is None
    if retry:
        # The retries left the gate paced by the backoff, not in a burst (measured at the
        # gate: arrivals at the server carry connection set-up time).
        retries = [
            t for t, r in ledger.dispatches if "/hang" in r.url and r.meta.get("retry_times")
        ]
        assert len(retries) == len(hung)
        gaps = [b - a for a, b in itertools.pairwise(retries)]
        assert min(gaps) >= TIMEOUT_BACKOFF - 1e-3


# ------------------------------------------------------------ server restart

DOWNTIME = 0.5


@pytest_twisted.ensureDeferred
async def test_server_restart_mid_crawl(mock_site: MockSite) -> None:
    """A restart resets the requests in flight and refuses new ones; retries fetch every page."""
    from twisted.internet import reactor

    restarts: list[Deferred[None]] = []

    def restart_on_fourth(request: server.Request, n: int) -> None:
        if n == 3:
            reactor.callLater(0, lambda: restarts.append(mock_site.restart(DOWNTIME)))

    mock_site.set_behaviour(HOST, restart_on_fourth)
    urls = [mock_site.url(HOST, f"/page/{i}", delay=0.2) for i in range(16)]
    settings = {**QUICK_BACKOFF, "CONCURRENT_REQUESTS_PER_DOMAIN": 4, "RETRY_TIMES": 4}
    result, ledger = await crawl(urls, settings)
    assert_nothing_lost(result, ledger, urls)
    assert [r.status for r in result.responses] == [200] * len(urls)
    assert restarts, "the site was never restarted"
    assert restarts[0].called, "the site never came back"
    # Requests in flight were reset, requests in the downtime refused; retries fetched them.
    assert any(record.lost for record in mock_site.recorder.records)
    reasons = {k for k in result.stats if k.startswith("retry/reason_count/")}
    assert reasons & {
        f"retry/reason_count/scrapy.exceptions.{name}"
        for name in ("DownloadFailedError", "DownloadConnectionRefusedError")
    }


# ------------------------------------------------------------ very slow responses

SLOW = 2.0  # seconds every page takes


@pytest_twisted.ensureDeferred
async def test_limits_hold_with_very_slow_responses(mock_site: MockSite) -> None:
    """2 s pages push neither a host past its concurrency nor the crawl past CONCURRENT_REQUESTS."""
    hosts = (HOST, OTHER, "127.0.0.3")
    # Host after host, so the first three requests the engine hands over can all go at once.
    urls = [mock_site.url(host, f"/page/{i}", delay=SLOW) for i in range(2) for host in hosts]
    settings = {"CONCURRENT_REQUESTS": 3, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    result, ledger = await crawl(urls, settings)
    assert_nothing_lost(result, ledger, urls)
    recorder = mock_site.recorder
    for host in hosts:
        assert recorder.max_in_flight[host] == 1
    assert recorder.max_total_in_flight == 3


# ------------------------------------------------------------ oversized headers


def huge_headers(kind: str) -> Callable[[server.Request, int], Reply]:
    def behaviour(request: server.Request, n: int) -> Reply:
        if kind == "many":
            headers = {f"X-Filler-{i}": "v" * 100 for i in range(2000)}
        else:
            headers = {"X-Huge": "v" * 20_000}
        return Reply(200, headers, b"<html>big headers</html>")

    return behaviour


@pytest.mark.parametrize("kind", ["many", "one-long-line"])
@pytest_twisted.ensureDeferred
async def test_oversized_header_block(mock_site: MockSite, kind: str) -> None:
    """A response with a giant header block is read or fails cleanly; the crawl goes on."""
    mock_site.set_behaviour(HOST, huge_headers(kind))
    big = [mock_site.url(HOST, f"/page/{i}") for i in range(3)]
    healthy = [mock_site.url(OTHER, f"/page/{i}") for i in range(3)]
    result, ledger = await crawl(big + healthy, {**QUICK_BACKOFF, "RETRY_ENABLED": False})
    assert_nothing_lost(result, ledger, big + healthy)
    assert sum(1 for r in result.responses if r.status == 200 and OTHER in r.url) == len(healthy)
    if kind == "many":
        # ~220 KB of headers in 2000 lines: Twisted's client has no count or total limit.
        assert [r.status for r in result.responses if HOST in r.url] == [200] * len(big)
    else:
        # A header line over 16 KiB (LineReceiver.MAX_LENGTH) makes Twisted's client drop
        # the connection; Scrapy reports it as a failed download.
        assert {(e.url, e.type) for e in result.errors} == {(u, "DownloadFailedError") for u in big}


# ------------------------------------------------------------ a handler that raises


class RaisingHandler:
    """A download handler for ``boom://`` whose coroutine raises on its first step."""

    lazy = False

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RaisingHandler:
        return cls(crawler)

    async def download_request(self, request: Request) -> Response:
        raise ValueError(f"boom handler refuses {request.url}")

    async def close(self) -> None:
        pass


class LegacyRaisingHandler(RaisingHandler):
    """The deprecated Deferred-style handler: ``download_request`` raises synchronously."""

    def download_request(self, request: Request, spider: Spider) -> Deferred[Response]:  # type: ignore[override]
        raise ValueError(f"legacy boom handler refuses {request.url}")


@pytest.mark.filterwarnings("ignore::scrapy.exceptions.ScrapyDeprecationWarning")
@pytest.mark.parametrize(
    "handler", [RaisingHandler, LegacyRaisingHandler], ids=["async", "legacy-sync"]
)
@pytest_twisted.ensureDeferred
async def test_raising_handler_releases_its_scope(mock_site: MockSite, handler: type) -> None:
    """A handler that raises before doing anything frees the scope for the scope's next request."""
    urls: list[str] = []
    for i in range(3):
        urls += [f"boom://{HOST}:{mock_site.port}/page/{i}", mock_site.url(HOST, f"/page/{i}")]
    settings = {"DOWNLOAD_HANDLERS": {"boom": handler}, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    result, ledger = await crawl(urls, settings)
    assert_nothing_lost(result, ledger, urls)
    assert {e.url for e in result.errors} == {u for u in urls if u.startswith("boom:")}
    assert {e.type for e in result.errors} == {"ValueError"}
    assert all("refuses" in e.message for e in result.errors)
    assert sorted(r.status for r in result.responses) == [200, 200, 200]
    # One scope for both schemes (the host), and it never held two requests at once.
    assert set(ledger.downloader.registry) == {HOST}
    assert mock_site.recorder.max_in_flight[HOST] == 1


# ------------------------------------------------------------ closing while a scope is held


@dataclass
class CloseWatch:
    """Times the spider's closing; unblocks a close that hangs, so a failing test stays short.

    If the spider is not closed ``PROMPT`` seconds after ``CLOSESPIDER_TIMEOUT``
    fired, the watch closes the downloader itself (failing whatever waits at
    the gate, which lets the engine finish closing) and records that it had to.
    """

    closed_at: float | None = None
    had_to_unblock: bool = False

    def attach(self, crawler: Crawler, ledger: Ledger) -> None:
        from twisted.internet import reactor

        ledger.attach(crawler)
        watchdog: list[Any] = []

        def opened(spider: Spider) -> None:
            watchdog.append(reactor.callLater(CLOSE_AFTER + PROMPT, unblock))

        def unblock() -> None:
            if self.closed_at is None:
                self.had_to_unblock = True
                ledger.downloader.close()

        def closed(spider: Spider, reason: str) -> None:
            self.closed_at = reactor.seconds()
            if watchdog and watchdog[0].active():
                watchdog[0].cancel()

        crawler.signals.connect(opened, signals.spider_opened, weak=False)
        crawler.signals.connect(closed, signals.spider_closed, weak=False)


async def crawl_until_closed(
    urls: Sequence[str], settings: dict[str, Any]
) -> tuple[CrawlResult, Ledger, CloseWatch]:
    ledger, watch = Ledger(), CloseWatch()
    result = await run_crawl(
        ListSpider,
        {**SLOTKIT, **settings, "CLOSESPIDER_TIMEOUT": CLOSE_AFTER},
        urls=list(urls),
        on_crawler=lambda crawler: watch.attach(crawler, ledger),
        crawl_timeout=HOLD * 2,
    )
    return result, ledger, watch


def assert_closed_promptly(result: CrawlResult, ledger: Ledger, watch: CloseWatch) -> None:
    assert result.finish_reason == "closespider_timeout"
    assert not watch.had_to_unblock, (
        f"the spider was still closing {PROMPT}s after CLOSESPIDER_TIMEOUT: the engine waits for "
        f"requests held at the gate, so they must fail as soon as the spider starts closing"
    )
    result.assert_no_unhandled_errors()
    ledger.assert_each_fetch_ended_once()
    ledger.assert_downloader_drained()
    assert_stats_balance(result.stats)
    # Requests still waiting ended with a failure that names the gate, and the spider heard of each.
    waiting = [f for f in ledger.failures() if type(f).__name__ == "GateClosedError"]
    assert waiting, ledger.outcomes()
    for failure in waiting:
        assert "closespider_timeout" in str(failure)
        assert "throttling scopes" in str(failure)
    assert ended_in_spider(result) == ledger.final_urls()
    # One summary line, not an "Error downloading" per unsent request.
    assert "Error downloading" not in result.log_text
    assert result.stats["throttling/requests_unsent_at_close"] == len(waiting)
    answered = result.stats.get("throttling/backoff/handed_on_at_close", 0)
    if answered:
        were = "was" if len(waiting) == 1 else "were"
        assert f"{len(waiting)} {were} not sent, and {answered} answered with" in result.log_text
    else:
        assert "waited for their throttling scopes; they were not sent" in result.log_text


@pytest.mark.parametrize("signal", ["retry-after", "backoff-step"])
@pytest_twisted.ensureDeferred
async def test_close_during_backoff(mock_site: MockSite, signal: str) -> None:
    """CLOSESPIDER_TIMEOUT while a scope backs off for 30 s ends the crawl now; held requests fail.

    Either a 429 with ``Retry-After: 30`` (a hold) or a 503 whose backoff step is 30 s.
    """
    settings: dict[str, Any] = {"CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    if signal == "retry-after":
        mock_site.set_behaviour(HOST, fail_first(1, 429, {"Retry-After": str(int(HOLD))}))
    else:
        mock_site.set_behaviour(HOST, fail_first(1, 503))
        settings["BACKOFF_MIN_DELAY"] = HOLD
    urls = [mock_site.url(HOST, f"/page/{i}") for i in range(4)]
    result, ledger, watch = await crawl_until_closed(urls, settings)
    assert mock_site.recorder.count(HOST) == 1  # nothing was sent during the backoff
    assert_closed_promptly(result, ledger, watch)
    if signal == "retry-after":
        # A probe: the 429'd request waiting to go again was reported "not sent" (a
        # GateClosedError). Its answer goes on instead, to the spider (a review: not
        # to RetryMiddleware, whose retry, scheduled while closing, was dropped unheard).
        assert result.stats["throttling/backoff/handed_on_at_close"] == 1
        assert result.stats["throttling/requests_unsent_at_close"] == 3
        assert "retry/count" not in result.stats
        assert [e.url for e in result.errors if e.status == 429] == [urls[0]]
        assert sorted(ended_in_spider(result)) == sorted(urls)  # every page heard of once
        # The 429 went over the wire once and is counted once (a review: twice).
        assert result.stats["downloader/response_status_count/429"] == 1
        assert result.stats["downloader/request_count"] == 4


class FlagSpider(ListSpider):
    """Notes the ``dont_retry`` meta each errback's request carries."""

    seen: list[Any]

    def on_error(self, failure: Failure) -> None:
        request = getattr(failure, "request", None)
        self.seen = [*getattr(self, "seen", []), None if request is None else request.meta]
        super().on_error(failure)


@pytest_twisted.ensureDeferred
async def test_the_dont_retry_lent_at_close_is_given_back(mock_site: MockSite) -> None:
    """A review: the dont_retry set so that the 429 handed on at close reaches the
    spider stayed on the spider's request (re-yielded, it would never be retried)."""
    mock_site.set_behaviour(HOST, fail_first(1, 429, {"Retry-After": str(int(HOLD))}))
    spiders: list[FlagSpider] = []
    result = await run_crawl(
        FlagSpider,
        {**SLOTKIT, "CONCURRENT_REQUESTS_PER_DOMAIN": 1, "CLOSESPIDER_TIMEOUT": CLOSE_AFTER},
        urls=[mock_site.url(HOST, "/page/0")],
        on_crawler=lambda crawler: crawler.signals.connect(
            lambda spider: spiders.append(spider), signals.spider_opened, weak=False
        ),
        crawl_timeout=HOLD * 2,
    )
    assert result.stats["throttling/backoff/handed_on_at_close"] == 1
    assert [e.status for e in result.errors] == [429]
    (meta,) = spiders[0].seen
    assert "dont_retry" not in meta


@pytest_twisted.ensureDeferred
async def test_close_during_download_delay_wait(mock_site: MockSite) -> None:
    """CLOSESPIDER_TIMEOUT while requests wait out a 30 s DOWNLOAD_DELAY ends the crawl at once."""
    urls = [mock_site.url(HOST, f"/page/{i}") for i in range(4)]
    result, ledger, watch = await crawl_until_closed(urls, {"DOWNLOAD_DELAY": HOLD})
    assert mock_site.recorder.count(HOST) == 1
    assert [r.status for r in result.responses] == [200]
    assert_closed_promptly(result, ledger, watch)


@pytest_twisted.ensureDeferred
async def test_close_during_a_shared_wait_counts_the_requests_cut_off(mock_site: MockSite) -> None:
    """Shared mode: requests waiting for the store's answer are in the close line too."""
    urls = [mock_site.url(HOST, f"/page/{i}") for i in range(4)]
    settings = {
        "DOWNLOAD_DELAY": HOLD,
        "THROTTLING_REDIS_URL": "local",
        # The local store lives as long as the reactor: a namespace of its own.
        "THROTTLING_REDIS_NAMESPACE": "close-during-shared-wait",
    }
    result, ledger, watch = await crawl_until_closed(urls, settings)
    assert mock_site.recorder.count(HOST) == 1
    assert [r.status for r in result.responses] == [200]
    assert_closed_promptly(result, ledger, watch)
    assert "while 3 request(s) waited for their throttling scopes" in result.log_text


@pytest_twisted.ensureDeferred
async def test_close_during_a_shared_wait_on_a_plain_reactor_puts_them_all_back(
    tmp_path: Any,
) -> None:
    """With JOBDIR on a plain reactor, every request cut off (at the store or behind
    it at the local gate) goes back to the scheduler and is counted once: a ticket
    given back by the store used to admit the next waiter at once, which then failed."""
    urls = [f"http://127.0.0.1:{{port}}/page/{i}" for i in range(6)]
    settings = {
        "DOWNLOADER": "slotkit.Downloader",
        "THROTTLING_REDIS_URL": "local",
        "THROTTLING_SCOPES": {"127.0.0.1": {"delay": HOLD, "concurrency": 1}},
        "JOBDIR": str(tmp_path / "job"),
        "CLOSESPIDER_TIMEOUT": CLOSE_AFTER,
    }
    result = await run_crawl_subprocess_async(
        reactor=EPOLL_REACTOR, settings=settings, spider_kwargs={"urls": urls}
    )
    assert len(result["responses"]) == 1
    assert result["errors"] == []
    assert result["stats"]["throttling/requests_requeued"] == 5
    assert "while 5 request(s) waited for their throttling scopes" in "\n".join(result["log"])


# ------------------------------------------------------------ malformed rate-limit headers

MALFORMED: dict[str, dict[bytes, bytes]] = {
    "retry-after-word": {b"Retry-After": b"soon"},
    "retry-after-negative": {b"Retry-After": b"-5"},
    "retry-after-exponent": {b"Retry-After": b"1e400"},
    "retry-after-nan": {b"Retry-After": b"nan"},
    "retry-after-empty": {b"Retry-After": b""},
    "retry-after-bad-date": {b"Retry-After": b"Wed, 32 Foo 2099 25:61:61 GMT"},
    "retry-after-list": {b"Retry-After": b"3, 4"},
    "ratelimit-nonsense": {b"RateLimit": b"nonsense;;;==,,", b"RateLimit-Policy": b"\x00 q=;w=-1"},
    "ratelimit-fields": {b"RateLimit": b'"default";r=abc;t=-7', b"RateLimit-Reset": b"-1"},
    "ratelimit-reset-huge": {b"RateLimit-Reset": b"9" * 400},
    "x-ratelimit": {
        b"X-RateLimit-Remaining": b"-5",
        b"X-RateLimit-Reset": b"tomorrow",
        b"X-RateLimit-Limit": b"0",
    },
    "non-utf8": {
        b"Retry-After": b"\xff\xfe1",
        b"RateLimit": b"\xc3\x28;r=\x80",
        b"X-RateLimit-Reset": b"\xe2\x82",
    },
}


def raw_headers_first(
    headers: dict[bytes, bytes], status: int = 429
) -> Callable[[server.Request, int], Reply | None]:
    """Answer the first request *status* with *headers* set byte for byte, then behave normally."""

    def behaviour(request: server.Request, n: int) -> Reply | None:
        if n:
            return None
        for name, value in headers.items():
            request.responseHeaders.setRawHeaders(name, [value])
        return Reply(status, {}, b"slow down")

    return behaviour


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("case", list(MALFORMED))
@pytest_twisted.ensureDeferred
async def test_malformed_rate_limit_headers_never_crash(
    mock_site: MockSite, case: str, status: int
) -> None:
    """Garbage in Retry-After / RateLimit headers is ignored for one backoff step; no crash."""
    mock_site.set_behaviour(HOST, raw_headers_first(MALFORMED[case], status))
    urls = [mock_site.url(HOST, f"/page/{i}") for i in range(3)]
    result, ledger = await crawl(urls, QUICK_BACKOFF)
    assert_nothing_lost(result, ledger, urls)
    assert [r.status for r in result.responses] == [200] * len(urls)
    assert "log_count/ERROR" not in result.stats
    # No usable hint: one exponential backoff step instead of a hold.
    assert "throttling/backoff/header_hints" not in result.stats
    assert result.stats["throttling/backoff/steps"] == 1
    if status == 429:
        assert result.stats["throttling/backoff/resent"] == 1  # re-sent inside the downloader
    else:
        assert result.stats["retry/count"] == 1  # 503 is RetryMiddleware's
    arrivals = mock_site.recorder.arrivals(HOST)
    assert len(arrivals) == len(urls) + 1
    # The second try came after one short step: nothing was read as a long hold.
    assert arrivals[-1] - arrivals[0] < 1.0


# ------------------------------------------------------------ transfers cut short by the client


class StopDownloadSpider(ListSpider):
    """Stops every download of ``/page/`` on ``HOST`` once its headers arrive."""

    name = "stop-download"

    def __init__(self, fail: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail = fail

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> StopDownloadSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_headers, signals.headers_received)
        return spider

    def on_headers(self, headers: Any, body_length: int, request: Request, spider: Spider) -> None:
        from scrapy.exceptions import StopDownload

        if f"//{HOST}:" in request.url:
            raise StopDownload(fail=self.fail)


@pytest.mark.parametrize("how", ["maxsize", "stop-fail", "stop-keep"])
@pytest_twisted.ensureDeferred
async def test_transfers_cut_short_release_the_scope(mock_site: MockSite, how: str) -> None:
    """Downloads the client abandons (DOWNLOAD_MAXSIZE, StopDownload) free their scope."""
    big = [mock_site.url(HOST, f"/page/{i}", size=50_000, delay=0.05) for i in range(3)]
    healthy = [mock_site.url(OTHER, f"/page/{i}") for i in range(2)]
    settings: dict[str, Any] = {"CONCURRENT_REQUESTS_PER_DOMAIN": 1, "RETRY_ENABLED": False}
    kwargs: dict[str, Any] = {}
    if how == "maxsize":
        settings["DOWNLOAD_MAXSIZE"] = 10_000
        spider: type[Spider] = ListSpider
    else:
        spider = StopDownloadSpider
        kwargs["fail"] = how == "stop-fail"
    result, ledger = await crawl(big + healthy, settings, spider=spider, **kwargs)
    assert_nothing_lost(result, ledger, big + healthy)
    expected = {
        "maxsize": "DownloadCancelledError",
        "stop-fail": "StopDownload",
        "stop-keep": None,
    }[how]
    if expected is None:  # the truncated responses are handed on as they are
        assert sorted(r.status for r in result.responses) == [200] * len(big + healthy)
    else:
        assert {(e.url, e.type) for e in result.errors} == {(u, expected) for u in big}
        assert sorted(r.status for r in result.responses) == [200] * len(healthy)
    assert mock_site.recorder.max_in_flight[HOST] == 1
    # The client gave up, not the server: no reason to slow the scope down.
    assert "throttling/backoff/steps" not in result.stats
