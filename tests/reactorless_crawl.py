"""A crawl in Scrapy's reactorless mode, run as a subprocess by tests/test_reactorless.py."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request, Spider
from scrapy.crawler import AsyncCrawlerProcess

from slotkit.testing import get_recorder

DELAY = 0.2


class HostsSpider(Spider):
    name = "hosts"

    async def start(self) -> AsyncIterator[Any]:
        for i in range(6):
            yield Request(f"http://h{i % 2}.test/p{i}", dont_filter=True)

    def parse(self, response: Any) -> None:
        """Nothing to do."""


def fake_getaddrinfo() -> None:
    """Both test hosts are one address (no network, whatever the machine's hosts file)."""
    import asyncio
    import socket

    real = asyncio.BaseEventLoop.getaddrinfo

    async def getaddrinfo(self: Any, host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".test"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.9.9.9", 0))]
        return await real(self, host, *args, **kwargs)

    asyncio.BaseEventLoop.getaddrinfo = getaddrinfo  # type: ignore[method-assign]


def main() -> None:
    per_ip = "--per-ip" in sys.argv
    if per_ip:
        fake_getaddrinfo()
    extra: dict[str, Any] = (
        {"CONCURRENT_REQUESTS_PER_IP": 1, "DOWNLOAD_DELAY": 0, "INMEMORY_LATENCY": 0.1}
        if per_ip
        else {}
    )
    process = AsyncCrawlerProcess(
        {
            "TWISTED_REACTOR_ENABLED": False,
            "DOWNLOADER": "slotkit.Downloader",
            "DOWNLOAD_DELAY": DELAY,
            "DOWNLOAD_DELAY_JITTER": 0,
            "LOG_LEVEL": "ERROR",
            "TELNETCONSOLE_ENABLED": False,
            "DOWNLOAD_HANDLERS": {"http": "slotkit.testing.InMemoryDownloadHandler"},
            **extra,
        }
    )
    crawler = process.create_crawler(HostsSpider)
    process.crawl(crawler)
    process.start()
    recorder = get_recorder(crawler)
    stats = crawler.stats.get_stats() if crawler.stats else {}
    result = {
        "responses": stats.get("response_received_count", 0),
        "gaps": {host: recorder.gaps(host) for host in ("h0.test", "h1.test")},
        "reactor_imported": "twisted.internet.reactor" in sys.modules,
        "peak_in_flight": recorder.peak_total_in_flight,
    }
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
