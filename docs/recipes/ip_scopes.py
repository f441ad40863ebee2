"""Resolve each host yourself and add its address as a second scope."""

from __future__ import annotations

import socket
from typing import Any

from scrapy.utils.asyncio import run_in_thread
from scrapy.utils.httpobj import urlparse_cached

from slotkit import ThrottlingManager, add_scope, scope_cache


class IPThrottlingManager(ThrottlingManager):
    """Unlike CONCURRENT_REQUESTS_PER_IP, this does not wait for Scrapy's DNS cache."""

    @scope_cache
    async def get_scopes(self, request: Any) -> Any:
        scopes = await super().get_scopes(request)
        host = urlparse_cached(request).hostname or ""
        address = await run_in_thread(socket.gethostbyname, host)
        return add_scope(scopes, address)


SETTINGS = {
    "THROTTLING_MANAGER": IPThrottlingManager,
    "THROTTLING_SCOPES": {"127.0.0.1": {"concurrency": 2}},
}
