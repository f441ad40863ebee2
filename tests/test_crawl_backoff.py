"""Backoff and rate-limit signals in real crawls on loopback."""

from __future__ import annotations

from email.utils import formatdate
from itertools import pairwise
from typing import Any

import pytest
import pytest_twisted
from scrapy import Spider
from scrapy.downloadermiddlewares.retry import RetryMiddleware

from slotkit import ThrottlingManager, ThrottlingScopeManager
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite, Reply, always, fail_first, random_failures

pytestmark = pytest.mark.integration

SLOTKIT: dict[str, Any] = {
    "DOWNLOADER": "slotkit.Downloader",
    "DOWNLOAD_DELAY_JITTER": 0,
    "BACKOFF_JITTER": 0,
}
HOST, OTHER = "127.0.0.1", "127.0.0.2"
RETRY_MIDDLEWARE = "scrapy.downloadermiddlewares.retry.RetryMiddleware"
EPSILON = 1e-3  # float rounding of reactor times; gaps are measured at dispatch


def pages(site: MockSite, host: str, count: int, **query: Any) -> list[str]:
    return [site.url(host, f"/page/{i}", **query) for i in range(count)]


@pytest_twisted.ensureDeferred
async def test_a_429_within_the_rampup_target_is_a_trigger_not_a_step(
    mock_site: MockSite,
) -> None:
    """Rampup takes up to its target of triggers per window without slowing down;
    the stats say so (a trigger, no step)."""
    mock_site.set_behaviour(HOST, fail_first(1, 429))
    settings = {
        **SLOTKIT,
        "BACKOFF_MIN_DELAY": 0.2,
        "THROTTLING_SCOPES": {HOST: {"rampup": True}},
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 3))
    assert sorted(r.status for r in result.responses) == [200] * 3
    assert result.stats["throttling/backoff/triggers/429"] == 1
    assert "throttling/backoff/steps" not in result.stats


@pytest_twisted.ensureDeferred
async def test_burst_of_429s_is_one_backoff_step(mock_site: MockSite) -> None:
    """Four in-flight requests answered 429 together advance the backoff once."""
    mock_site.set_behaviour(HOST, fail_first(4, 429, delay=0.1))
    settings = {**SLOTKIT, "CONCURRENT_REQUESTS_PER_DOMAIN": 4, "BACKOFF_MIN_DELAY": 0.2}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 4))
    assert sorted(r.status for r in result.responses) == [200] * 4
    assert result.stats["throttling/backoff/steps"] == 1
    assert result.stats["throttling/backoff/deduplicated"] == 3
    assert "backs off after 429" in result.log_text
    assert "BACKOFF_HTTP_CODES = [429]" not in result.log_text  # a 429 is about load
    assert result.stats["throttling/backoff/resent"] == 4
    dispatches = result.dispatch_times(HOST)
    # The re-sends are paced by the first backoff step (0.2 s), not 0.2 * 2**3.
    resend_gaps = [b - a for a, b in pairwise(dispatches[4:])]
    assert all(gap >= 0.2 - EPSILON for gap in resend_gaps)
    # Room for late timers on a loaded machine; still well under 0.2 * 2**2.
    # (A second step, 0.4 s, is what the steps stat above rules out.)
    assert max(resend_gaps) < 0.2 + 0.5


@pytest_twisted.ensureDeferred
async def test_a_scopes_first_backoff_step_is_logged_once(mock_site: MockSite) -> None:
    """A newcomer saw a site slow down 16 times with nothing above DEBUG: its first
    step gets one INFO line; later steps only count in the stats."""
    mock_site.set_behaviour(HOST, fail_first(3, 503))
    settings = {**SLOTKIT, "CONCURRENT_REQUESTS_PER_DOMAIN": 1, "BACKOFF_MIN_DELAY": 0.1}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 2))
    assert result.stats["throttling/backoff/steps"] >= 2
    line = "slotkit: scope '127.0.0.1' backs off after 503 to 0.1 s between requests"
    assert line in result.log_text
    assert result.log_text.count("backs off after") == 1
    # A 503 may be a sick backend rather than a request to slow down.
    assert "BACKOFF_HTTP_CODES = [429] and BACKOFF_EXCEPTIONS = []" in result.log_text


@pytest_twisted.ensureDeferred
async def test_a_timeout_gives_the_site_the_whole_backoff_delay(mock_site: MockSite) -> None:
    """A probe: with a 0.25 s timeout and a 0.4 s backoff step, the retry reached the
    server 0.15 s after the failure (the gap counted from the failed dispatch)."""
    timeout, step = 0.25, 0.4
    settings = {
        **SLOTKIT,
        "DOWNLOAD_TIMEOUT": timeout,
        "BACKOFF_MIN_DELAY": step,
        "RETRY_TIMES": 1,
    }
    # A page first: the gap after a scope's first request runs from its end anyway.
    urls = [mock_site.url(HOST, "/page/0"), mock_site.url(HOST, "/hang")]
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert result.stats["throttling/backoff/steps"] == 2
    assert len(mock_site.recorder.arrivals(HOST, "/hang")) == 2
    # Measured where the downloader let them go: a loaded machine delays the
    # first arrival at the server more than the second (a run saw 0.647 s).
    first, retry = result.dispatch_times(HOST, "/hang")
    assert retry - first >= timeout + step - EPSILON


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("1", 1.0),
        # Not RFC 9110's whole seconds, but meant: an acceptance probe saw it
        # ignored, the ordinary 1 s step sending the retry 0.5 s too soon.
        ("1.5", 1.5),
    ],
)
@pytest_twisted.ensureDeferred
async def test_retry_after_seconds_is_a_hard_minimum(
    mock_site: MockSite, value: str, hint: float
) -> None:
    """After `Retry-After: 1` nothing reaches the scope for 1 s, and then it resumes at once."""
    mock_site.set_behaviour(HOST, fail_first(1, 429, {"Retry-After": value}))
    result = await run_crawl(ListSpider, SLOTKIT, urls=pages(mock_site, HOST, 1))
    assert [r.status for r in result.responses] == [200]
    # The hold starts when the 429 is received, which is after the server
    # finished it (same clock): measured from there, not from the first
    # dispatch, whose round trip (connection set-up included) would count.
    answered = mock_site.recorder.for_host(HOST)[0].finished
    assert answered is not None
    _, second = result.dispatch_times(HOST)
    assert second - answered >= hint - EPSILON
    # "At once": room for a loaded machine, but no backoff step (BACKOFF_MIN_DELAY,
    # 1 s) on top.
    assert second - answered <= hint + 0.5
    assert result.stats["throttling/backoff/header_hints"] == 1


@pytest_twisted.ensureDeferred
async def test_retry_after_http_date_is_honoured(mock_site: MockSite) -> None:
    """An HTTP-date Retry-After is measured against the response's Date header."""
    from twisted.internet import reactor

    def behaviour(request: Any, n: int) -> Reply | None:
        if n:
            return None
        now = reactor.seconds()
        return Reply(
            429,
            {"Retry-After": formatdate(now + 2, usegmt=True), "Date": formatdate(now, usegmt=True)},
        )

    mock_site.set_behaviour(HOST, behaviour)
    result = await run_crawl(ListSpider, SLOTKIT, urls=pages(mock_site, HOST, 1))
    assert [r.status for r in result.responses] == [200]
    # Both headers come from one reading, in whole seconds: the Retry-After is
    # exactly 2 s after the Date, so the hold lasts 2 s from when the 429 was
    # received, which is after the server finished it. (Measured against the
    # client's clock instead of the Date, it could be as short as 1 s.)
    answered = mock_site.recorder.for_host(HOST)[0].finished
    assert answered is not None
    _, second = result.dispatch_times(HOST)
    assert second - answered >= 2.0 - EPSILON
    assert second - answered <= 2.0 + 0.5  # room for a loaded machine


@pytest.mark.parametrize(
    "retry_after",
    # An acceptance probe: more than 10**9 s (or an HTTP-date that far ahead)
    # was refused as absurd, and the page went again after the ordinary
    # 0.5 s step, sooner than after a smaller demand.
    ["3600", "1000000001", "9" * 40, "Fri, 31 Dec 9999 23:59:59 GMT"],
)
@pytest_twisted.ensureDeferred
async def test_hint_is_capped_at_max_delay(mock_site: MockSite, retry_after: str) -> None:
    """A Retry-After longer than BACKOFF_MAX_DELAY waits only the cap, logged once."""
    mock_site.set_behaviour(HOST, fail_first(1, 429, {"Retry-After": retry_after}))
    settings = {**SLOTKIT, "BACKOFF_MAX_DELAY": 0.5, "BACKOFF_MIN_DELAY": 0.1}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 1))
    first, second = result.dispatch_times(HOST)
    assert 0.5 - EPSILON <= second - first < 1.0
    assert result.stats["throttling/backoff/capped"] == 1
    assert "asked to wait longer than its max_delay" in result.log_text


@pytest_twisted.ensureDeferred
async def test_other_scopes_are_not_slowed(mock_site: MockSite) -> None:
    """A backing-off host does not hold back a healthy one."""
    mock_site.set_behaviour(HOST, fail_first(1, 429, {"Retry-After": "1"}))
    urls = pages(mock_site, HOST, 1) + pages(mock_site, OTHER, 5)
    result = await run_crawl(ListSpider, SLOTKIT, urls=urls)
    assert len(result.responses) == 6
    healthy_last = mock_site.recorder.arrivals(OTHER)[-1]
    throttled_second = mock_site.recorder.arrivals(HOST)[1]
    assert healthy_last < throttled_second


@pytest_twisted.ensureDeferred
async def test_recovery_after_quiet_window(mock_site: MockSite) -> None:
    """After one quiet BACKOFF_WINDOW the delay steps back toward its configured value."""
    mock_site.set_behaviour(HOST, fail_first(1, 503))
    settings = {
        **SLOTKIT,
        "BACKOFF_MIN_DELAY": 0.3,
        "BACKOFF_WINDOW": 0.5,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "RETRY_ENABLED": True,
        "THROTTLING_DEBUG": True,
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 8))
    gaps = result.dispatch_gaps(HOST)
    assert len(result.responses) == 8
    assert gaps[0] >= 0.3 - EPSILON  # backed off after the 503
    # Recovered: a gap under the 0.3 s step can only be the configured delay
    # (none); the bound leaves room for a round trip (one request at a time)
    # on a loaded machine.
    assert min(gaps[-3:]) < 0.2
    assert result.stats["throttling/backoff/recoveries"] >= 1
    assert f"scope '{HOST}' recovered 1 backoff step(s)" in result.log_text  # THROTTLING_DEBUG


@pytest_twisted.ensureDeferred
async def test_always_429_scope_ends_and_healthy_scope_finishes(mock_site: MockSite) -> None:
    """A scope that never recovers stops at the stall bound; the other scope delivers every page."""
    mock_site.set_behaviour(HOST, always(429))
    settings = {
        **SLOTKIT,
        "BACKOFF_MIN_DELAY": 0.05,
        "BACKOFF_MAX_DELAY": 0.1,
        "BACKOFF_RESEND_TIMEOUT": 2.0,
    }
    urls = pages(mock_site, HOST, 10) + pages(mock_site, OTHER, 20)
    result = await run_crawl(ListSpider, settings, urls=urls, crawl_timeout=30)
    assert result.finish_reason == "finished"
    assert mock_site.recorder.count(HOST) < 60
    assert sum(1 for r in result.responses if OTHER in r.url and r.status == 200) == 20
    assert result.stats["throttling/backoff/stalled"] >= 1
    result.assert_no_unhandled_errors()


@pytest_twisted.ensureDeferred
async def test_resend_timeout_runs_from_the_first_429_not_from_the_queue(
    mock_site: MockSite,
) -> None:
    """Acceptance probe: a request that queued longer than BACKOFF_RESEND_TIMEOUT
    behind the delay was 'stalled' on its first 429 (handed on, a retry spent,
    its scope marked stalled). The timeout is about rate limiting only."""
    mock_site.set_behaviour(
        HOST, fail_first(1, 429, headers={"Retry-After": "1"}), path_prefix="/page/7"
    )
    settings = {**SLOTKIT, "DOWNLOAD_DELAY": 0.2, "BACKOFF_RESEND_TIMEOUT": 1.0}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 9))
    assert sorted(r.status for r in result.responses) == [200] * 9
    assert "throttling/backoff/stalled" not in result.stats
    assert result.stats["throttling/backoff/resent"] == 1
    assert "retry/count" not in result.stats


@pytest_twisted.ensureDeferred
async def test_random_429s_lose_no_page(mock_site: MockSite) -> None:
    """A site answering 429 to 30% of requests loses nothing with default RETRY_TIMES."""
    mock_site.set_behaviour(HOST, random_failures(0.3, 429, seed=7))
    settings = {**SLOTKIT, "BACKOFF_MIN_DELAY": 0.01, "BACKOFF_MAX_DELAY": 0.02}
    result = await run_crawl(
        ListSpider, settings, urls=pages(mock_site, HOST, 60), crawl_timeout=60
    )
    ok = {r.url for r in result.responses if r.status == 200}
    assert len(ok) == 60


@pytest_twisted.ensureDeferred
async def test_dont_retry_hands_the_429_on(mock_site: MockSite) -> None:
    """With dont_retry the 429 reaches the spider at once; the scope still backs off."""
    mock_site.set_behaviour(HOST, fail_first(1, 429))
    urls = [{"url": mock_site.url(HOST, "/page/0"), "meta": {"dont_retry": True}}]
    result = await run_crawl(ListSpider, SLOTKIT, urls=urls)
    assert [r.status for r in result.responses] == [429]
    assert result.stats["throttling/backoff/steps"] == 1
    assert mock_site.recorder.count(HOST) == 1


@pytest.mark.parametrize(
    ("meta", "settings"),
    [
        pytest.param({"max_retry_times": 0}, {}, id="meta-max_retry_times-0"),
        pytest.param({"retry_times": 2}, {}, id="retries-already-spent"),
        pytest.param({}, {"RETRY_TIMES": 0}, id="RETRY_TIMES-0"),
        pytest.param({}, {"RETRY_HTTP_CODES": [500, 502, 503]}, id="429-not-retried"),
        pytest.param({}, {"RETRY_ENABLED": False}, id="RETRY_ENABLED-False"),
        pytest.param(
            {},
            {"DOWNLOADER_MIDDLEWARES": {RETRY_MIDDLEWARE: None}},
            id="RetryMiddleware-off",
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_no_resend_where_retry_middleware_would_not_retry(
    mock_site: MockSite, meta: dict[str, Any], settings: dict[str, Any]
) -> None:
    """Every way of switching retrying off for a 429 hands it on at once."""
    mock_site.set_behaviour(HOST, always(429, {"Retry-After": "1"}))
    urls = [{"url": mock_site.url(HOST, "/page/0"), "meta": meta}]
    result = await run_crawl(ListSpider, {**SLOTKIT, **settings}, urls=urls)
    assert mock_site.recorder.count(HOST) == 1
    assert "throttling/backoff/resent" not in result.stats
    assert result.stats["throttling/backoff/triggers/429"] == 1  # the scope still backs off


class TakesNoBackoff(ThrottlingScopeManager):
    """A scope manager that ignores backoff, as the spec's fixed-window example does."""

    def record_backoff(self, delay: float | None = None, now: float = 0.0) -> None:
        pass


@pytest.mark.parametrize(
    ("answer", "settings", "count"),
    [
        pytest.param(
            {}, {"THROTTLING_SCOPES": {HOST: {"manager": TakesNoBackoff}}}, 1, id="no-backoff"
        ),
        # A review: two pages taking turns at one place each waited a moment
        # for the other's transfer, which counted as held (2,569 requests).
        pytest.param(
            {},
            {
                "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
                "THROTTLING_SCOPES": {HOST: {"manager": TakesNoBackoff}},
            },
            2,
            id="no-backoff-taking-turns",
        ),
        # A review: a server's 10 ms reset held each re-send 10 ms (247 requests).
        pytest.param(
            {"RateLimit-Remaining": "0", "RateLimit-Reset": "0.01"}, {}, 1, id="10-ms-reset"
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_resend_nothing_held_back_is_not_resent_again(
    mock_site: MockSite, answer: dict[str, str], settings: dict[str, Any], count: int
) -> None:
    """An acceptance probe: with a scope manager taking no backoff, every 429 was
    re-sent at once, 280 requests in 5 s for 3 pages. After three re-sends that went
    out quickly, the next 429 is handed on; RetryMiddleware's RETRY_TIMES bounds it."""
    mock_site.set_behaviour(HOST, always(429, answer))
    settings = {
        **SLOTKIT,
        "RETRY_TIMES": 2,
        "BACKOFF_RESEND_TIMEOUT": 3,  # ends the old code's loop too
        **settings,
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, count))
    # The first try and the first retry: an attempt and three re-sends; the
    # last retry, which RetryMiddleware would not retry again, is handed on.
    assert mock_site.recorder.count(HOST) == (4 + 4 + 1) * count
    assert result.stats["throttling/backoff/handed_on_unheld"] == 2 * count
    assert result.stats["retry/max_reached"] == count


def slow_first_429() -> Any:
    """/page/1: one quick 429. /page/2: a 429 that comes after /page/1's step and
    re-send (same burst: no step of its own), then a quick one."""
    tries: dict[str, int] = {}

    def behaviour(request: Any, n: int) -> Reply | None:
        path = request.path.decode()
        tried = tries[path] = tries.get(path, 0) + 1
        if path.endswith("/page/1") and tried == 1:
            return Reply(429, {}, b"later", 0.02)
        if path.endswith("/page/2") and tried <= 2:
            return Reply(429, {}, b"later", 0.6 if tried == 1 else 0.02)
        return None

    return behaviour


@pytest.mark.parametrize(
    ("behaviour", "settings", "count"),
    [
        pytest.param(
            lambda: fail_first(3, 429, delay=0.05),
            {"RETRY_TIMES": 1, "THROTTLING_SCOPES": {HOST: {"rampup": True}}},
            1,
            id="rampup-429-within-target",
        ),
        pytest.param(
            slow_first_429, {"CONCURRENT_REQUESTS_PER_DOMAIN": 2}, 2, id="slow-429-of-a-burst"
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_resend_that_went_at_once_for_a_good_reason_is_resent_again(
    mock_site: MockSite, behaviour: Any, settings: dict[str, Any], count: int
) -> None:
    """A review: handing on after one re-send that nothing held cost slotkit's own
    scopes a retry (and, with RETRY_TIMES = 1, the page): a rampup scope's 429
    within its target takes no step, nor does the slow answer of a burst."""
    mock_site.set_behaviour(HOST, behaviour())
    result = await run_crawl(
        ListSpider,
        {**SLOTKIT, "BACKOFF_MIN_DELAY": 0.2, **settings},
        urls=[mock_site.url(HOST, f"/page/{n + 1}") for n in range(count)],
    )
    assert [r.status for r in result.responses] == [200] * count
    assert "retry/count" not in result.stats
    assert "throttling/backoff/handed_on_unheld" not in result.stats


def cookie_challenge(request: Any, n: int) -> Reply | None:
    """429 with a cookie until a request carries it back (a common anti-bot challenge)."""
    if b"pass=1" in (request.getHeader("cookie") or "").encode():
        return None
    return Reply(429, {"Set-Cookie": "pass=1; Path=/", "Retry-After": "0"}, b"challenge")


def balancer_cookie(request: Any, n: int) -> Reply | None:
    """A load balancer's fresh cookie on every answer; 429 to the first three."""
    reply = Reply(200, {"Set-Cookie": f"lb={n}; Path=/"}, b"ok")
    if n < 3:
        reply.status = 429
    return reply


@pytest.mark.parametrize(
    ("behaviour", "meta", "answered"),
    [
        pytest.param(cookie_challenge, {}, True, id="challenge"),
        pytest.param(balancer_cookie, {}, True, id="cookie-on-every-answer"),
        pytest.param(cookie_challenge, {"dont_merge_cookies": True}, False, id="dont_merge"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_resend_carries_the_cookies_a_429_set(
    mock_site: MockSite, behaviour: Any, meta: dict[str, Any], answered: bool
) -> None:
    """A re-send goes out below CookiesMiddleware, yet must carry its cookies as a retry does.

    A first fix handed such 429s on to RetryMiddleware: sites that set a
    cookie on every answer then lost pages to RETRY_TIMES (a review).
    """
    mock_site.set_behaviour(HOST, behaviour)
    urls = [{"url": mock_site.url(HOST, "/page/0"), "meta": meta}]
    settings = {**SLOTKIT, "BACKOFF_MIN_DELAY": 0.01, "BACKOFF_RESEND_TIMEOUT": 1.0}
    result = await run_crawl(ListSpider, settings, urls=urls)
    if answered:
        assert [r.status for r in result.responses] == [200]
        assert "retry/count" not in result.stats
        sent = mock_site.recorder.count(HOST)
        assert result.stats["throttling/backoff/resent"] == sent - 1
    else:  # no cookie may come back: the challenge is never answered
        assert all(r.status == 429 for r in result.responses)
        records = mock_site.recorder.for_host(HOST)
        assert len(records) > 1
        assert not any(k.lower() == "cookie" for r in records for k in r.headers)


class RotateUserAgent:
    """A project's middleware giving each attempt its own user agent."""

    def process_request(self, request: Any, spider: Any = None) -> None:
        request.headers["User-Agent"] = "agent-2"


@pytest_twisted.ensureDeferred
async def test_middlewares_that_miss_the_resends_are_named_at_start(mock_site: MockSite) -> None:
    middleware = f"{__name__}.RotateUserAgent"
    settings = {**SLOTKIT, "DOWNLOADER_MIDDLEWARES": {middleware: 560}}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 1))
    assert f"so {middleware} will not see the re-sent attempts" in result.log_text
    assert "BACKOFF_RESEND = False" in result.log_text
    quiet = await run_crawl(ListSpider, SLOTKIT, urls=pages(mock_site, HOST, 1))
    assert "will not see the re-sent attempts" not in quiet.log_text


class QuieterRetry(RetryMiddleware):
    """A project's RetryMiddleware subclass: its rules are RetryMiddleware's."""


class OwnRetry:
    """A project's own retry middleware, not a RetryMiddleware: slotkit cannot know its rules."""


@pytest.mark.parametrize(
    ("meta", "settings"),
    [
        pytest.param({"max_retry_times": 3}, {"RETRY_TIMES": 0}, id="meta-allows-more"),
        pytest.param({"retry_times": 1}, {}, id="one-retry-left"),
        pytest.param(
            {},
            {
                "DOWNLOADER_MIDDLEWARES": {
                    RETRY_MIDDLEWARE: None,
                    f"{__name__}.QuieterRetry": 550,
                }
            },
            id="subclass",
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_resend_where_retry_middleware_would_retry(
    mock_site: MockSite, meta: dict[str, Any], settings: dict[str, Any]
) -> None:
    mock_site.set_behaviour(HOST, fail_first(2, 429))
    urls = [{"url": mock_site.url(HOST, "/page/0"), "meta": meta}]
    settings = {**SLOTKIT, "BACKOFF_MIN_DELAY": 0.05, **settings}
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert [r.status for r in result.responses] == [200]
    assert result.stats["throttling/backoff/resent"] == 2
    assert "retry/count" not in result.stats


@pytest_twisted.ensureDeferred
async def test_a_replaced_retry_middleware_is_said_at_start(mock_site: MockSite) -> None:
    mock_site.set_behaviour(HOST, fail_first(1, 429))
    settings = {
        **SLOTKIT,
        "DOWNLOADER_MIDDLEWARES": {RETRY_MIDDLEWARE: None, f"{__name__}.OwnRetry": 550},
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 1))
    assert "rate-limited responses are handed on, not re-sent" in result.log_text
    assert [r.status for r in result.responses] == [429]


class NeverRetry429(RetryMiddleware):
    """A subclass with rules of its own: 429s are never retried."""

    def process_response(self, request: Any, response: Any, spider: Any = None) -> Any:
        if response.status == 429:
            return response
        return super().process_response(request, response)


@pytest.mark.parametrize("stock", [None, 550], ids=["replacing-stock", "beside-stock"])
@pytest_twisted.ensureDeferred
async def test_a_subclass_deciding_for_itself_gets_the_429(
    mock_site: MockSite, stock: int | None
) -> None:
    """A probe: a RetryMiddleware subclass overriding process_response never saw
    the 429 it meant to hand on; slotkit re-sent it behind its back. A review:
    added beside the stock middleware (nearer the downloader), it was missed."""
    mock_site.set_behaviour(HOST, fail_first(1, 429))
    settings = {
        **SLOTKIT,
        "BACKOFF_MIN_DELAY": 0.05,
        "DOWNLOADER_MIDDLEWARES": {RETRY_MIDDLEWARE: stock, f"{__name__}.NeverRetry429": 560},
        "HTTPERROR_ALLOW_ALL": True,
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 1))
    assert "NeverRetry429 overrides RetryMiddleware's process_response" in result.log_text
    assert "throttling/backoff/resent" not in result.stats
    assert result.stats["throttling/backoff/triggers/429"] == 1  # the scope still backs off
    if stock is None:
        assert [r.status for r in result.responses] == [429]
        assert mock_site.recorder.count(HOST) == 1
    else:  # the subclass let the 429 through; the stock middleware retried it, as in Scrapy
        assert [r.status for r in result.responses] == [200]
        assert result.stats["retry/count"] == 1


@pytest_twisted.ensureDeferred
async def test_resent_attempts_are_in_scrapys_downloader_stats(mock_site: MockSite) -> None:
    """The answered attempt went over the wire: stock stats count it, no retry is counted."""
    mock_site.set_behaviour(HOST, fail_first(2, 429))
    settings = {**SLOTKIT, "BACKOFF_MIN_DELAY": 0.05}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 1))
    assert [r.status for r in result.responses] == [200]
    assert mock_site.recorder.count(HOST) == 3
    assert result.stats["throttling/backoff/resent"] == 2
    assert result.stats["downloader/request_count"] == 3
    assert result.stats["downloader/response_count"] == 3
    assert result.stats["downloader/response_status_count/429"] == 2
    assert result.stats["downloader/response_status_count/200"] == 1
    assert "retry/count" not in result.stats


@pytest_twisted.ensureDeferred
async def test_dont_track_never_triggers_backoff(mock_site: MockSite) -> None:
    """throttling_dont_track keeps a request's 503 out of the scope's state."""
    mock_site.set_behaviour(HOST, fail_first(1, 503))
    urls = [
        {
            "url": mock_site.url(HOST, "/page/0"),
            "meta": {"throttling_dont_track": True, "dont_retry": True},
        }
    ]
    result = await run_crawl(ListSpider, SLOTKIT, urls=urls)
    assert [r.status for r in result.responses] == [503]
    assert "throttling/backoff/steps" not in result.stats


@pytest.mark.parametrize(
    ("meta", "settings"),
    [
        pytest.param({"throttling_dont_track": True}, {}, id="dont_track"),
        pytest.param({}, {"BACKOFF_HTTP_CODES": [503]}, id="429-not-a-trigger"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_429_that_triggers_nothing_goes_to_retry_middleware(
    mock_site: MockSite, meta: dict[str, Any], settings: dict[str, Any]
) -> None:
    """A 429 that makes no scope wait is not re-sent (that would loop at full speed).

    It goes on like any response: RetryMiddleware retries it RETRY_TIMES (2)
    times, so the server sees exactly 3 requests.
    """
    mock_site.set_behaviour(HOST, always(429))
    urls = [{"url": mock_site.url(HOST, "/page/0"), "meta": meta}]
    result = await run_crawl(ListSpider, {**SLOTKIT, **settings}, urls=urls)
    result.assert_no_unhandled_errors()
    assert mock_site.recorder.count(HOST) == 3
    assert result.stats["retry/max_reached"] == 1
    assert "throttling/backoff/resent" not in result.stats


class MaintenanceSpider(Spider):
    """Slows the whole host down from a callback, as in the delay_scope recipe."""

    name = "maintenance"

    def __init__(self, urls: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = urls
        self.seen: list[str] = []

    async def start(self) -> Any:
        from scrapy import Request

        for url in self.urls:
            yield Request(url, dont_filter=True)

    def parse(self, response: Any) -> Any:
        if not self.seen:
            self.crawler.throttler.delay_scope(self.scope_of(response), 0.5)
        self.seen.append(response.url)

    def scope_of(self, response: Any) -> str:
        return HOST


class NetlocMaintenanceSpider(MaintenanceSpider):
    """The spec's recipe as written: the scope is the response's netloc (host:port)."""

    def scope_of(self, response: Any) -> str:
        from scrapy.utils.httpobj import urlparse_cached

        return urlparse_cached(response).netloc


@pytest.mark.parametrize("spider", [MaintenanceSpider, NetlocMaintenanceSpider])
@pytest_twisted.ensureDeferred
async def test_delay_scope_holds_a_scope(mock_site: MockSite, spider: type[Spider]) -> None:
    """crawler.throttler.delay_scope() holds every later request of the scope.

    Named by host, or by ``netloc`` as in the spec's recipe: with a port in
    it, the host's scope (the default one) is held too.
    """
    urls = pages(mock_site, HOST, 3)
    settings = {**SLOTKIT, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    result = await run_crawl(spider, settings, urls=urls)
    dispatches = result.dispatch_times(HOST)
    assert len(dispatches) == 3
    # The second request was already on its way when the first callback ran.
    assert dispatches[2] - dispatches[0] >= 0.5 - EPSILON


@pytest_twisted.ensureDeferred
async def test_cached_responses_never_trigger_backoff(mock_site: MockSite, tmp_path: Any) -> None:
    """A 503 served by HttpCacheMiddleware from its cache does not slow the scope down."""
    mock_site.set_behaviour(HOST, always(503))
    settings = {
        **SLOTKIT,
        "HTTPCACHE_ENABLED": True,
        "HTTPCACHE_DIR": str(tmp_path / "cache"),
        "RETRY_ENABLED": False,
    }
    urls = pages(mock_site, HOST, 3)
    first = await run_crawl(ListSpider, settings, urls=urls)
    assert first.stats["throttling/backoff/steps"] == 1
    assert mock_site.recorder.count(HOST) == 3
    second = await run_crawl(ListSpider, settings, urls=urls)
    assert mock_site.recorder.count(HOST) == 3  # all three came from the cache
    assert [r.status for r in second.responses] == [503] * 3
    assert "throttling/backoff/steps" not in second.stats


class WaitHeaderManager(ThrottlingManager):
    """Honours a custom wait header by overriding get_response_delay."""

    def get_response_delay(self, response: Any) -> float | None:
        custom = response.headers.get(b"X-Come-Back-In")
        if custom is not None:
            return float(custom)
        return super().get_response_delay(response)


@pytest_twisted.ensureDeferred
async def test_get_response_delay_override_is_honoured(mock_site: MockSite) -> None:
    """get_response_backoff asks get_response_delay, so an override sets the hold."""
    mock_site.set_behaviour(HOST, fail_first(1, 503, {"X-Come-Back-In": "0.6"}))
    settings = {**SLOTKIT, "THROTTLING_MANAGER": WaitHeaderManager, "BACKOFF_MIN_DELAY": 0.05}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 1))
    assert [r.status for r in result.responses] == [200]
    first, second = result.dispatch_times(HOST)
    assert second - first >= 0.6 - EPSILON
    assert result.stats["throttling/backoff/header_hints"] == 1


@pytest_twisted.ensureDeferred
async def test_shared_backoff_counts_a_request_by_when_it_left(mock_site: MockSite) -> None:
    """Shared mode: a request that waited for its reservation after the local gate
    admitted it, and left after a backoff step, is a new trigger, not a duplicate."""
    mock_site.set_behaviour(HOST, fail_first(3, 503))
    settings = {
        **SLOTKIT,
        "THROTTLING_REDIS_URL": "local",
        "THROTTLING_REDIS_NAMESPACE": "backoff-left-at",
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        # Each 503 must come back before the next request leaves (one gap
        # later), or that request really was part of the burst: a gap long
        # enough for a loaded machine's round trip. The steps stay at this
        # gap (capped), to keep the crawl short.
        "DOWNLOAD_DELAY": 0.5,
        "BACKOFF_MIN_DELAY": 0.5,
        "BACKOFF_MAX_DELAY": 0.5,
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 4))
    assert sorted(r.status for r in result.responses) == [200] * 4
    # Each 503 answered a request sent after the step the previous one caused,
    # as in one process without the store.
    assert result.stats["throttling/backoff/steps"] == 3
    assert "throttling/backoff/deduplicated" not in result.stats
    assert result.stats["throttling/shared/backoff/step"] == 3


@pytest_twisted.ensureDeferred
async def test_shared_waits_are_in_the_wait_stats(mock_site: MockSite) -> None:
    """A request held for its reservation in the store waited: the wait stats say so."""
    settings = {
        **SLOTKIT,
        "THROTTLING_REDIS_URL": "local",
        # The local store lives as long as the reactor: a namespace of its own.
        "THROTTLING_REDIS_NAMESPACE": "wait-stats",
        "DOWNLOAD_DELAY": 0.2,
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 4))
    assert sorted(r.status for r in result.responses) == [200] * 4
    # The first goes at once; the three others wait their turn (0.2 s apart).
    assert result.stats["throttling/requests_delayed"] == 3
    assert result.stats["throttling/wait_time_max"] >= 0.4


class DraftShapeManager(ThrottlingManager):
    """Written against the upstream draft: a bare scope id, or a plain dict record."""

    async def get_response_backoff(self, response: Any) -> Any:
        said = response.headers.get(b"X-Slow-Down")
        if said == b"step":
            return HOST
        if said is not None:
            return {HOST: {"delay": float(said)}}
        return await super().get_response_backoff(response)


@pytest.mark.parametrize(("header", "gap"), [("step", 0.3), ("0.6", 0.6)])
@pytest_twisted.ensureDeferred
async def test_a_manager_may_answer_in_the_drafts_shapes(
    mock_site: MockSite, header: str, gap: float
) -> None:
    """A probe: returning the scope id from get_response_backoff failed the request
    ('str' object has no attribute 'items'). A bare id is a backoff step, a
    {"delay": s} record a hold, and the page arrives either way."""
    mock_site.set_behaviour(HOST, fail_first(1, 200, {"X-Slow-Down": header}))
    settings = {
        **SLOTKIT,
        "THROTTLING_MANAGER": DraftShapeManager,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "BACKOFF_MIN_DELAY": 0.3,
    }
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, HOST, 2))
    result.assert_no_unhandled_errors()
    assert sorted(r.status for r in result.responses) == [200, 200]
    first, second = result.dispatch_times(HOST)
    assert second - first >= gap - EPSILON
    assert result.stats["throttling/backoff/triggers/200"] == 1
