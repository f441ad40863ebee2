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
from typing import Any

from scrapy.resolver import dnscache
from scrapy.utils.datatypes import LocalCache
from twisted.internet.defer import Deferred

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
    reports the DNS error as usual.
    """

    def __init__(self, reactor: Any) -> None:
        self._resolve = getattr(reactor, "resolve", None)
        self._pending: dict[str, list[Deferred[None]]] = {}
        #: Hosts whose lookup failed in this crawl (not retried; their downloads say why).
        self._failed: set[str] = set()

    def needed(self, host: str) -> bool:
        """Whether *host* has no known address and no lookup has failed for it."""
        return self._resolve is not None and host not in self._failed and cached_ip(host) is None

    def lookup(self, host: str) -> Deferred[None]:
        """Fire (with ``None``, never failing) once *host*'s address is known or unknowable."""
        done: Deferred[None] = Deferred()
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
        resolving.addCallbacks(
            lambda address: self._finish(host, address, None),
            lambda failure: self._finish(host, None, failure.value),
        )
        return done

    def _finish(self, host: str, address: str | None, error: BaseException | None) -> None:
        if isinstance(address, str) and address:
            _looked_up[host] = address
        else:
            self._failed.add(host)
            logger.debug("slotkit: no address for %s (%s); no IP scope for it", host, error)
        for done in self._pending.pop(host, []):
            if not done.called:
                done.callback(None)
