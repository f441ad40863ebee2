"""The IP address of a host, for IP scopes (``CONCURRENT_REQUESTS_PER_IP``).

Scrapy's DNS cache is read first. A host it does not know yet is looked up
once through the reactor's resolver (:class:`AddressLookups`) before its
first request is given scopes, so the address limit holds from a host's
first request instead of once its first connection filled the cache. What
slotkit looked up itself is kept in a cache of its own: the resolver a
crawl runs with does not always fill Scrapy's.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import socket
from typing import TYPE_CHECKING, Any

from scrapy.resolver import dnscache
from scrapy.utils.datatypes import LocalCache
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred
from twisted.internet.error import DNSLookupError
from twisted.internet.interfaces import IResolutionReceiver
from zope.interface import implementer

if TYPE_CHECKING:
    from scrapy import Request

__all__ = ["AddressLookups", "address_of", "cached_ip"]

logger = logging.getLogger("slotkit")

#: Addresses slotkit looked up itself (host -> address).
_looked_up: LocalCache[str, str] = LocalCache(10000)


def cached_ip(host: str) -> str | None:
    """The address known for *host* (*host* itself if it is an IP), else ``None``."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        return host
    try:
        entry: Any = dnscache.get(host)
    except Exception:
        entry = None
    address = _address(entry)
    return address if address is not None else _looked_up.get(host)


def address_of(request: Request) -> str | None:
    """:func:`cached_ip` of *request*'s host: the IP scope ``CONCURRENT_REQUESTS_PER_IP``
    adds to it, once known."""
    host = urlparse_cached(request).hostname
    return cached_ip(host) if host else None


def _address(entry: Any) -> str | None:
    # CachingThreadedResolver caches the address string; CachingHostnameResolver
    # caches a list of IAddress objects.
    if isinstance(entry, str):
        return entry
    if isinstance(entry, (list, tuple)) and entry:
        return _address(getattr(entry[0], "host", entry[0]))
    return None


#: Schemes whose downloads connect to the URL's host (``s3://``, ``data:``,
#: ``file://`` and test handlers do not: nothing to look up for them).
_LOOKED_UP_SCHEMES = frozenset({"http", "https", "ftp"})
#: Hosts whose lookup failed that a crawl remembers (as many as addresses it keeps).
FAILED_HOSTS_KEPT = 10000


class AddressLookups:
    """Looks up the addresses of hosts not in any cache yet, once per host.

    *reactor* needs ``resolve(name)`` (``IReactorCore``); without it (a test
    clock, a loop with no resolver) nothing is looked up and IP scopes wait
    for Scrapy's cache as before. A failed lookup is remembered as "no
    address": the request goes on with its other scopes, and its download
    reports the DNS error as usual. A lookup unanswered after *timeout*
    seconds (``DNS_TIMEOUT``) counts as failed, and :meth:`close` lets every
    waiting request go, so a resolver that never answers holds no request
    (and no shutdown) for ever.
    """

    def __init__(self, reactor: Any, timeout: float = 60.0) -> None:
        self._reactor = reactor
        # The name resolver first, asking for every address family: Scrapy's
        # CachingHostnameResolver caches whatever it is asked, and an IPv4-only
        # question (what reactor.resolve() asks) would leave its cache, and so
        # every later connection to the host, without the IPv6 addresses.
        self._resolve = getattr(reactor, "resolve", None)
        loop = getattr(reactor, "loop", None)  # slotkit.clock.AsyncioClock, reactorless
        if self._name_resolver is None and self._resolve is None and loop is not None:
            # Scrapy's reactorless downloads never fill its DNS cache: without
            # this, IP scopes of host names would never apply there.
            self._resolve = functools.partial(_resolve_on_loop, loop)
        self._timeout = timeout
        self._pending: dict[str, list[Deferred[None]]] = {}
        self._timers: dict[str, Any] = {}
        self._waiting: dict[Deferred[None], Request] = {}
        #: Hosts whose lookup failed in this crawl (not retried; their downloads
        #: say why): at most FAILED_HOSTS_KEPT, oldest out first, as a broad crawl
        #: of dead domains would grow it for good; one dropped is looked up again.
        self._failed: LocalCache[str, None] = LocalCache(FAILED_HOSTS_KEPT)

    @property
    def _name_resolver(self) -> Any:
        # Read at each lookup, not once: CrawlerProcess installs the crawl's
        # resolver (DNS_RESOLVER, TWISTED_DNS_RESOLVER) after the downloader
        # is built, and downloads use that one.
        return getattr(self._reactor, "nameResolver", None)

    @classmethod
    def for_crawl(cls, reactor: Any, settings: Any) -> AddressLookups:
        """Lookups for a crawl: they wait ``DNS_TIMEOUT``, but never longer than
        ``DOWNLOAD_TIMEOUT``, which would have ended the download by then."""
        timeouts = [
            t
            for t in (settings.getfloat("DNS_TIMEOUT", 60.0), settings.getfloat("DOWNLOAD_TIMEOUT"))
            if t > 0
        ]
        return cls(reactor, min(timeouts) if timeouts else 0.0)

    def lookup_for(self, request: Request) -> Deferred[None] | None:
        """The lookup *request* must wait for before it gets its scopes, if any.

        Only hosts its download would connect to: not other schemes, and not
        through a proxy (which resolves the name itself).
        """
        parsed = urlparse_cached(request)
        host = parsed.hostname
        if (
            host
            and parsed.scheme in _LOOKED_UP_SCHEMES
            and not request.meta.get("proxy")
            and self.needed(host)
        ):
            return self.lookup(host, request)
        return None

    def needed(self, host: str) -> bool:
        """Whether *host* has no known address and no lookup has failed for it."""
        return (
            (self._name_resolver is not None or self._resolve is not None)
            and host not in self._failed
            and cached_ip(host) is None
        )

    def lookup(self, host: str, request: Request | None = None) -> Deferred[None]:
        """Fire (with ``None``, never failing) once *host*'s address is known or unknowable.

        *request*: the request waiting for it, listed by :meth:`close`.
        """
        done: Deferred[None] = Deferred()
        if request is not None:
            self._waiting[done] = request
            done.addBoth(self._forget, done)
        waiting = self._pending.get(host)
        if waiting is not None:
            waiting.append(done)
            return done
        self._pending[host] = [done]
        try:
            resolving = self._start(host)
        except Exception as exc:  # a resolver that raises instead of failing its Deferred
            self._finish(host, None, exc)
            return done
        if host in self._pending and self._timeout > 0:
            self._timers[host] = self._reactor.callLater(
                self._timeout,
                self._finish,
                host,
                None,
                TimeoutError(f"no answer within DNS_TIMEOUT ({self._timeout:g} s)"),
            )
        resolving.addCallbacks(
            lambda address: self._finish(host, address, None),
            lambda failure: self._finish(host, None, failure.value),
        )
        return done

    def _start(self, host: str) -> Deferred[str]:
        if self._name_resolver is not None:
            receiver = _FirstAddress(host)
            self._name_resolver.resolveHostName(receiver, host, 0, None)
            return receiver.deferred
        assert self._resolve is not None
        return self._resolve(host)  # type: ignore[no-any-return]

    def waiting_requests(self) -> list[Request]:
        """The requests waiting for a lookup now."""
        return list(self._waiting.values())

    def close(self) -> list[Request]:
        """Let every request still waiting for a lookup go on (the crawl is closing).

        Returns those requests. Close the gate first: on a plain Twisted
        reactor they resume inside this call.
        """
        released = self.waiting_requests()
        for host in list(self._pending):
            self._finish(host, None, RuntimeError("the downloader closed"))
        return released

    def _forget(self, result: None, done: Deferred[None]) -> None:
        self._waiting.pop(done, None)
        return result

    def _finish(self, host: str, address: str | None, error: BaseException | None) -> None:
        waiting = self._pending.pop(host, None)
        if waiting is None:
            return  # already timed out or closed; a late answer changes nothing
        timer = self._timers.pop(host, None)
        if timer is not None and timer.active():
            timer.cancel()
        if isinstance(address, str) and address:
            _looked_up[host] = address
        else:
            self._failed[host] = None
            logger.debug("slotkit: no address for %s (%s); no IP scope for it", host, error)
        for done in waiting:
            if not done.called:
                done.callback(None)


def _resolve_on_loop(loop: asyncio.AbstractEventLoop, host: str) -> Deferred[str]:
    """The first address of *host*, asked of the event loop (its thread pool)."""

    async def first() -> str:
        infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        if not infos:
            raise DNSLookupError(f"no address for {host}")
        return str(infos[0][4][0])

    return Deferred.fromFuture(asyncio.ensure_future(first(), loop=loop))


@implementer(IResolutionReceiver)
class _FirstAddress:
    """Receives a host name's addresses; its Deferred fires with the first one."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.deferred: Deferred[str] = Deferred()
        self._first: str | None = None

    def resolutionBegan(self, resolutionInProgress: Any) -> None:  # noqa: N802, N803
        pass

    def addressResolved(self, address: Any) -> None:  # noqa: N802
        if self._first is None:
            self._first = getattr(address, "host", None)

    def resolutionComplete(self) -> None:  # noqa: N802
        if self._first:
            self.deferred.callback(self._first)
        else:
            self.deferred.errback(DNSLookupError(f"no address for {self.host}"))
