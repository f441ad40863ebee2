"""Group every subdomain under its registrable domain (offline public suffix list)."""

from __future__ import annotations

from typing import Any

import tldextract
from scrapy.utils.httpobj import urlparse_cached

# The bundled suffix list: no download at import or run time.
extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


class RegistrableDomainManager:
    """A duck-typed manager: slotkit fills in the rest of the interface."""

    def get_scopes(self, request: Any) -> Any:
        parts = extract(request.url)
        if parts.domain and parts.suffix:
            return f"{parts.domain}.{parts.suffix}"
        return urlparse_cached(request).hostname


class NestedDomainManager:
    """One scope per registrable domain and one per subdomain level under it."""

    def get_scopes(self, request: Any) -> Any:
        parts = extract(request.url)
        if not (parts.domain and parts.suffix):
            return urlparse_cached(request).hostname
        registrable = f"{parts.domain}.{parts.suffix}"
        scopes = [registrable]
        labels = parts.subdomain.split(".") if parts.subdomain else []
        for start in range(len(labels) - 1, -1, -1):
            scopes.append(".".join([*labels[start:], registrable]))
        return scopes


SETTINGS = {
    "THROTTLING_MANAGER": NestedDomainManager,
    "THROTTLING_SCOPES": {
        "toscrape.com": {"concurrency": 32},
        "books.toscrape.com": {"concurrency": 24},
        "quotes.toscrape.com": {"concurrency": 16},
    },
}
