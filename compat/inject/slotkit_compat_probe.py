"""Pre-flight checks, copied into the unpacked Scrapy tree's ``tests/`` and run there.

They prove that the harness does what it claims before the real run: the DOWNLOADER
injection reaches ``Settings`` and ``scrapy.utils.test.get_crawler()``, a real crawl
against Scrapy's own mock server goes through the injected class, and the network
guard is active in the test process.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
from scrapy import Spider
from scrapy.core.engine import ExecutionEngine
from scrapy.http import Response
from scrapy.settings import Settings, default_settings
from scrapy.utils.misc import load_object
from scrapy.utils.spider import DefaultSpider
from scrapy.utils.test import get_crawler
from tests.utils.decorators import coroutine_test

STOCK = "scrapy.core.downloader.Downloader"
EXPECTED = os.environ.get("SLOTKIT_COMPAT_DOWNLOADER") or STOCK


def test_default_settings_carry_the_downloader() -> None:
    assert default_settings.DOWNLOADER == EXPECTED
    assert Settings()["DOWNLOADER"] == EXPECTED


def test_get_crawler_builds_engine_with_it() -> None:
    crawler = get_crawler(DefaultSpider)
    assert crawler.settings["DOWNLOADER"] == EXPECTED
    engine = ExecutionEngine(crawler, lambda _: None)
    try:
        assert type(engine.downloader) is load_object(EXPECTED)
    finally:
        engine.downloader.close()


class _ProbeSpider(Spider):
    name = "slotkit_compat_probe"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[int, type]] = []

    def parse(self, response: Response, **kwargs: Any) -> None:
        assert self.crawler.engine is not None
        self.seen.append((response.status, type(self.crawler.engine.downloader)))


@coroutine_test
async def test_real_crawl_goes_through_it(mockserver: Any) -> None:
    url = mockserver.url("/status?n=200")
    assert url.startswith("http://127.0.0.1:")
    crawler = get_crawler(_ProbeSpider)
    await crawler.crawl_async(start_urls=[url])
    assert isinstance(crawler.spider, _ProbeSpider)
    assert crawler.spider.seen == [(200, load_object(EXPECTED))]
    assert crawler.stats is not None
    assert crawler.stats.get_value("downloader/response_count") == 1


@pytest.mark.skipif(
    os.environ.get("SLOTKIT_COMPAT_NET_GUARD") == "0", reason="network guard disabled"
)
def test_network_guard_is_active() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        assert sock.getsockname()[0] == "127.0.0.1"
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("example.com", 80)
    with (
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock,
        pytest.raises(OSError, match="loopback"),
    ):
        sock.connect(("192.0.2.1", 80))
