"""Throttle each endpoint of one API host as if it were its own site."""

from __future__ import annotations

from typing import Any

from scrapy.utils.httpobj import urlparse_cached

from slotkit import ThrottlingManager, scope_cache


class EndpointThrottlingManager(ThrottlingManager):
    API_HOST = "api.toscrape.com"

    @scope_cache
    def get_scopes(self, request: Any) -> Any:
        url = urlparse_cached(request)
        if url.hostname != self.API_HOST:
            return super().get_scopes(request)
        return f"{url.hostname}{url.path}"


SETTINGS = {
    "THROTTLING_MANAGER": EndpointThrottlingManager,
    "THROTTLING_SCOPES": {
        "api.toscrape.com/fast-endpoint": {"concurrency": 1000, "delay": 0.08},
        "api.toscrape.com/slow-endpoint": {"delay": 5.0},
    },
}
