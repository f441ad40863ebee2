"""The demo spider: walks every demo site as a few parallel chains of pages."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider

if TYPE_CHECKING:
    from scrapy.http import Response
    from twisted.python.failure import Failure

__all__ = ["DemoSpider"]


class DemoSpider(Spider):
    """Starts *chains* pages per site and follows each page's single "next" link.

    HTML pages link with ``<a rel="next">``; the API answers JSON with a
    ``next`` URL. Errors are counted by type, never raised: at the end of
    the demo the crawl is closed while requests still wait for their scopes,
    and those come back as errors too.
    """

    name = "slotkit-demo"

    def __init__(self, starts: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.starts = list(starts)
        self.errors: Counter[str] = Counter()

    async def start(self) -> AsyncIterator[Request]:
        for url in self.starts:
            yield Request(url, callback=self.parse, errback=self.on_error)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Request]:
        following = self._next_url(response)
        if following:
            yield Request(following, callback=self.parse, errback=self.on_error)

    @staticmethod
    def _next_url(response: Response) -> str | None:
        content_type = response.headers.get(b"Content-Type", b"") or b""
        if content_type.startswith(b"application/json"):
            try:
                data = json.loads(response.body)
            except ValueError:
                return None
            following = data.get("next") if isinstance(data, dict) else None
            return following if isinstance(following, str) else None
        if not hasattr(response, "css"):
            return None
        href = response.css('a[rel="next"]::attr(href)').get()
        return response.urljoin(href) if href else None

    def on_error(self, failure: Failure) -> Iterator[Request]:
        self.errors[type(failure.value).__name__] += 1
        response = getattr(failure.value, "response", None)
        if response is not None:
            # An error page (a 503 that outlived its retries): keep the chain alive.
            yield Request(
                response.url, callback=self.parse, errback=self.on_error, dont_filter=True
            )
