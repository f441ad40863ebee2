"""Registrable domains, from the public suffix list bundled with tldextract.

The extractor is built with no suffix-list URLs and no cache directory, so
it never touches the network, at import or at run time.
"""

from __future__ import annotations

import functools
import ipaddress

import tldextract

__all__ = ["registrable_domain"]


@functools.cache
def _extractor() -> tldextract.TLDExtract:
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


@functools.lru_cache(maxsize=65_536)
def registrable_domain(host: str) -> str:
    """``books.example.co.uk`` -> ``example.co.uk``; IPs and single labels stay as they are."""
    if not host or "." not in host:
        return host
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        return host
    parts = _extractor()(host)
    if parts.domain and parts.suffix:
        return f"{parts.domain}.{parts.suffix}"
    return host
