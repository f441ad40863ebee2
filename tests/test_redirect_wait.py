"""Retry-After on a redirect holds the redirected request (slotkit.redirect_wait)."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from scrapy import Request
from scrapy.http import Response

from slotkit.redirect_wait import REDIRECT_WAIT, note_redirect_wait, redirect_wait
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite, Reply

NOW = 1_000_000.0
CAP = 100.0
SLOTKIT: dict[str, Any] = {"DOWNLOADER": "slotkit.Downloader", "DOWNLOAD_DELAY_JITTER": 0}
EPSILON = 1e-3  # float rounding of reactor times; gaps are measured at dispatch


def answered(status: int, headers: dict[str, str]) -> tuple[Request, Response]:
    request = Request("http://a.example/go")
    return request, Response(request.url, status=status, headers=headers, request=request)


def followed(request: Request, url: str = "http://a.example/next") -> Request:
    """The request Scrapy's RedirectMiddleware builds from *request*."""
    return request.replace(url=url, meta={**request.meta, "redirect_urls": [request.url]})


def test_a_redirect_with_retry_after_notes_when_its_target_may_go() -> None:
    request, response = answered(302, {"Location": "/next", "Retry-After": "3"})
    assert note_redirect_wait(request, response, NOW, CAP) == 3.0
    follow = followed(request)
    assert redirect_wait(follow, NOW + 1.0, CAP) == 2.0
    # Read again (a retry, a JOBDIR pause): the same moment, no second wait.
    assert redirect_wait(follow, NOW + 3.0, CAP) == 0.0


def test_only_the_redirected_request_waits() -> None:
    """A review: copies made from response.meta (the original request again, a
    hand-built request) waited too."""
    request, response = answered(302, {"Location": "/next", "Retry-After": "3"})
    note_redirect_wait(request, response, NOW, CAP)
    assert redirect_wait(request.replace(dont_filter=True), NOW, CAP) == 0.0
    assert redirect_wait(Request("http://b.example", meta=request.meta), NOW, CAP) == 0.0


@pytest.mark.parametrize(
    ("status", "headers", "cap"),
    [
        (200, {"Retry-After": "3"}, CAP),  # not a redirect
        (304, {"Location": "/next", "Retry-After": "3"}, CAP),  # not one RedirectMiddleware follows
        (302, {"Retry-After": "3"}, CAP),  # nowhere to go
        (302, {"Location": "/next"}, CAP),  # no Retry-After
        (302, {"Location": "/next", "Retry-After": "soon"}, CAP),  # unusable
        (302, {"Location": "/next", "RateLimit-Reset": "3"}, CAP),  # a quota, not this redirect
        (302, {"Location": "/next", "Retry-After": "3"}, 0.0),  # REDIRECT_MAX_DELAY = 0: off
    ],
)
def test_no_wait_is_noted_without_a_usable_retry_after_on_a_redirect(
    status: int, headers: dict[str, str], cap: float
) -> None:
    request, response = answered(status, headers)
    assert note_redirect_wait(request, response, NOW, cap) == 0.0
    assert REDIRECT_WAIT not in request.meta


def test_the_wait_is_capped_at_redirect_max_delay_when_noted_and_when_read() -> None:
    """A review: a moment read on another clock (a JOBDIR resumed elsewhere) was not capped."""
    request, response = answered(301, {"Location": "/next", "Retry-After": "3600"})
    assert note_redirect_wait(request, response, NOW, 5.0) == 5.0
    assert redirect_wait(followed(request), NOW, 5.0) == 5.0
    assert redirect_wait(followed(request), NOW - 86_400.0, 5.0) == 5.0


@pytest.mark.parametrize("noted", [("http://a.example/go", "x"), "x", ("http://a.example/go",)])
def test_an_unreadable_note_is_no_wait(noted: Any) -> None:
    request = Request("http://a.example/next", meta={REDIRECT_WAIT: noted})
    request.meta["redirect_urls"] = ["http://a.example/go"]
    assert redirect_wait(request, NOW, CAP) == 0.0


@pytest.mark.integration
@pytest.mark.parametrize(
    ("setting", "least", "most"), [(None, 1.0, 1.5), (0.3, 0.3, 0.8), (0, 0, 0.5)]
)
@pytest_twisted.ensureDeferred
async def test_the_redirected_request_waits_in_a_real_crawl(
    mock_site: MockSite, setting: float | None, least: float, most: float
) -> None:
    """A 302 with Retry-After: 1 is followed a second later (capped by
    REDIRECT_MAX_DELAY; 0 follows at once), through Scrapy's RedirectMiddleware."""
    host = "127.0.0.1"
    target = mock_site.url(host, "/page/0")
    mock_site.set_behaviour(
        host, lambda request, n: Reply(302, {"Location": target, "Retry-After": "1"}), "/go"
    )
    settings = dict(SLOTKIT)
    if setting is not None:
        settings["REDIRECT_MAX_DELAY"] = setting
    result = await run_crawl(ListSpider, settings, urls=[mock_site.url(host, "/go")])
    result.assert_no_unhandled_errors()
    assert [r.url for r in result.responses] == [target]
    (went,) = result.dispatch_times(host, "/go")
    (followed,) = result.dispatch_times(host, "/page")
    assert least - EPSILON <= followed - went < most
    assert result.stats.get("throttling/redirect_waits", 0) == (1 if setting != 0 else 0)
