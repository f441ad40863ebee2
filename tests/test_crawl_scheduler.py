"""Real crawls with the throttling-aware scheduler, on the loopback test server.

127.0.0.2 plays a heavily throttled site, 127.0.0.1 a free one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.resolver import dnscache
from scrapy.utils.defer import deferred_from_coro

from slotkit import ThrottlingManager, ThrottlingScopeManager, scope_cache
from tests.crawl import EPOLL_REACTOR, ListSpider, run_crawl, run_crawl_subprocess_async
from tests.server import MockSite

pytestmark = pytest.mark.integration

SLOW_HOST = "127.0.0.2"
FAST_HOST = "127.0.0.1"
PAGES = 100
ONE_MINUTE = 60.0

BASE = {
    "DOWNLOADER": "slotkit.Downloader",
    "RANDOMIZE_DOWNLOAD_DELAY": False,
    "DOWNLOAD_DELAY_JITTER": 0,
    "CONCURRENT_REQUESTS": 2,
    "LOG_LEVEL": "INFO",
}
AWARE = {
    **BASE,
    "SCHEDULER": "slotkit.scheduler.ThrottlingAwareScheduler",
    "SCHEDULER_PRIORITY_QUEUE": "slotkit.pqueue.ThrottlingAwarePriorityQueue",
}
SLOW_SCOPE = {"THROTTLING_SCOPES": {SLOW_HOST: {"delay": ONE_MINUTE}}}


def pages(site: MockSite, host: str, count: int, start: int = 0) -> list[str]:
    return [site.url(host, f"/page/{n}") for n in range(start, start + count)]


def close_when(
    wanted: int, host: str, reason: str, seen: list[float] | None = None
) -> Callable[[Crawler], None]:
    """An ``on_crawler`` hook closing the spider once *wanted* responses of *host* came."""

    def hook(crawler: Crawler) -> None:
        count = 0

        def received(response: Any, request: Any, spider: Any) -> None:
            nonlocal count
            if f"//{host}:" in request.url:
                count += 1
                if count == wanted:
                    from twisted.internet import reactor

                    if seen is not None:
                        seen.append(reactor.seconds())
                    deferred_from_coro(crawler.engine.close_spider_async(reason=reason))

        crawler.signals.connect(received, signals.response_received, weak=False)

    return hook


def stop_after(seconds: float, reason: str) -> Callable[[Crawler], None]:
    """An ``on_crawler`` hook that stops the crawl *seconds* after the engine starts.

    Requests waiting inside the downloader would hold a graceful close for
    minutes, so the engine is paused and the downloader closed first.
    """

    def hook(crawler: Crawler) -> None:
        def started() -> None:
            from twisted.internet import reactor

            def stop() -> None:
                engine = crawler.engine
                if engine.spider is None:
                    return
                engine.pause()
                engine.downloader.close()
                deferred_from_coro(engine.close_spider_async(reason=reason))

            reactor.callLater(seconds, stop)

        crawler.signals.connect(started, signals.engine_started, weak=False)

    return hook


def fast_done(result: Any) -> int:
    return sum(1 for r in result.responses if f"//{FAST_HOST}:" in r.url)


class AsyncEndpointManager(ThrottlingManager):
    """``get_scopes`` as the spec writes it (``async``, cached, awaiting ``super()``),
    naming a scope that is not the host: the scheduler cannot guess it."""

    @scope_cache
    async def get_scopes(self, request: Any) -> Any:
        scopes = await super().get_scopes(request)
        return "slow-endpoint" if f"//{SLOW_HOST}:" in request.url else scopes


@pytest.mark.parametrize(
    "throttle",
    [
        SLOW_SCOPE,
        {"DOWNLOAD_SLOTS": {SLOW_HOST: {"delay": ONE_MINUTE}}},
        # The scheduler learns the scopes of an async get_scopes awaiting nothing pending.
        {
            "THROTTLING_SCOPES": {"slow-endpoint": {"delay": ONE_MINUTE}},
            "THROTTLING_MANAGER": AsyncEndpointManager,
        },
    ],
    ids=["THROTTLING_SCOPES", "DOWNLOAD_SLOTS", "async-get_scopes"],
)
@pytest_twisted.ensureDeferred
async def test_a_free_host_is_not_blocked_by_a_throttled_one(
    mock_site: MockSite, throttle: dict[str, Any]
) -> None:
    """100 pages of a free host finish in seconds behind 100 requests of a 60 s-delay host."""
    urls = pages(mock_site, SLOW_HOST, PAGES) + pages(mock_site, FAST_HOST, PAGES)
    result = await run_crawl(
        ListSpider,
        {**AWARE, **throttle},
        urls=urls,
        on_crawler=close_when(PAGES, FAST_HOST, "fast_done"),
        crawl_timeout=30,
    )
    result.assert_no_unhandled_errors()
    assert result.finish_reason == "fast_done"
    assert fast_done(result) == PAGES
    assert result.duration < 15  # about 1-2 s on an idle machine
    assert mock_site.recorder.count(SLOW_HOST) == 1  # the delay held
    # Nothing waited inside the downloader: no CONCURRENT_REQUESTS place was held.
    assert result.stats.get("throttling/requests_delayed", 0) == 0
    assert result.stats["throttling/scheduler/held_back"] > 0
    assert result.stats["scheduler/enqueued"] == 2 * PAGES


@pytest_twisted.ensureDeferred
async def test_a_request_held_by_its_second_scope_does_not_hold_back_its_first(
    mock_site: MockSite,
) -> None:
    """An acceptance probe: requests of {"api", "users"}, users paced at a minute,
    queued before requests of "api" alone, held all of those (0 of 10 sent in 6 s)."""
    both = [
        {"url": url, "meta": {"throttling_scopes": ["api", "users"]}}
        for url in pages(mock_site, SLOW_HOST, 5)
    ]
    api_only = [
        {"url": url, "meta": {"throttling_scopes": ["api"]}}
        for url in pages(mock_site, FAST_HOST, PAGES)
    ]
    result = await run_crawl(
        ListSpider,
        {**AWARE, "THROTTLING_SCOPES": {"api": {"concurrency": 8}, "users": {"delay": ONE_MINUTE}}},
        urls=[*both, *api_only],
        on_crawler=close_when(PAGES, FAST_HOST, "api_done"),
        crawl_timeout=30,
    )
    result.assert_no_unhandled_errors()
    assert result.finish_reason == "api_done"
    assert fast_done(result) == PAGES
    assert mock_site.recorder.count(SLOW_HOST) == 1  # users' minute held


class CanSendRaises(ThrottlingScopeManager):
    """A user's scope manager with a bug."""

    def can_send(self, now: float, amount: float | None = None) -> float:
        raise RuntimeError("bug in can_send")


@pytest_twisted.ensureDeferred
async def test_a_scope_manager_raising_in_can_send_fails_the_requests_not_the_crawl(
    mock_site: MockSite,
) -> None:
    """A review: the queue asked can_send unguarded; the error came back at every
    engine pass and the second request never ended (with Scrapy's scheduler, the
    gate fails both with the error)."""
    result = await run_crawl(
        ListSpider,
        {**AWARE, "THROTTLING_SCOPE_MANAGER": CanSendRaises},
        urls=pages(mock_site, FAST_HOST, 2),
        crawl_timeout=15,
    )
    assert result.finish_reason == "finished"
    assert len(result.errors) == 2
    assert all("bug in can_send" in str(error) for error in result.errors)


@pytest_twisted.ensureDeferred
async def test_requests_with_a_throttling_delay_wait_in_the_queue_not_the_downloader(
    mock_site: MockSite,
) -> None:
    """100 requests held 60 s by their throttling_delay hold no CONCURRENT_REQUESTS
    place: the free host's pages go (an acceptance probe saw 0 of 100 sent)."""
    slow = [
        {"url": url, "meta": {"throttling_delay": ONE_MINUTE}}
        for url in pages(mock_site, SLOW_HOST, PAGES)
    ]
    result = await run_crawl(
        ListSpider,
        AWARE,
        urls=[*slow, *pages(mock_site, FAST_HOST, PAGES)],
        on_crawler=close_when(PAGES, FAST_HOST, "fast_done"),
        crawl_timeout=30,
    )
    result.assert_no_unhandled_errors()
    assert result.finish_reason == "fast_done"
    assert fast_done(result) == PAGES
    assert mock_site.recorder.count(SLOW_HOST) == 0  # the delay held


@pytest_twisted.ensureDeferred
async def test_a_throttling_delay_counts_from_when_the_request_was_queued(
    mock_site: MockSite,
) -> None:
    """Queued behind a backlog of its site, a request with a 0.5 s throttling_delay goes
    once the delay is over, not 0.5 s after the backlog let it reach the downloader."""
    from twisted.internet import reactor

    gap = 0.1
    backlog = pages(mock_site, FAST_HOST, 40)
    delayed = {"url": mock_site.url(FAST_HOST, "/delayed"), "meta": {"throttling_delay": 0.5}}
    scheduled: list[float] = []

    def note_scheduled(request: Any, spider: Any) -> None:
        if request.url.endswith("/delayed"):
            scheduled.append(reactor.seconds())

    result = await run_crawl(
        ListSpider,
        {**AWARE, "THROTTLING_SCOPES": {FAST_HOST: {"delay": gap}}},
        urls=[*backlog, delayed],
        crawl_timeout=30,
        on_crawler=lambda crawler: crawler.signals.connect(
            note_scheduled, signals.request_scheduled
        ),
    )
    result.assert_no_unhandled_errors()
    assert len(result.responses) == 41
    # Not before its delay: request_scheduled fires just before the queue takes
    # the request in (where the delay starts), and the dispatch time is when it
    # left (the server sees it later by a varying amount on a busy machine).
    (sent,) = result.dispatch_times(FAST_HOST, "/delayed")
    assert sent - scheduled[0] >= 0.5 - 1e-3
    # About 5 gaps into the 40-gap backlog rather than after it (a busy machine
    # only makes the gaps longer, so fewer pages go first).
    order = [path for host, path, _ in result.dispatches if host == FAST_HOST]
    assert order.index("/delayed") < 30, order


@pytest_twisted.ensureDeferred
async def test_http_cache_hits_are_not_held_behind_their_sites_pace(
    mock_site: MockSite, tmp_path: Path
) -> None:
    """An acceptance probe: cached pages queued behind their site's uncached ones
    waited out its 1 s delay (answered at 3 s) in the scheduler, though the cache
    answers them without the downloader (at once with Scrapy's scheduler)."""
    cache = {"HTTPCACHE_ENABLED": True, "HTTPCACHE_DIR": str(tmp_path / "cache")}
    cached = pages(mock_site, FAST_HOST, 4)
    await run_crawl(ListSpider, {**AWARE, **cache}, urls=cached)
    assert mock_site.recorder.count(FAST_HOST) == 4
    fresh = pages(mock_site, FAST_HOST, 3, start=100)
    settings = {**AWARE, **cache, "DOWNLOAD_DELAY": 0.5, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    result = await run_crawl(ListSpider, settings, urls=fresh + cached)
    result.assert_no_unhandled_errors()
    assert mock_site.recorder.count(FAST_HOST) == 4 + 3  # the cache answered the four
    order = [r.url for r in sorted(result.responses, key=lambda r: r.received)]
    assert set(order[:5]) == {fresh[0], *cached}  # before the delay let the second go
    assert result.stats["httpcache/hit"] == 4


@pytest_twisted.ensureDeferred
async def test_queued_cache_hits_the_cache_no_longer_answers_are_throttled_again(
    mock_site: MockSite, tmp_path: Path
) -> None:
    """A review: cache hits queued in a JOBDIR and resumed with the cache off went to
    the downloader all at once (waiting there, in CONCURRENT_REQUESTS places, while
    another site's pages waited 4 s); they go back to their slot's own sub-queue."""
    cache = {"HTTPCACHE_ENABLED": True, "HTTPCACHE_DIR": str(tmp_path / "cache")}
    cached = pages(mock_site, FAST_HOST, 4)
    await run_crawl(ListSpider, {**AWARE, **cache}, urls=cached)
    job = {"JOBDIR": str(tmp_path / "job")}
    slow_first = [{"url": mock_site.url(FAST_HOST, "/page/99", delay=3), "priority": 10}]
    paused = await run_crawl(
        ListSpider,
        {**AWARE, **cache, **job, "CONCURRENT_REQUESTS": 1, "CLOSESPIDER_TIMEOUT": 1},
        urls=slow_first + cached,
        crawl_timeout=20,
    )
    assert paused.finish_reason == "closespider_timeout"
    assert len(paused.responses) == 1  # the slow page; the four hits stayed queued

    reached: list[str] = []

    def listen(crawler: Crawler) -> None:
        def on_reached(request: Any, spider: Any) -> None:
            reached.append(request.url)

        crawler.signals.connect(on_reached, signal=signals.request_reached_downloader, weak=False)

    other = pages(mock_site, SLOW_HOST, 4)
    resumed = await run_crawl(
        ListSpider,
        {
            **AWARE,
            **job,  # the cache is off now
            "DOWNLOAD_DELAY": 0.3,
            "CONCURRENT_REQUESTS": 4,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
            "THROTTLING_SCOPES": {SLOW_HOST: {"delay": 0, "concurrency": 4}},
        },
        urls=other,
        on_crawler=listen,
        crawl_timeout=30,
    )
    resumed.assert_no_unhandled_errors()
    assert len(resumed.responses) == 8
    # The other site's pages did not wait behind the former hits: only one of
    # those reached the downloader before the delay let the next go.
    first_four = reached[:5]
    assert set(other) <= set(first_four)
    assert resumed.stats.get("throttling/requests_delayed", 0) == 0


@pytest_twisted.ensureDeferred
async def test_for_comparison_scrapys_scheduler_is_blocked(mock_site: MockSite) -> None:
    """Same crawl, Scrapy's scheduler in request order: the free host waits behind the slow one."""
    urls = pages(mock_site, SLOW_HOST, PAGES) + pages(mock_site, FAST_HOST, PAGES)
    window = 3.0
    result = await run_crawl(
        ListSpider,
        {**BASE, **SLOW_SCOPE, "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue"},
        urls=urls,
        on_crawler=stop_after(window, "window"),
        crawl_timeout=30,
    )
    assert result.finish_reason == "window"
    assert fast_done(result) == 0  # both CONCURRENT_REQUESTS places wait for the slow host
    assert mock_site.recorder.count(SLOW_HOST) == 1


@pytest_twisted.ensureDeferred
async def test_one_timer_wakes_the_engine_when_a_delay_ends(mock_site: MockSite) -> None:
    """Held requests go out when due, not at the engine's 5 s heartbeat."""
    delay = 0.4
    urls = pages(mock_site, SLOW_HOST, 4)
    result = await run_crawl(
        ListSpider, {**AWARE, "THROTTLING_SCOPES": {SLOW_HOST: {"delay": delay}}}, urls=urls
    )
    result.assert_no_unhandled_errors()
    assert len(result.responses) == 4
    gaps = result.dispatch_gaps(SLOW_HOST)
    assert min(gaps) >= delay - 0.001
    assert max(gaps) < delay + 1.0  # a missed wake-up would wait for the heartbeat (5 s)
    assert result.stats["throttling/scheduler/wakeups"] >= 3
    assert result.stats.get("throttling/requests_delayed", 0) == 0


@pytest_twisted.ensureDeferred
async def test_a_finished_download_wakes_the_engine_for_a_full_scope(mock_site: MockSite) -> None:
    """Held because a scope is full (inf): no timer; the end of a download brings the next."""
    answer = 0.3
    urls = [mock_site.url(SLOW_HOST, f"/page/{n}", delay=answer) for n in range(4)]
    settings = {**AWARE, "CONCURRENT_REQUESTS": 4, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    result = await run_crawl(ListSpider, settings, urls=urls)
    result.assert_no_unhandled_errors()
    assert len(result.responses) == 4
    assert mock_site.recorder.max_in_flight[SLOW_HOST] == 1
    assert max(mock_site.recorder.gaps(SLOW_HOST)) < answer + 1.0  # not the 5 s heartbeat
    assert result.stats.get("throttling/scheduler/wakeups", 0) == 0
    assert result.stats.get("throttling/requests_delayed", 0) == 0


@pytest_twisted.ensureDeferred
async def test_a_free_host_is_not_blocked_under_a_plain_twisted_reactor() -> None:
    """The same holds on a non-asyncio reactor (run in a subprocess)."""
    urls = [f"http://{SLOW_HOST}:{{port}}/page/{n}" for n in range(PAGES)] + [
        f"http://{FAST_HOST}:{{port}}/page/{n}" for n in range(PAGES)
    ]
    result = await run_crawl_subprocess_async(
        reactor=EPOLL_REACTOR,
        # One item per response: the slow host's first page plus every fast page.
        settings={**AWARE, **SLOW_SCOPE, "CLOSESPIDER_ITEMCOUNT": PAGES + 1},
        spider_kwargs={"urls": urls},
    )
    assert result["stats"]["finish_reason"] == "closespider_itemcount"
    fast = [r for r in result["responses"] if f"//{FAST_HOST}:" in r["url"]]
    assert len(fast) == PAGES
    assert result["finished"] - result["started"] < 15
    assert result["stats"].get("throttling/requests_delayed", 0) == 0


@pytest_twisted.ensureDeferred
async def test_per_ip_limits_are_held_in_the_scheduler(
    mock_site: MockSite, cached_names: dict[str, str]
) -> None:
    """CONCURRENT_REQUESTS_PER_IP works with slotkit's queue, and waits happen in the scheduler."""
    hosts = {"a.example.test": FAST_HOST, "b.example.test": FAST_HOST}
    cached_names.update(hosts)
    for name, address in hosts.items():
        dnscache[name] = address
    urls = [
        f"http://{name}:{mock_site.port}/page/{n}?delay=0.1" for n in range(4) for name in hosts
    ]
    settings = {
        **AWARE,
        "CONCURRENT_REQUESTS": 8,
        "CONCURRENT_REQUESTS_PER_IP": 1,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
    }
    result = await run_crawl(ListSpider, settings, urls=urls, resolve=hosts)
    result.assert_no_unhandled_errors()
    assert len(result.responses) == 8
    assert mock_site.recorder.max_concurrency() == 1
    assert result.stats.get("throttling/requests_delayed", 0) == 0


@pytest_twisted.ensureDeferred
async def test_held_requests_survive_pause_and_resume(mock_site: MockSite, tmp_path: Path) -> None:
    """With JOBDIR, requests held for a throttled host stay queued on disk across a restart."""
    jobdir = str(tmp_path / "job")
    settings = {**AWARE, **SLOW_SCOPE, "JOBDIR": jobdir}
    slow = pages(mock_site, SLOW_HOST, 5)
    first = await run_crawl(
        ListSpider,
        settings,
        urls=slow + pages(mock_site, FAST_HOST, 5),
        dont_filter=False,
        on_crawler=close_when(5, FAST_HOST, "paused"),
    )
    first.assert_no_unhandled_errors()
    assert first.finish_reason == "paused"
    assert mock_site.recorder.count(SLOW_HOST) == 1
    assert first.stats.get("dupefilter/filtered", 0) == 0

    # The user lowers the delay and resumes; the spider yields nothing new.
    resumed_settings = {**settings, "THROTTLING_SCOPES": {SLOW_HOST: {"delay": 0.05}}}
    second = await run_crawl(ListSpider, resumed_settings, urls=[], dont_filter=False)
    second.assert_no_unhandled_errors()
    assert "Resuming crawl (4 requests scheduled)" in second.log_text
    assert second.finish_reason == "finished"
    assert sorted(r.url for r in second.responses) == sorted(slow[1:])
    assert second.stats["scheduler/dequeued/disk"] == 4
    assert second.stats.get("dupefilter/filtered", 0) == 0
    assert mock_site.recorder.paths(SLOW_HOST) == [f"/page/{n}" for n in range(5)]


@pytest.mark.parametrize("settings", [BASE, AWARE], ids=["stock scheduler", "aware"])
@pytest_twisted.ensureDeferred
async def test_a_warning_when_a_slowed_site_fills_the_downloader(
    mock_site: MockSite, settings: dict[str, Any]
) -> None:
    """A probe: with DOWNLOADER alone, a site answering 429 held every
    CONCURRENT_REQUESTS place for 12 s and healthy sites got nothing, with no
    word in the log. Scrapy's scheduler: one WARNING naming the site and the
    fix. slotkit's scheduler keeps such requests out of the downloader: none."""
    from tests.server import fail_first

    mock_site.set_behaviour(SLOW_HOST, fail_first(4, 429, {"Retry-After": "1"}))
    urls = pages(mock_site, SLOW_HOST, 4) + pages(mock_site, FAST_HOST, 2)
    result = await run_crawl(ListSpider, {**settings, "CONCURRENT_REQUESTS": 2}, urls=urls)
    assert len(result.responses) == 6
    warned = "CONCURRENT_REQUESTS places are held by requests waiting" in result.log_text
    assert warned is (settings is BASE)
    if warned:
        assert f"{SLOW_HOST} (" in result.log_text
        assert result.log_text.count("places are held by requests waiting") == 1
