"""robots.txt belongs to one port: which scopes its Crawl-delay reaches."""

from __future__ import annotations

from typing import Any

from scrapy import Request, signals
from scrapy.utils.test import get_crawler

from slotkit.robots import CrawlDelays


class Parser:
    """The part of a robots.txt parser slotkit asks."""

    def crawl_delay(self, agent: Any) -> float:
        return 2.0


def delays_after_robots_of(url: str, settings: dict[str, Any]) -> dict[str, float]:
    crawler = get_crawler(settings_dict=settings)
    found: list[str] = []
    delays = CrawlDelays(crawler, 60.0, lambda scope_id, delay: found.append(scope_id))
    crawler.signals.send_catch_log(
        signals.robots_parsed, robotparser=Parser(), request=Request(url)
    )
    assert sorted(found) == sorted(delays.delays)
    return delays.delays


def test_a_port_with_its_own_scope_takes_its_robots_txt_alone() -> None:
    """With a THROTTLING_SCOPES entry for 127.0.0.1:8123, that port's Crawl-delay does
    not slow the host's other ports (they share the host's scope)."""
    settings = {"THROTTLING_SCOPES": {"127.0.0.1:8123": {"concurrency": 2}}}
    delays = delays_after_robots_of("http://127.0.0.1:8123/robots.txt", settings)
    assert delays == {"127.0.0.1:8123": 2.0}


def test_otherwise_the_host_scope_takes_it_as_scrapys_slots_would() -> None:
    delays = delays_after_robots_of("http://127.0.0.1:8123/robots.txt", {})
    assert delays == {"127.0.0.1": 2.0, "127.0.0.1:8123": 2.0}
    assert delays_after_robots_of("https://example.com/robots.txt", {}) == {"example.com": 2.0}


class DelayParser:
    def __init__(self, delay: float) -> None:
        self.delay = delay

    def crawl_delay(self, agent: Any) -> float:
        return self.delay


def test_ports_sharing_the_host_scope_get_the_largest_crawl_delay() -> None:
    """A probe: port 8771 asked for 1 s and 8772 for 0.4 s; the host's shared scope
    took whichever robots.txt was parsed last, and 8771 got 0.5 s gaps."""
    crawler = get_crawler()
    applied: dict[str, float] = {}
    delays = CrawlDelays(crawler, 60.0, applied.__setitem__)
    for port, delay in ((8771, 1.0), (8772, 0.4)):
        crawler.signals.send_catch_log(
            signals.robots_parsed,
            robotparser=DelayParser(delay),
            request=Request(f"http://127.0.0.1:{port}/robots.txt"),
        )
    assert delays.delays["127.0.0.1"] == 1.0
    assert applied["127.0.0.1"] == 1.0
    assert delays.delays["127.0.0.1:8772"] == 0.4  # a port's own figure stays its own
