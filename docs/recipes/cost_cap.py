"""Spend at most 100 cost units per window on an API that prices requests differently."""

from __future__ import annotations

from typing import Any

from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached

from slotkit import ThrottlingManager, add_scope, scope_cache, update_scope_backoff

API_HOST = "api.toscrape.com"


def estimate_request_cost(request: Any) -> float:
    """Browser rendering costs 5 units, a plain fetch 1."""
    return 5.0 if "render=1" in request.url else 1.0


class CostThrottlingManager(ThrottlingManager):
    @scope_cache
    def get_scopes(self, request: Any) -> Any:
        scopes = super().get_scopes(request)
        if urlparse_cached(request).hostname != API_HOST:
            return scopes
        return add_scope(scopes, "cost", estimate_request_cost(request))

    def get_response_backoff(self, response: Response) -> Any:
        backoff = super().get_response_backoff(response)
        actual = response.headers.get("X-Actual-Cost")
        if actual is None:
            return backoff
        estimated = estimate_request_cost(response.request)
        return update_scope_backoff(backoff, "cost", consumed=float(actual) - estimated)


SETTINGS = {
    "THROTTLING_MANAGER": CostThrottlingManager,
    "THROTTLING_SCOPES": {"cost": {"quota": 100.0, "concurrency": 16}},
}
