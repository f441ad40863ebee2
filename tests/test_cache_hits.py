"""CacheHits asks Scrapy's real HttpCacheMiddleware what it will answer itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scrapy import Request, Spider
from scrapy.downloadermiddlewares.httpcache import HttpCacheMiddleware
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from slotkit.cache_hits import CacheHits

URL = "http://example.test/page"


class Chain:
    """Where CacheHits looks for the middleware: ``downloader.middleware.middlewares``."""

    def __init__(self, *middlewares: Any) -> None:
        self.middleware = type("Manager", (), {"middlewares": middlewares})()


def cache_with(tmp_path: Path, **settings: Any) -> tuple[CacheHits, HttpCacheMiddleware]:
    crawler = get_crawler(
        Spider,
        {"HTTPCACHE_ENABLED": True, "HTTPCACHE_DIR": str(tmp_path / "cache"), **settings},
    )
    crawler.spider = crawler._create_spider("cached")
    middleware = HttpCacheMiddleware.from_crawler(crawler)
    middleware.spider_opened(crawler.spider)
    return CacheHits(crawler, Chain(object(), middleware)), middleware


def store(middleware: HttpCacheMiddleware, request: Request, **headers: str) -> None:
    response = HtmlResponse(request.url, body=b"<html></html>", headers=headers, request=request)
    middleware.storage.store_response(middleware.crawler.spider, request, response)


def test_a_stored_response_is_a_hit_and_anything_else_is_not(tmp_path: Path) -> None:
    hits, middleware = cache_with(tmp_path)
    assert hits.enabled
    request = Request(URL)
    assert not hits.answers(request)  # nothing stored yet
    store(middleware, request)
    assert hits.answers(Request(URL))
    assert not hits.answers(Request(URL, meta={"dont_cache": True}))
    assert not hits.answers(Request("http://example.test/other"))


def test_the_policy_decides_what_is_fresh_and_cacheable(tmp_path: Path) -> None:
    hits, middleware = cache_with(
        tmp_path, HTTPCACHE_POLICY="scrapy.extensions.httpcache.RFC2616Policy"
    )
    stale, fresh = Request(URL), Request("http://example.test/fresh")
    store(middleware, stale, **{"Cache-Control": "max-age=0", "ETag": '"v1"'})
    store(middleware, fresh, **{"Cache-Control": "max-age=3600"})
    assert not hits.answers(stale)  # revalidated by a download: throttled as usual
    # Asking changed nothing: RFC2616Policy adds validators to a request whose entry
    # is stale, which would go out as a conditional GET the middleware never expects.
    assert stale.headers == Request(URL).headers
    assert hits.answers(fresh)
    assert not hits.answers(Request(URL, headers={"Cache-Control": "no-store"}))


def test_ignore_missing_refuses_in_the_middleware_so_nothing_is_throttled(
    tmp_path: Path,
) -> None:
    hits, _ = cache_with(tmp_path, HTTPCACHE_IGNORE_MISSING=True)
    assert hits.answers(Request(URL))


def test_a_storage_that_fails_counts_as_a_miss(tmp_path: Path) -> None:
    hits, middleware = cache_with(tmp_path)

    def broken(spider: Spider, request: Request) -> None:
        raise OSError("disk gone")

    middleware.storage.retrieve_response = broken  # type: ignore[method-assign]
    assert not hits.answers(Request(URL))


def test_without_the_middleware_nothing_is_a_hit(tmp_path: Path) -> None:
    crawler = get_crawler(Spider)
    hits = CacheHits(crawler, Chain(object()))
    assert not hits.enabled
    assert not hits.answers(Request(URL))
