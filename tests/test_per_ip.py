"""CONCURRENT_REQUESTS_PER_IP joins every request's scopes, whoever chose the others."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from scrapy.resolver import dnscache
from twisted.internet.defer import Deferred, fail
from twisted.internet.error import DNSLookupError
from twisted.internet.interfaces import IResolverSimple
from zope.interface import implementer

from slotkit import ThrottlingManager
from tests.crawl import EPOLL_REACTOR, ListSpider, run_crawl, run_crawl_subprocess
from tests.server import MockSite

pytestmark = pytest.mark.integration

HOSTS = {"a.example.test": "127.0.0.1", "b.example.test": "127.0.0.1"}


class GroupingManager:
    """A duck-typed manager (the spec's "alternative domain" style): one scope for all."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler

    def get_scopes(self, request: Any) -> str:
        return "example.test"


class SubclassManager(ThrottlingManager):
    def get_scopes(self, request: Any) -> str:
        return "example.test"


@pytest.mark.parametrize("how", ["meta", "duck", "subclass"])
@pytest_twisted.ensureDeferred
async def test_the_address_limit_holds_whatever_names_the_scopes(
    mock_site: MockSite,
    cached_names: dict[str, str],
    how: str,
) -> None:
    """Two names on one address, per-IP limit 1: never two requests at once at the server."""
    cached_names.update(HOSTS)
    for name, address in HOSTS.items():
        dnscache[name] = address
    meta = {"throttling_scopes": "example.test"} if how == "meta" else {}
    urls = [
        {"url": f"http://{name}:{mock_site.port}/page/{i}?delay=0.1", "meta": meta}
        for i in range(4)
        for name in HOSTS
    ]
    settings: dict[str, Any] = {
        "DOWNLOADER": "slotkit.Downloader",
        "CONCURRENT_REQUESTS_PER_IP": 1,
        "THROTTLING_SCOPES": {"example.test": {"concurrency": 8}},
    }
    if how != "meta":
        settings["THROTTLING_MANAGER"] = GroupingManager if how == "duck" else SubclassManager
    result = await run_crawl(ListSpider, settings, urls=urls, resolve=HOSTS)
    result.assert_no_unhandled_errors()
    assert len(result.responses) == 8
    assert mock_site.recorder.max_concurrency() == 1


@pytest_twisted.ensureDeferred
async def test_the_address_limit_holds_from_a_hosts_first_request(mock_site: MockSite) -> None:
    """Nothing in Scrapy's DNS cache yet: slotkit looks each name up once before its
    first request, so two names on one address never have three requests in flight."""
    for name in HOSTS:
        assert dnscache.get(name) is None
    urls = [
        f"http://{name}:{mock_site.port}/page/{i}?delay=0.2" for i in range(4) for name in HOSTS
    ]
    settings: dict[str, Any] = {"DOWNLOADER": "slotkit.Downloader", "CONCURRENT_REQUESTS_PER_IP": 2}
    result = await run_crawl(ListSpider, settings, urls=urls, resolve=HOSTS)
    result.assert_no_unhandled_errors()
    assert len(result.responses) == 8
    assert mock_site.recorder.max_concurrency() == 2


async def crawl_with_resolver(
    resolver: Any, settings: dict[str, Any], url: str, **kwargs: Any
) -> Any:
    """One crawl of *url* with *resolver* installed on the reactor, restored after."""
    from twisted.internet import reactor

    old = reactor.resolver  # type: ignore[attr-defined]
    reactor.installResolver(resolver)  # type: ignore[attr-defined]
    try:
        return await run_crawl(ListSpider, settings, urls=[url], **kwargs)
    finally:
        reactor.installResolver(old)  # type: ignore[attr-defined]


@implementer(IResolverSimple)
class _NoSuchName:
    """An IResolverSimple that knows no name, at once (no network in tests)."""

    def getHostByName(self, name: str, timeout: Any = ()) -> Deferred[str]:
        return fail(DNSLookupError(f"no such name: {name}"))


@pytest_twisted.ensureDeferred
async def test_a_name_that_does_not_resolve_ends_with_scrapys_dns_error(
    mock_site: MockSite,
) -> None:
    """The lookup failing is not slotkit's business: the request goes on and its
    download fails as it would without slotkit, once."""
    settings: dict[str, Any] = {
        "DOWNLOADER": "slotkit.Downloader",
        "CONCURRENT_REQUESTS_PER_IP": 2,
        "RETRY_ENABLED": False,
    }
    url = f"http://nowhere.example.test:{mock_site.port}/page/1"
    result = await crawl_with_resolver(_NoSuchName(), settings, url)
    assert not result.responses
    assert [error.type for error in result.errors] == ["CannotResolveHostError"]  # Scrapy 2.19


@implementer(IResolverSimple)
class _Silent:
    """An IResolverSimple that never answers (a resolver stuck on a dead server)."""

    def getHostByName(self, name: str, timeout: Any = ()) -> Deferred[str]:
        return Deferred()


@pytest_twisted.ensureDeferred
async def test_a_resolver_that_never_answers_holds_nothing_for_ever(mock_site: MockSite) -> None:
    """The address lookup gives up after DNS_TIMEOUT, and the request then ends as its
    download would without slotkit (here: DOWNLOAD_TIMEOUT), exactly once."""
    settings: dict[str, Any] = {
        "DOWNLOADER": "slotkit.Downloader",
        "CONCURRENT_REQUESTS_PER_IP": 2,
        "RETRY_ENABLED": False,
        "DNS_TIMEOUT": 0.3,
        "DOWNLOAD_TIMEOUT": 0.5,
    }
    url = f"http://silent.example.test:{mock_site.port}/page/1"
    result = await crawl_with_resolver(_Silent(), settings, url, crawl_timeout=20.0)
    assert result.finish_reason == "finished"
    assert not result.responses
    assert len(result.errors) == 1


@pytest_twisted.ensureDeferred
async def test_a_closing_spider_does_not_wait_for_a_lookup(mock_site: MockSite) -> None:
    """CLOSESPIDER_TIMEOUT while a lookup hangs: the request ends at once (it never
    reached the gate's queue, so it meets the closed gate), and the crawl closes."""
    settings: dict[str, Any] = {
        "DOWNLOADER": "slotkit.Downloader",
        "CONCURRENT_REQUESTS_PER_IP": 2,
        "DNS_TIMEOUT": 60,
        "CLOSESPIDER_TIMEOUT": 0.5,
    }
    url = f"http://silent.example.test:{mock_site.port}/page/1"
    result = await crawl_with_resolver(_Silent(), settings, url, crawl_timeout=20.0)
    assert result.finish_reason == "closespider_timeout"
    assert [error.type for error in result.errors] == ["GateClosedError"]
    assert result.stats["throttling/requests_unsent_at_close"] == 1


def install_silent_resolver(site: MockSite) -> None:
    """``site_setup`` hook of a subprocess crawl: its reactor's resolver never answers."""
    from twisted.internet import reactor

    reactor.installResolver(_Silent())  # type: ignore[attr-defined]


def test_on_a_plain_twisted_reactor_a_request_released_at_close_is_not_sent() -> None:
    """There a released lookup resumes the request at once: the gate must already be
    closed, or the request would be downloaded by a closing spider."""
    data = run_crawl_subprocess(
        reactor=EPOLL_REACTOR,
        settings={
            "DOWNLOADER": "slotkit.Downloader",
            "CONCURRENT_REQUESTS_PER_IP": 2,
            "DNS_TIMEOUT": 60,
            "CLOSESPIDER_TIMEOUT": 0.5,
        },
        spider_kwargs={"urls": ["http://silent.example.test:{port}/page/1"]},
        site_setup="tests.test_per_ip.install_silent_resolver",
    )
    assert data["reactor"] == EPOLL_REACTOR
    assert data["responses"] == []
    assert [error["type"] for error in data["errors"]] == ["GateClosedError"]
    assert data["stats"]["throttling/requests_unsent_at_close"] == 1
