"""Requests Scrapy's HTTP cache will answer: they never reach a scope.

``HttpCacheMiddleware`` answers a request from its cache before the
downloader sees it, so the request takes nothing from its scopes: no
concurrency place, no delay, no quota. A queue that holds requests until
their scopes would let them through (:class:`~slotkit.pqueue.ThrottlingAwarePriorityQueue`)
must not hold those: a cached page queued behind its site's uncached ones
waited out the site's delay, backoff or busy downloads for nothing (an
acceptance probe: 3 s for cached pages behind three uncached ones at a 1 s
delay, 4 s behind a ``Retry-After: 4``).

:class:`CacheHits` asks the crawl's own middleware the questions it will
ask itself, in its order: ``dont_cache``, the policy's
``should_cache_request``, the storage's entry, the policy's freshness. A
request the cache would refuse because ``HTTPCACHE_IGNORE_MISSING`` is on
never reaches a scope either. Anything that goes wrong while asking counts
as "not from the cache": the request is then throttled as usual.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.downloadermiddlewares.httpcache import HttpCacheMiddleware

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

__all__ = ["CacheHits"]

logger = logging.getLogger(__name__)


class CacheHits:
    """Tells whether the crawl's ``HttpCacheMiddleware`` will answer a request itself."""

    def __init__(self, crawler: Crawler, downloader: Any) -> None:
        self._crawler = crawler
        self._middleware = _cache_middleware(downloader)

    @property
    def enabled(self) -> bool:
        """Whether the crawl has an HTTP cache middleware at all."""
        return self._middleware is not None

    def answers(self, request: Request) -> bool:
        """Whether the cache will answer *request* (or refuse it) before the downloader."""
        middleware = self._middleware
        if middleware is None or request.meta.get("dont_cache", False):
            return False
        try:
            if not middleware.policy.should_cache_request(request):
                return False
            cached = middleware.storage.retrieve_response(self._crawler.spider, request)
            if cached is None:
                return bool(middleware.ignore_missing)
            # On a copy: RFC2616Policy adds If-None-Match / If-Modified-Since to
            # a request whose entry is stale, for the download it expects next.
            return bool(middleware.policy.is_cached_response_fresh(cached, request.copy()))
        except Exception:
            # The storage not open yet (a job resumed before spider_opened), a
            # broken entry: the middleware decides later, the scopes meanwhile.
            logger.debug("slotkit: could not ask the HTTP cache about %s", request, exc_info=True)
            return False


def _cache_middleware(downloader: Any) -> HttpCacheMiddleware | None:
    """The downloader's ``HttpCacheMiddleware`` (or subclass), if it has one."""
    manager = getattr(downloader, "middleware", None)
    for middleware in getattr(manager, "middlewares", ()):
        if isinstance(middleware, HttpCacheMiddleware):
            return middleware
    return None
