"""slotkit.dns: addresses for IP scopes, from Scrapy's cache or one lookup per host."""

from __future__ import annotations

from typing import Any

from scrapy import Request
from scrapy.resolver import dnscache
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred
from twisted.internet.error import DNSLookupError
from twisted.internet.task import Clock

from slotkit.dns import AddressLookups, cached_ip


class Resolving(Clock):
    """A reactor stand-in whose ``resolve`` answers when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []
        self.pending: dict[str, Deferred[str]] = {}

    def resolve(self, name: str, timeout: Any = ()) -> Deferred[str]:
        self.asked.append(name)
        self.pending[name] = Deferred()
        return self.pending[name]


def test_addresses_come_from_scrapys_cache_or_are_literals() -> None:
    dnscache["cached.example.test"] = "10.0.0.7"
    try:
        assert cached_ip("cached.example.test") == "10.0.0.7"
    finally:
        dnscache.pop("cached.example.test", None)
    assert cached_ip("192.0.2.1") == "192.0.2.1"
    assert cached_ip("[::1]") == "[::1]"
    assert cached_ip("unknown.example.test") is None


def test_one_lookup_per_host_however_many_requests_wait_for_it() -> None:
    reactor = Resolving()
    lookups = AddressLookups(reactor)
    assert lookups.needed("a.example.test")
    fired: list[int] = []
    for n in range(3):
        lookups.lookup("a.example.test").addCallback(lambda _, n=n: fired.append(n))
    assert reactor.asked == ["a.example.test"]
    reactor.pending["a.example.test"].callback("10.0.0.1")
    assert fired == [0, 1, 2]
    assert cached_ip("a.example.test") == "10.0.0.1"
    assert not lookups.needed("a.example.test")


def test_a_failed_lookup_is_not_repeated_and_never_fails_the_waiter() -> None:
    reactor = Resolving()
    lookups = AddressLookups(reactor)
    done = lookups.lookup("gone.example.test")
    reactor.pending["gone.example.test"].errback(DNSLookupError("gone"))
    results: list[Any] = []
    done.addBoth(results.append)
    assert results == [None]
    assert cached_ip("gone.example.test") is None
    assert not lookups.needed("gone.example.test")
    assert reactor.asked == ["gone.example.test"]


def test_failed_hosts_remembered_are_bounded(monkeypatch: Any) -> None:
    """A broad crawl of dead domains kept every one of them for good (an
    acceptance probe: 40,000 entries); the oldest go, and would be asked again."""
    monkeypatch.setattr("slotkit.dns.FAILED_HOSTS_KEPT", 3)
    reactor = Resolving()
    lookups = AddressLookups(reactor)
    hosts = [f"gone{n}.example.test" for n in range(5)]
    for host in hosts:
        lookups.lookup(host)
        reactor.pending[host].errback(DNSLookupError("gone"))
    assert [lookups.needed(host) for host in hosts] == [True, True, False, False, False]


def test_without_a_resolver_nothing_is_looked_up() -> None:
    """A test clock (or a loop without resolve()) leaves IP scopes to Scrapy's cache."""
    assert not AddressLookups(Clock()).needed("a.example.test")


class SilentReactor(Clock):
    """A Clock whose resolver never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def resolve(self, name: str, timeout: Any = ()) -> Deferred[str]:
        self.asked.append(name)
        return Deferred()


def test_a_lookup_never_answered_gives_up_after_the_dns_timeout() -> None:
    reactor = SilentReactor()
    lookups = AddressLookups(reactor, timeout=5.0)
    fired: list[Any] = []
    lookups.lookup("slow.example.test").addBoth(fired.append)
    reactor.advance(4.9)
    assert fired == []
    reactor.advance(0.1)
    assert fired == [None]
    assert not lookups.needed("slow.example.test")
    assert reactor.getDelayedCalls() == []


def test_close_lets_every_waiting_request_go_and_names_them() -> None:
    reactor = SilentReactor()
    lookups = AddressLookups(reactor, timeout=60.0)
    first, second = Request("http://a.example.test/1"), Request("http://a.example.test/2")
    fired: list[Any] = []
    lookups.lookup("a.example.test", first).addBoth(fired.append)
    lookups.lookup("a.example.test", second).addBoth(fired.append)
    assert lookups.close() == [first, second]
    assert fired == [None, None]
    assert reactor.getDelayedCalls() == []
    assert lookups.close() == []


class NameResolving(Clock):
    """A reactor stand-in with an IHostnameResolver, as Scrapy's CachingHostnameResolver."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, Any]] = []
        self.nameResolver = self

    def resolveHostName(  # noqa: N802
        self,
        receiver: Any,
        hostName: str,
        portNumber: int = 0,
        addressTypes: Any = None,  # noqa: N803
    ) -> Any:
        self.asked.append((hostName, addressTypes))
        receiver.resolutionBegan(None)
        receiver.addressResolved(IPv6Address("TCP", "::5", 0))
        receiver.addressResolved(IPv4Address("TCP", "10.0.0.5", 0))
        receiver.resolutionComplete()
        return None


def test_the_name_resolver_is_asked_for_every_address_family() -> None:
    """An IPv4-only question would leave a caching name resolver's cache (and so the
    host's later connections) without its IPv6 addresses."""
    reactor = NameResolving()
    lookups = AddressLookups(reactor)
    fired: list[Any] = []
    lookups.lookup("dual.example.test").addBoth(fired.append)
    assert reactor.asked == [("dual.example.test", None)]
    assert fired == [None]
    assert cached_ip("dual.example.test") == "::5"


def test_the_resolver_installed_after_the_downloader_is_the_one_asked() -> None:
    """CrawlerProcess installs the crawl's resolver (DNS_RESOLVER) after the engine built
    the downloader: lookups must go to the resolver the downloads use, not the first one."""
    reactor = NameResolving()
    first = reactor.nameResolver
    lookups = AddressLookups(reactor)
    installed = NameResolving()
    reactor.nameResolver = installed
    lookups.lookup("late.example.test")
    assert installed.asked == [("late.example.test", None)]
    assert first.asked == []
