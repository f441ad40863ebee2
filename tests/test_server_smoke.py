"""Smoke tests for the integration-test infrastructure (tests/server.py, tests/crawl.py).

They use Scrapy's stock downloader only, so they exercise the harness, not slotkit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from typing import Any

import pytest
import pytest_twisted
from scrapy.utils.reactor import is_asyncio_reactor_installed
from twisted.internet.defer import Deferred
from twisted.web.client import Agent, readBody

from tests.crawl import (
    EPOLL_REACTOR,
    SELECT_REACTOR,
    ListSpider,
    run_crawl,
    run_crawl_subprocess,
    run_crawl_subprocess_async,
)
from tests.server import MockSite, Reply, fail_first

STOCK = "scrapy.core.downloader.Downloader"

# twisted.web.client.readBody warns about the asyncio reactor's transport proxy
pytestmark = pytest.mark.filterwarnings("ignore:Using readBody:DeprecationWarning")


@pytest_twisted.async_yield_fixture
async def site() -> AsyncIterator[MockSite]:
    s = MockSite()
    await s.start()
    yield s
    await s.stop()


@pytest_twisted.inlineCallbacks
def _get(url: str) -> Generator[Deferred[Any], Any, tuple[int, dict[str, str], bytes]]:
    from twisted.internet import reactor

    response = yield Agent(reactor).request(b"GET", url.encode())
    body = yield readBody(response)
    headers = {k.decode().lower(): v[0].decode() for k, v in response.headers.getAllRawHeaders()}
    return response.code, headers, body


def test_asyncio_reactor_installed() -> None:
    assert is_asyncio_reactor_installed()


@pytest_twisted.ensureDeferred
async def test_answers_on_two_addresses(site: MockSite) -> None:
    code1, _, body1 = await _get(site.url("127.0.0.1", "/page/1"))
    code2, _, body2 = await _get(site.url("127.0.0.2", "/page/2"))
    code3, headers3, _ = await _get(
        site.url("127.0.0.1", "/status/429", retry_after="7", ratelimit_reset="3")
    )
    assert (code1, code2, code3) == (200, 200, 429)
    assert b"page 1 on 127.0.0.1" in body1
    assert b"page 2 on 127.0.0.2" in body2
    assert headers3["retry-after"] == "7"
    assert headers3["ratelimit-reset"] == "3"
    rec = site.recorder
    assert rec.hosts() == ["127.0.0.1", "127.0.0.2"]
    assert rec.count("127.0.0.1") == 2
    assert rec.paths("127.0.0.2") == ["/page/2"]
    assert rec.total_in_flight == 0
    assert all(r.finished is not None and not r.lost for r in rec.records)


@pytest_twisted.ensureDeferred
async def test_behaviour_robots_redirect(site: MockSite) -> None:
    site.set_behaviour("127.0.0.2", fail_first(2, 429, {"Retry-After": "1"}))
    site.set_behaviour("127.0.0.3", lambda req, n: Reply(503, {}, "busy", 0.05) if n == 0 else None)
    site.set_robots("127.0.0.2", "User-agent: *\nDisallow: /private\n")
    codes = [(await _get(site.url("127.0.0.2", "/page/1")))[0] for _ in range(3)]
    assert codes == [429, 429, 200]
    assert [(await _get(site.url("127.0.0.3", "/page/1")))[0] for _ in range(2)] == [
        503,
        200,
    ]
    code, _, body = await _get(site.url("127.0.0.2", "/robots.txt"))
    assert code == 200
    assert b"Disallow: /private" in body
    assert (await _get(site.url("127.0.0.1", "/robots.txt")))[0] == 404
    code, headers, _ = await _get(
        site.url("127.0.0.1", "/redirect", to=site.url("127.0.0.2", "/page/9"))
    )
    assert code == 302
    assert headers["location"].endswith("/page/9")


@pytest_twisted.ensureDeferred
async def test_stock_crawl_two_hosts(site: MockSite) -> None:
    urls = [site.url(h, f"/page/{i}") for h in ("127.0.0.1", "127.0.0.2") for i in range(5)]
    result = await run_crawl(ListSpider, {"DOWNLOADER": STOCK}, urls=urls)
    assert result.finish_reason == "finished"
    assert sorted(result.urls) == sorted(urls)
    assert result.statuses == {200: 10}
    assert len(result.items) == 10
    assert result.stats["downloader/response_status_count/200"] == 10
    assert site.recorder.count("127.0.0.1") == 5
    assert site.recorder.count("127.0.0.2") == 5
    assert any("Spider closed (finished)" in line for line in result.log_lines)
    result.assert_no_unhandled_errors()


@pytest_twisted.ensureDeferred
async def test_stock_crawl_errors_and_follow(site: MockSite) -> None:
    result = await run_crawl(
        ListSpider,
        {"DOWNLOADER": STOCK, "RETRY_ENABLED": False, "DOWNLOAD_TIMEOUT": 0.5},
        urls=[
            site.url("127.0.0.1", "/page/0", links=3, max=13),
            site.url("127.0.0.2", "/status/404"),
            site.url("127.0.0.2", "/drop"),
            site.url("127.0.0.3", "/hang"),
            site.url("localhost", "/page/1"),
        ],
        follow_links=True,
    )
    ok = [r for r in result.responses if r.via == "callback"]
    assert sum(1 for r in ok if r.url.startswith(site.url("127.0.0.1"))) == 13
    assert site.recorder.count("localhost") == 1
    kinds = {e.type for e in result.errors}
    assert "HttpError" in kinds
    assert "DownloadTimeoutError" in kinds  # /hang
    assert "ResponseDataLossError" in kinds  # /drop
    assert site.recorder.for_host("127.0.0.3")[0].lost
    print("error kinds:", sorted(kinds))
    result.assert_no_unhandled_errors()


@pytest_twisted.ensureDeferred
async def test_stock_high_water_mark(site: MockSite) -> None:
    urls = [site.url("127.0.0.1", f"/page/{i}", delay=0.2) for i in range(12)]
    result = await run_crawl(
        ListSpider,
        {"DOWNLOADER": STOCK, "CONCURRENT_REQUESTS_PER_DOMAIN": 2},
        urls=urls,
    )
    assert result.statuses == {200: 12}
    rec = site.recorder
    hwm = rec.max_in_flight["127.0.0.1"]
    assert hwm == rec.max_concurrency(["127.0.0.1"])
    assert hwm >= 2
    # Not asserted <= 2: stock Scrapy 2.19 overshoots under the asyncio reactor.
    print(f"stock downloader, CONCURRENT_REQUESTS_PER_DOMAIN=2: {hwm} in flight")


def test_subprocess_non_asyncio_reactor() -> None:
    data = run_crawl_subprocess(
        reactor=SELECT_REACTOR,
        settings={"DOWNLOADER": STOCK, "CONCURRENT_REQUESTS_PER_DOMAIN": 2},
        spider_kwargs={"urls": [f"http://127.0.0.2:{{port}}/page/{i}?delay=0.1" for i in range(6)]},
    )
    assert data["reactor"] == SELECT_REACTOR
    assert data["stats"]["finish_reason"] == "finished"
    assert [r["status"] for r in data["responses"]] == [200] * 6
    assert data["recorder"]["max_in_flight"]["127.0.0.2"] >= 1
    assert not data["unhandled"]
    hwm = data["recorder"]["max_in_flight"]["127.0.0.2"]
    print(f"stock downloader under SelectReactor, limit 2: {hwm} in flight")


@pytest_twisted.ensureDeferred
async def test_subprocess_async_epoll_with_site_spec() -> None:
    data = await run_crawl_subprocess_async(
        reactor=EPOLL_REACTOR,
        settings={"DOWNLOADER": STOCK, "RETRY_HTTP_CODES": [429], "RETRY_TIMES": 3},
        spider_kwargs={"urls": ["http://127.0.0.1:{port}/page/1"]},
        site_setup={"behaviours": {"127.0.0.1": {"fail_first": {"count": 2}}}},
    )
    assert data["reactor"] == EPOLL_REACTOR
    assert [r["status"] for r in data["responses"]] == [200]
    assert data["stats"]["retry/count"] == 2
    assert [r["status"] for r in data["recorder"]["records"]] == [429, 429, 200]


@pytest_twisted.ensureDeferred
async def test_resolve_fake_hostnames(site: MockSite) -> None:
    names = {"a.example.test": "127.0.0.1", "b.example.test": "127.0.0.2"}
    result = await run_crawl(
        ListSpider,
        {"DOWNLOADER": STOCK},
        resolve=names,
        urls=[site.url(name, "/page/1") for name in names],
    )
    assert result.statuses == {200: 2}
    assert site.recorder.hosts() == ["a.example.test", "b.example.test"]


class _LeakySpider(ListSpider):
    """Leaves a failed Deferred nobody handles, like a buggy component would."""

    def parse(self, response: Any, **kwargs: Any) -> Any:
        d: Deferred[None] = Deferred()
        d.errback(ValueError("nobody handles me"))
        del d
        return super().parse(response, **kwargs)


@pytest_twisted.ensureDeferred
async def test_unhandled_error_detection(site: MockSite) -> None:
    result = await run_crawl(_LeakySpider, {"DOWNLOADER": STOCK}, urls=[site.url(path="/page/1")])
    assert any("Unhandled error in Deferred" in line for line in result.unhandled_errors())
    with pytest.raises(AssertionError, match="nobody handles me"):
        result.assert_no_unhandled_errors()


@pytest.mark.parametrize("host", ["127.0.0.9"])
def test_rejects_non_loopback_free_addresses(host: str) -> None:
    with pytest.raises(ValueError, match="127"):
        MockSite(hosts=["0.0.0.0"])
    assert MockSite(hosts=[host]).hosts == (host,)
