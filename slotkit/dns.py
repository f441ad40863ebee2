"""The IP address of a host, for IP scopes (``CONCURRENT_REQUESTS_PER_IP``).

Scrapy's DNS cache is read first. A host it does not know yet is looked up
once through the reactor's resolver (:class:`AddressLookups`) before its
first request is given scopes, so the address limit holds from a host's
first request instead of once its first connection filled the cache. What
slotkit looked up itself is kept in a cache of its own: the resolver a
crawl runs with does not always fill Scrapy's.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING, Any

from scrapy.resolver import dnscache
from scrapy.utils.datatypes import LocalCache
from twisted.internet.defer import Deferred

if TYPE_CHECKING:
    from scrapy import Request

__all__ = ["AddressLookups", "cached_ip"]

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


def _address(entry: Any) -> str | None:
    # CachingThreadedResolver caches the address string; CachingHostnameResolver
    # caches a list of IAddress objects.
    if isinstance(entry, str):
        return entry
    if isinstance(entry, (list, tuple)) and entry:
        return _address(getattr(entry[0], "host", entry[0]))
    return None


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
        self._resolve = getattr(reactor, "resolve", None)
        self._timeout = timeout
        self._pending: dict[str, list[Deferred[None]]] = {}
        self._timers: dict[str, Any] = {}
        self._waiting: dict[Deferred[None], Request] = {}
        #: Hosts whose lookup failed in this crawl (not retried; their downloads say why).
        self._failed: set[str] = set()

    def needed(self, host: str) -> bool:
        """Whether *host* has no known address and no lookup has failed for it."""
        return self._resolve is not None and host not in self._failed and cached_ip(host) is None

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
        assert self._resolve is not None
        try:
            resolving: Deferred[str] = self._resolve(host)
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

    def close(self) -> list[Request]:
        """Let every request still waiting for a lookup go on (the crawl is closing).

        Returns those requests; they meet the closed gate next.
        """
        released = list(self._waiting.values())
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
            self._failed.add(host)
            logger.debug("slotkit: no address for %s (%s); no IP scope for it", host, error)
        for done in waiting:
            if not done.called:
                done.callback(None)
