"""A scraping API: throttle the API itself and, behind it, each target site."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached
from w3lib.url import url_query_parameter

from slotkit import ThrottlingManager, add_scope, scope_cache

API_HOST = "api.toscrape.com"


class ScrapingApiThrottlingManager(ThrottlingManager):
    @scope_cache
    async def get_scopes(self, request: Any) -> Any:
        scopes = await super().get_scopes(request)
        if urlparse_cached(request).hostname != API_HOST:
            return scopes
        target = url_query_parameter(request.url, "url")
        if not target:
            return scopes
        return add_scope(scopes, urlparse(target).hostname or target)

    async def get_response_backoff(self, response: Response) -> Any:
        """Judge a 200 from the API by the status the target site gave it."""
        api_ok = urlparse(response.url).hostname == API_HOST and response.status == 200
        upstream = response.headers.get("X-Upstream-Status-Code") if api_ok else None
        if upstream is None:
            return await super().get_response_backoff(response)
        as_upstream = response.replace(status=int(upstream))
        backoff = await super().get_response_backoff(as_upstream)
        # The API itself answered fine: only the target site's scope slows down.
        return {scope: record for scope, record in backoff.items() if scope != API_HOST} or None


SETTINGS = {
    "THROTTLING_MANAGER": ScrapingApiThrottlingManager,
    "THROTTLING_SCOPES": {API_HOST: {"concurrency": 1000, "delay": 0.08}},
}
