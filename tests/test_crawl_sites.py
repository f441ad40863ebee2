"""robots.txt Crawl-delay, IP scopes and domain grouping in real crawls."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from scrapy import signals
from scrapy.core.downloader import Slot
from scrapy.resolver import dnscache

from slotkit import SettingsError
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite

pytestmark = pytest.mark.integration

SLOTKIT: dict[str, Any] = {"DOWNLOADER": "slotkit.Downloader", "DOWNLOAD_DELAY_JITTER": 0}
HOST = "127.0.0.1"
CRAWL_DELAY = 0.3


def pages(site: MockSite, host: str, count: int, **query: Any) -> list[str]:
    return [site.url(host, f"/page/{i}", **query) for i in range(count)]


@pytest_twisted.ensureDeferred
async def test_crawl_delay_paces_one_request_at_a_time(mock_site: MockSite) -> None:
    """Crawl-delay 0.3 gives gaps of at least 0.3 s and one request in flight."""
    mock_site.set_robots(HOST, f"User-agent: *\nCrawl-delay: {CRAWL_DELAY}\n")
    urls = pages(mock_site, HOST, 5, delay=0.05)
    settings = {**SLOTKIT, "ROBOTSTXT_OBEY": True, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 5
    assert min(result.dispatch_gaps(HOST, path_prefix="/page")) >= CRAWL_DELAY - 0.001
    assert mock_site.recorder.max_in_flight[HOST] == 1


@pytest_twisted.ensureDeferred
async def test_a_crawl_delay_of_zero_still_sends_one_request_at_a_time(mock_site: MockSite) -> None:
    """``Crawl-delay: 0`` is a valid directive: delay 0 and concurrency 1 (it was ignored)."""
    mock_site.set_robots(HOST, "User-agent: *\nCrawl-delay: 0\n")
    urls = pages(mock_site, HOST, 4, delay=0.05)
    settings = {**SLOTKIT, "ROBOTSTXT_OBEY": True, "CONCURRENT_REQUESTS_PER_DOMAIN": 4}
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 4
    assert mock_site.recorder.max_in_flight[HOST] == 1


@pytest_twisted.ensureDeferred
async def test_a_shorter_crawl_delay_replaces_download_delay_and_says_so(
    mock_site: MockSite,
) -> None:
    """The spec: a Crawl-delay overrides DOWNLOAD_DELAY, downwards too. A probe of a
    startproject project (DOWNLOAD_DELAY = 1) saw it go faster with no word; an INFO
    line names both and the way to keep the longer delay."""
    mock_site.set_robots(HOST, "User-agent: *\nCrawl-delay: 0.1\n")
    settings = {**SLOTKIT, "ROBOTSTXT_OBEY": True, "DOWNLOAD_DELAY": 0.6}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 3))
    assert len(result.responses) == 3
    assert max(result.dispatch_gaps(HOST, path_prefix="/page")) < 0.6
    assert (
        "scope '127.0.0.1' waits its robots.txt Crawl-delay 0.1s between requests, in place "
        "of the longer 0.6s from DOWNLOAD_DELAY" in result.log_text
    )
    assert result.log_text.count("in place of the longer") == 1


@pytest_twisted.ensureDeferred
async def test_crawl_delay_is_a_floor_under_default_jitter(mock_site: MockSite) -> None:
    """With RANDOMIZE_DOWNLOAD_DELAY's ±50 % on, no gap is shorter than the Crawl-delay.

    An acceptance probe saw 0.19 s gaps under a 0.3 s Crawl-delay: the jitter
    drawn for the robots.txt request itself, and the jitter's lower half.
    """
    mock_site.set_robots(HOST, f"User-agent: *\nCrawl-delay: {CRAWL_DELAY}\n")
    urls = pages(mock_site, HOST, 6)
    settings = {"DOWNLOADER": "slotkit.Downloader", "ROBOTSTXT_OBEY": True}
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 6
    gaps = result.dispatch_gaps(HOST)  # robots.txt first, then the pages
    assert min(gaps) >= CRAWL_DELAY - 0.001
    # The jitter's top (x1.5) plus room for late timers on a loaded machine: an
    # upper bound only says the crawl is not needlessly slow.
    assert max(gaps) <= CRAWL_DELAY * 1.5 + 0.5


@pytest_twisted.ensureDeferred
async def test_rampup_never_goes_faster_than_the_crawl_delay(mock_site: MockSite) -> None:
    """An acceptance probe: a ``"rampup": True`` scope took a 0.5 s Crawl-delay down
    to 0 a step per window (shortest gap 4 ms) and, given a concurrency, started
    there. The Crawl-delay is rampup's floor, and robots.txt's concurrency of 1 its
    ceiling."""
    mock_site.set_robots(HOST, "User-agent: *\nCrawl-delay: 0.2\n")
    settings = {
        **SLOTKIT,
        "ROBOTSTXT_OBEY": True,
        "BACKOFF_WINDOW": 0.3,  # a rampup step every 0.3 s if nothing stopped it
        "THROTTLING_SCOPES": {HOST: {"rampup": True}},
    }
    urls = pages(mock_site, HOST, 10, delay=0.05)
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 10
    assert min(result.dispatch_gaps(HOST)) >= 0.2 - 0.001
    assert mock_site.recorder.max_in_flight[HOST] == 1


@pytest_twisted.ensureDeferred
async def test_crawl_delay_is_capped(mock_site: MockSite) -> None:
    """A Crawl-delay above THROTTLING_ROBOTSTXT_MAX_DELAY is cut to the cap."""
    mock_site.set_robots(HOST, "User-agent: *\nCrawl-delay: 3600\n")
    settings = {**SLOTKIT, "ROBOTSTXT_OBEY": True, "THROTTLING_ROBOTSTXT_MAX_DELAY": 0.2}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 3))
    assert len(result.responses) == 3
    gaps = result.dispatch_gaps(HOST, path_prefix="/page")
    assert min(gaps) >= 0.2 - 0.001
    assert max(gaps) < 1.0
    assert "THROTTLING_ROBOTSTXT_MAX_DELAY" in result.log_text


@pytest.mark.parametrize("setting", ["THROTTLING_SCOPES", "DOWNLOAD_SLOTS"])
@pytest_twisted.ensureDeferred
async def test_faster_configuration_wins_with_one_warning(
    mock_site: MockSite, setting: str
) -> None:
    """A scope faster than Crawl-delay is respected and warned about once.

    For a DOWNLOAD_SLOTS entry the warning names DOWNLOAD_SLOTS instead of
    advising a key DOWNLOAD_SLOTS refuses.
    """
    mock_site.set_robots(HOST, "User-agent: *\nCrawl-delay: 5\n")
    settings = {
        **SLOTKIT,
        "ROBOTSTXT_OBEY": True,
        setting: {HOST: {"delay": 0.0, "concurrency": 4}},
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 4))
    assert len(result.responses) == 4
    assert result.log_text.count("more aggressive than its robots.txt") == 1
    assert "delay 0s (Crawl-delay 5s)" in result.log_text
    if setting == "DOWNLOAD_SLOTS":
        assert "configured in DOWNLOAD_SLOTS;" in result.log_text
        assert "THROTTLING_SCOPES[" not in result.log_text


@pytest_twisted.ensureDeferred
async def test_ignore_robots_txt_silences_the_warning(mock_site: MockSite) -> None:
    """ignore_robots_txt keeps the configured values without a warning."""
    mock_site.set_robots(HOST, "User-agent: *\nCrawl-delay: 5\n")
    scope = {"delay": 0.0, "ignore_robots_txt": True}
    settings = {**SLOTKIT, "ROBOTSTXT_OBEY": True, "THROTTLING_SCOPES": {HOST: scope}}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 2))
    assert len(result.responses) == 2
    assert "more aggressive" not in result.log_text


@pytest_twisted.ensureDeferred
async def test_robots_download_never_deadlocks_with_concurrency_one(mock_site: MockSite) -> None:
    """ROBOTSTXT_OBEY with scope concurrency 1: robots.txt goes first, then the pages."""
    mock_site.set_robots(HOST, "User-agent: *\nAllow: /\n")
    settings = {**SLOTKIT, "ROBOTSTXT_OBEY": True, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 5), crawl_timeout=15)
    assert result.finish_reason == "finished"
    assert len(result.responses) == 5


@pytest_twisted.ensureDeferred
async def test_crawl_delay_off_when_throttling_robotstxt_obey_is_false(mock_site: MockSite) -> None:
    """THROTTLING_ROBOTSTXT_OBEY = False keeps robots.txt for access rules only."""
    mock_site.set_robots(HOST, "User-agent: *\nCrawl-delay: 5\n")
    settings = {**SLOTKIT, "ROBOTSTXT_OBEY": True, "THROTTLING_ROBOTSTXT_OBEY": False}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 3), crawl_timeout=10)
    assert len(result.responses) == 3
    assert result.duration < 4


@pytest.mark.parametrize(
    "queue", ["scrapy.pqueues.ScrapyPriorityQueue", None], ids=["scrapy-queue", "default-queue"]
)
@pytest_twisted.ensureDeferred
async def test_ip_scope_spans_hostnames_with_one_address(
    mock_site: MockSite, cached_names: dict[str, str], queue: str | None
) -> None:
    """Two host names resolving to one address share CONCURRENT_REQUESTS_PER_IP.

    With the queue left at Scrapy's default (which refuses per-IP limits)
    slotkit's own queue takes its place, as the spec says the setting alone
    enables the limit.
    """
    hosts = {"a.example.test": HOST, "b.example.test": HOST}
    cached_names.update(hosts)
    for name, address in hosts.items():
        dnscache[name] = address
    urls = [
        f"http://{name}:{mock_site.port}/page/{i}?delay=0.2" for i in range(4) for name in hosts
    ]
    settings = {
        **SLOTKIT,
        "CONCURRENT_REQUESTS_PER_IP": 2,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        **({"SCHEDULER_PRIORITY_QUEUE": queue} if queue else {}),
    }
    result = await run_crawl(ListSpider, settings, urls=urls, resolve=hosts)
    assert len(result.responses) == 8
    assert mock_site.recorder.max_concurrency() == 2


@pytest_twisted.ensureDeferred
async def test_hosts_not_in_the_dns_cache_are_looked_up_first(mock_site: MockSite) -> None:
    """Before Scrapy's DNS cache knows a host, slotkit looks it up once: the address
    limit holds from the first request (it used to apply only once the cache filled)."""
    hosts = {"c.example.test": HOST, "d.example.test": HOST}
    urls = [
        f"http://{name}:{mock_site.port}/page/{i}?delay=0.2" for i in range(3) for name in hosts
    ]
    settings = {
        **SLOTKIT,
        "CONCURRENT_REQUESTS_PER_IP": 1,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue",
    }
    result = await run_crawl(ListSpider, settings, urls=urls, resolve=hosts)
    assert len(result.responses) == 6
    assert mock_site.recorder.max_concurrency() == 1


@pytest_twisted.ensureDeferred
async def test_stock_queue_with_per_ip_names_the_fix(mock_site: MockSite) -> None:
    """Scrapy's queue chosen explicitly with CONCURRENT_REQUESTS_PER_IP fails, naming the fix."""
    settings = {
        **SLOTKIT,
        "CONCURRENT_REQUESTS_PER_IP": 2,
        "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue",
    }
    with pytest.raises(SettingsError, match=r"slotkit\.ThrottlingAwarePriorityQueue"):
        await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 1))


@pytest_twisted.ensureDeferred
async def test_registrable_domain_grouping(mock_site: MockSite) -> None:
    """THROTTLING_DOMAIN_GROUPING = 'registrable_domain' shares one scope across subdomains."""
    hosts = {"books.toscrape.com": HOST, "quotes.toscrape.com": "127.0.0.2"}
    urls = [
        f"http://{name}:{mock_site.port}/page/{i}?delay=0.2" for i in range(3) for name in hosts
    ]
    settings = {
        **SLOTKIT,
        "THROTTLING_DOMAIN_GROUPING": "registrable_domain",
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
    }
    result = await run_crawl(ListSpider, settings, urls=urls, resolve=hosts)
    assert {r.download_slot for r in result.responses} == {"toscrape.com"}
    assert mock_site.recorder.max_concurrency() == 2


BOOKS = "books.toscrape.com"


@pytest.mark.parametrize(
    ("settings", "meta"),
    [
        ({"THROTTLING_DOMAIN_GROUPING": "registrable_domain"}, {}),
        ({}, {"download_slot": "books"}),
        ({}, {"throttling_scopes": ["api"]}),
    ],
    ids=["registrable-domain", "download-slot", "throttling-scopes-meta"],
)
@pytest_twisted.ensureDeferred
async def test_crawl_delay_holds_a_site_whose_scope_has_another_name(
    mock_site: MockSite, settings: dict[str, Any], meta: dict[str, Any]
) -> None:
    """Acceptance probe: grouped under toscrape.com (or a download_slot, or a
    custom scope) books.toscrape.com's 1 s Crawl-delay was ignored (3 ms gaps,
    2 in flight). The site's own scope now joins the request's scopes."""
    mock_site.set_robots(BOOKS, f"User-agent: *\nCrawl-delay: {CRAWL_DELAY}\n")
    urls = [
        {"url": f"http://{BOOKS}:{mock_site.port}/page/{i}?delay=0.05", "meta": meta}
        for i in range(4)
    ]
    settings = {
        **SLOTKIT,
        **settings,
        "ROBOTSTXT_OBEY": True,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
    }
    result = await run_crawl(ListSpider, settings, urls=urls, resolve={BOOKS: HOST})
    assert len(result.responses) == 4
    assert min(result.dispatch_gaps(BOOKS, path_prefix="/page")) >= CRAWL_DELAY - 0.001
    assert mock_site.recorder.max_in_flight[BOOKS] == 1
    assert "more aggressive" not in result.log_text


@pytest_twisted.ensureDeferred
async def test_one_sites_crawl_delay_does_not_hold_the_rest_of_its_group(
    mock_site: MockSite,
) -> None:
    """Review: with slotkit's queue, the paced site's requests queued under the
    group's key before its robots.txt was read held the group's other sites
    behind them. They move to their site's own sub-queue. (Scrapy's own
    scheduler hands them to the downloader, where they hold CONCURRENT_REQUESTS
    places while they wait: see docs/scheduling.rst.)"""
    quotes = "quotes.toscrape.com"
    mock_site.set_robots(BOOKS, "User-agent: *\nCrawl-delay: 0.5\n")
    urls = [f"http://{BOOKS}:{mock_site.port}/page/{i}" for i in range(6)]
    urls += [f"http://{quotes}:{mock_site.port}/page/{i}" for i in range(8)]
    settings = {
        **SLOTKIT,
        "SCHEDULER": "slotkit.ThrottlingAwareScheduler",
        "SCHEDULER_PRIORITY_QUEUE": "slotkit.ThrottlingAwarePriorityQueue",
        "ROBOTSTXT_OBEY": True,
        "THROTTLING_DOMAIN_GROUPING": "registrable_domain",
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "CONCURRENT_REQUESTS": 4,
    }
    result = await run_crawl(ListSpider, settings, urls=urls, resolve={BOOKS: HOST, quotes: HOST})
    assert len(result.responses) == 14
    books = sorted(result.dispatch_times(BOOKS, "/page"))
    assert max(result.dispatch_times(quotes, "/page")) < books[2]


@pytest_twisted.ensureDeferred
async def test_a_configured_group_scope_keeps_its_pace_with_one_warning(
    mock_site: MockSite,
) -> None:
    """A group scope with its own THROTTLING_SCOPES delay is respected, as a site scope
    would be: the site's Crawl-delay does not join, and one warning says so."""
    mock_site.set_robots(BOOKS, "User-agent: *\nCrawl-delay: 5\n")
    urls = [f"http://{BOOKS}:{mock_site.port}/page/{i}?delay=0.2" for i in range(3)]
    settings = {
        **SLOTKIT,
        "ROBOTSTXT_OBEY": True,
        "THROTTLING_DOMAIN_GROUPING": "registrable_domain",
        "THROTTLING_SCOPES": {"toscrape.com": {"delay": 0.0, "concurrency": 2}},
    }
    result = await run_crawl(ListSpider, settings, urls=urls, resolve={BOOKS: HOST})
    assert len(result.responses) == 3
    assert mock_site.recorder.max_in_flight[BOOKS] == 2  # robots.txt would allow 1
    assert result.log_text.count("more aggressive than its robots.txt") == 1
    assert "scope 'toscrape.com'" in result.log_text


def test_bad_grouping_is_refused() -> None:
    """An unknown THROTTLING_DOMAIN_GROUPING value names the accepted ones."""
    from scrapy.settings import Settings

    from slotkit.settings import ThrottlingSettings

    with pytest.raises(SettingsError, match="registrable_domain"):
        ThrottlingSettings.from_settings(Settings({"THROTTLING_DOMAIN_GROUPING": "registrable"}))


def test_crawl_delay_warning_names_the_setting_and_how_to_silence_it() -> None:
    """The advice fits where the faster values came from: DOWNLOAD_SLOTS refuses
    'ignore_robots_txt', so its values have to move to THROTTLING_SCOPES."""
    from scrapy.settings import Settings

    from slotkit.robots import apply_crawl_delay
    from slotkit.settings import ThrottlingSettings

    def warning(settings: dict[str, Any]) -> str:
        config = ThrottlingSettings.from_settings(Settings(settings)).scope_config(HOST, "domain")
        text = apply_crawl_delay(config, 5.0)[1]
        assert text is not None
        return text

    scopes = warning({"THROTTLING_SCOPES": {HOST: {"delay": 0.0}}})
    assert "configured in THROTTLING_SCOPES;" in scopes
    assert "set 'ignore_robots_txt': True in that entry" in scopes
    assert "DOWNLOAD_SLOTS" not in scopes
    slots = warning({"DOWNLOAD_SLOTS": {HOST: {"delay": 0.0, "concurrency": 4}}})
    assert slots.startswith("delay 0s (Crawl-delay 5s), concurrency 4 (robots.txt implies 1)")
    assert "configured in DOWNLOAD_SLOTS;" in slots
    assert "move the entry to THROTTLING_SCOPES and set 'ignore_robots_txt': True" in slots
    both = warning(
        {
            "DOWNLOAD_SLOTS": {HOST: {"delay": 0.0}},
            "THROTTLING_SCOPES": {HOST: {"concurrency": 4}},
        }
    )
    assert "configured in DOWNLOAD_SLOTS and THROTTLING_SCOPES;" in both
    # Following the advice silences it: a THROTTLING_SCOPES entry for the same id
    # merges with the DOWNLOAD_SLOTS one.
    config = ThrottlingSettings.from_settings(
        Settings(
            {
                "DOWNLOAD_SLOTS": {HOST: {"delay": 0.0}},
                "THROTTLING_SCOPES": {HOST: {"ignore_robots_txt": True}},
            }
        )
    ).scope_config(HOST, "domain")
    assert apply_crawl_delay(config, 5.0)[1] is None


def test_a_configured_concurrency_capped_by_concurrent_requests_is_kept_over_robots() -> None:
    """Acceptance probe: a THROTTLING_SCOPES concurrency of 32 under
    CONCURRENT_REQUESTS = 16 was taken for a default, silently replaced by the
    1 robots.txt implies; 16 is kept, with the warning a configured value gets."""
    from scrapy.settings import Settings

    from slotkit.robots import apply_crawl_delay
    from slotkit.settings import ThrottlingSettings

    settings = {"CONCURRENT_REQUESTS": 16, "THROTTLING_SCOPES": {HOST: {"concurrency": 32}}}
    config = ThrottlingSettings.from_settings(Settings(settings)).scope_config(HOST, "domain")
    updated, warning = apply_crawl_delay(config, 0.3)
    assert updated.concurrency == 16
    assert warning is not None
    assert warning.startswith("concurrency 16 (robots.txt implies 1)")
    assert "configured in THROTTLING_SCOPES;" in warning
    # A default capped by CONCURRENT_REQUESTS is still robots.txt's to set.
    settings = {"CONCURRENT_REQUESTS": 4, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}
    config = ThrottlingSettings.from_settings(Settings(settings)).scope_config(HOST, "domain")
    updated, warning = apply_crawl_delay(config, 0.3)
    assert updated.concurrency == 1
    assert warning is None


@pytest.mark.parametrize("table", ["THROTTLING_SCOPES", "DOWNLOAD_SLOTS"])
@pytest_twisted.ensureDeferred
async def test_an_entry_named_host_port_applies_to_that_port(
    mock_site: MockSite, table: str
) -> None:
    """The spec's recipes name sites by netloc: an entry keyed "127.0.0.1:<port>" limits
    that port's requests (their scope and download_slot are the netloc); another host on
    the same port keeps the defaults."""
    netloc = f"{HOST}:{mock_site.port}"
    other = "127.0.0.2"
    urls = pages(mock_site, HOST, 4, delay=0.2) + pages(mock_site, other, 4, delay=0.2)
    settings = {**SLOTKIT, table: {netloc: {"concurrency": 1}}}
    result = await run_crawl(ListSpider, settings, urls=urls)
    result.assert_no_unhandled_errors()
    assert len(result.responses) == 8
    assert mock_site.recorder.max_in_flight[HOST] == 1
    assert mock_site.recorder.max_in_flight[other] > 1
    slots = {r.url.split("/")[2]: r.download_slot for r in result.responses}
    assert slots[netloc] == netloc
    assert slots[f"{other}:{mock_site.port}"] == other


@pytest_twisted.ensureDeferred
async def test_crawl_delay_reaches_a_scope_named_host_port(mock_site: MockSite) -> None:
    """robots.txt's Crawl-delay applies to a site whose entry is keyed by its netloc."""
    mock_site.set_robots(HOST, f"User-agent: *\nCrawl-delay: {CRAWL_DELAY}\n")
    netloc = f"{HOST}:{mock_site.port}"
    settings = {
        **SLOTKIT,
        "ROBOTSTXT_OBEY": True,
        "THROTTLING_SCOPES": {netloc: {"ignore_robots_txt": False}},
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 4, delay=0.05))
    assert len(result.responses) == 4
    assert min(result.dispatch_gaps(HOST, path_prefix="/page")) >= CRAWL_DELAY - 0.001


class PaceThroughSlots:
    """An older plugin's way to pace a site: assign a Slot when the engine starts."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        crawler.signals.connect(self.engine_started, signal=signals.engine_started)

    @classmethod
    def from_crawler(cls, crawler: Any) -> PaceThroughSlots:
        return cls(crawler)

    def engine_started(self) -> None:
        self.crawler.engine.downloader.slots[HOST] = Slot(1, PLUGIN_DELAY, 0)


PLUGIN_DELAY = 0.4


@pytest_twisted.ensureDeferred
async def test_a_crawl_delay_does_not_undo_a_slot_a_plugin_assigned(mock_site: MockSite) -> None:
    """A review: the Crawl-delay, arriving after the plugin spoke, reset its 0.4 s to 0.1 s.

    With Scrapy's downloader the plugin's slot holds; here it outranks the
    Crawl-delay as a THROTTLING_SCOPES entry would.
    """
    mock_site.set_robots(HOST, "User-agent: *\nCrawl-delay: 0.1\n")
    settings = {
        **SLOTKIT,
        "ROBOTSTXT_OBEY": True,
        "EXTENSIONS": {f"{__name__}.PaceThroughSlots": 0},
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 3))
    assert len(result.responses) == 3
    assert min(result.dispatch_gaps(HOST, path_prefix="/page")) >= PLUGIN_DELAY - 0.001
