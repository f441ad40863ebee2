"""The ``throttling_delay`` meta: held once per request, whatever copies its meta."""

from __future__ import annotations

import pickle

from scrapy import Request, Spider
from scrapy.downloadermiddlewares.redirect import RedirectMiddleware
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.http import Response
from scrapy.utils.request import request_from_dict
from scrapy.utils.test import get_crawler

from slotkit.request_delay import DELAY_UNTIL, request_delay_left

URL = "http://example.com/a"


def delayed(seconds: float = 1.0, url: str = URL) -> Request:
    return Request(url, meta={"throttling_delay": seconds})


def retried(request: Request) -> Request:
    """The request Scrapy's RetryMiddleware builds to try *request* again."""
    spider = Spider.from_crawler(get_crawler(Spider), name="s")
    retry = get_retry_request(request, spider=spider, reason="503")
    assert retry is not None
    return retry


def redirected(request: Request) -> Request:
    """The request Scrapy's RedirectMiddleware builds from a 302 to /b."""
    middleware = RedirectMiddleware.from_crawler(get_crawler())
    response = Response(request.url, status=302, headers={"Location": "/b"}, request=request)
    follow = middleware.process_response(request, response)
    assert isinstance(follow, Request)
    return follow


def test_the_delay_starts_when_first_asked_and_runs_down() -> None:
    request = delayed(1.0)
    assert request_delay_left(request, 10.0) == 1.0
    assert abs(request_delay_left(request, 10.4) - 0.6) < 1e-9
    assert request_delay_left(request, 11.0) == 0.0


def test_retries_and_redirects_do_not_wait_again() -> None:
    request = delayed(1.0)
    request_delay_left(request, 0.0)
    retry = retried(request)
    assert request_delay_left(retry, 0.5) == 0.5  # what is left, not a new second
    assert request_delay_left(retry, 2.0) == 0.0
    follow = redirected(retry)
    assert request_delay_left(follow, 2.0) == 0.0
    assert request_delay_left(follow, 2.0) == 0.0  # asked again: still the same request


def test_a_request_made_from_response_meta_waits_its_own_delay() -> None:
    """An acceptance probe: the stamp copied with ``response.meta`` made the next
    request's delay look over (it went 5 ms after the first response)."""
    first = delayed(0.2)
    request_delay_left(first, 0.0)
    assert request_delay_left(Request("http://example.com/next", meta=first.meta), 5.0) == 0.2
    again = first.replace(dont_filter=True, meta={**first.meta, "throttling_delay": 1.0})
    assert request_delay_left(again, 5.0) == 1.0
    hop = Request("http://example.com/hop", meta=first.meta)
    request_delay_left(hop, 5.0)
    assert request_delay_left(Request("http://example.com/hop2", meta=hop.meta), 6.0) == 0.2


def test_a_request_made_from_a_retried_responses_meta_waits_too() -> None:
    request = delayed(1.0)
    request_delay_left(request, 0.0)
    retry = retried(request)
    request_delay_left(retry, 2.0)
    assert request_delay_left(Request("http://example.com/next", meta=retry.meta), 3.0) == 1.0


def test_a_request_read_back_from_a_job_directory_keeps_its_end() -> None:
    request = delayed(30.0)
    request_delay_left(request, 100.0)
    saved = pickle.loads(pickle.dumps(request.to_dict()))
    assert request_delay_left(request_from_dict(saved), 110.0) == 20.0


def test_an_end_saved_by_an_earlier_version_is_kept() -> None:
    request = Request(URL, meta={"throttling_delay": 30.0, DELAY_UNTIL: 120.0})
    assert request_delay_left(request, 110.0) == 10.0


def test_a_bad_value_is_warned_about_once_per_request(caplog) -> None:  # type: ignore[no-untyped-def]
    request = delayed("1")  # type: ignore[arg-type]
    assert request_delay_left(request, 0.0) == 0.0
    assert request_delay_left(request, 1.0) == 0.0
    assert caplog.text.count("Ignoring throttling_delay") == 1
