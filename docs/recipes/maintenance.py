"""Leave a whole site alone for a while when a page says it is under maintenance."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scrapy import Spider
from scrapy.http import Response


class MaintenanceAwareSpider(Spider):
    name = "maintenance_aware"
    #: Seconds to leave a site alone once it shows its maintenance page.
    maintenance_pause = 600.0

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        if b"under maintenance" in response.body:
            # The request's first scope: its site as slotkit groups it (a host,
            # a registrable domain, a DOWNLOAD_SLOTS key or its download_slot).
            site = response.meta["download_slot"]
            self.crawler.throttler.delay_scope(site, self.maintenance_pause)
            again = response.request.replace(dont_filter=True)
            # Scrapy 2.19 warns about meta its downloader set on the response's
            # request, and the new request must not carry it.
            again.meta.pop("download_latency", None)
            yield again
            return
        yield from self.parse_page(response)

    def parse_page(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url}
