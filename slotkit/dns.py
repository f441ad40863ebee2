"""The IP address of a host, from Scrapy's DNS cache (for IP scopes).

Only the cache is read: slotkit never resolves names itself. A host that
has not been resolved yet (its first requests, or a crawl whose resolver
does not fill Scrapy's cache) has no IP scope until it is.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from scrapy.resolver import dnscache

__all__ = ["cached_ip"]


def cached_ip(host: str) -> str | None:
    """The address Scrapy cached for *host*, *host* itself if it is an IP, else ``None``."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        return host
    try:
        entry: Any = dnscache.get(host)
    except Exception:
        return None
    return _address(entry)


def _address(entry: Any) -> str | None:
    # CachingThreadedResolver caches the address string; CachingHostnameResolver
    # caches a list of IAddress objects.
    if isinstance(entry, str):
        return entry
    if isinstance(entry, (list, tuple)) and entry:
        return _address(getattr(entry[0], "host", entry[0]))
    return None
