"""Real crawls through the Scrapy engine with slotkit's downloader, on loopback."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from scrapy import Request

from slotkit.scope import OPENING_ALLOWANCE
from tests.crawl import EPOLL_REACTOR, ListSpider, run_crawl, run_crawl_subprocess_async
from tests.server import MockSite

pytestmark = pytest.mark.integration

SLOTKIT = {"DOWNLOADER": "slotkit.Downloader", "DOWNLOAD_DELAY_JITTER": 0}
SLOW = 0.2  # seconds each page takes to answer
DELAY = 0.15


@pytest_twisted.ensureDeferred
async def test_domain_concurrency_holds_under_asyncio_reactor(mock_site: MockSite) -> None:
    """CONCURRENT_REQUESTS_PER_DOMAIN = 2 means 2 in flight, even with slow responses."""
    urls = [mock_site.url("127.0.0.1", f"/page/{i}", delay=SLOW) for i in range(12)]
    result = await run_crawl(
        ListSpider, {**SLOTKIT, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}, urls=urls
    )
    result.assert_no_unhandled_errors()
    assert len(result.responses) == 12
    assert mock_site.recorder.max_in_flight["127.0.0.1"] == 2


@pytest_twisted.ensureDeferred
async def test_domain_concurrency_holds_under_plain_twisted_reactor() -> None:
    """The same limit holds on a non-asyncio reactor (run in a subprocess)."""
    urls = [f"http://127.0.0.1:{{port}}/page/{i}?delay={SLOW}" for i in range(8)]
    result = await run_crawl_subprocess_async(
        reactor=EPOLL_REACTOR,
        settings={**SLOTKIT, "CONCURRENT_REQUESTS_PER_DOMAIN": 2},
        spider_kwargs={"urls": urls},
    )
    assert len(result["responses"]) == 8
    assert result["recorder"]["max_in_flight"]["127.0.0.1"] == 2


@pytest_twisted.ensureDeferred
async def test_delay_is_a_minimum_gap_per_host(mock_site: MockSite) -> None:
    """DOWNLOAD_DELAY spaces dispatches to one host; another host is paced on its own."""
    urls = [
        mock_site.url(host, f"/page/{i}") for i in range(5) for host in ("127.0.0.1", "127.0.0.2")
    ]
    before = mock_site.reactor.seconds()
    result = await run_crawl(ListSpider, {**SLOTKIT, "DOWNLOAD_DELAY": DELAY}, urls=urls)
    assert len(result.responses) == 10
    for host in ("127.0.0.1", "127.0.0.2"):
        gaps = result.dispatch_gaps(host)
        assert len(gaps) == 4
        # Measured where the downloader lets requests go: the server sees
        # them later by a varying amount (connection set-up, a busy reactor).
        assert min(gaps) >= DELAY - 0.001
        assert mock_site.recorder.arrivals(host)[1] - before >= DELAY
    first = {host: result.dispatch_times(host)[0] for host in ("127.0.0.1", "127.0.0.2")}
    assert abs(first["127.0.0.1"] - first["127.0.0.2"]) < DELAY


@pytest.mark.parametrize(
    "scheduler",
    [
        {},
        {
            "SCHEDULER": "slotkit.scheduler.ThrottlingAwareScheduler",
            "SCHEDULER_PRIORITY_QUEUE": "slotkit.pqueue.ThrottlingAwarePriorityQueue",
        },
    ],
    ids=["stock-scheduler", "throttling-aware-scheduler"],
)
@pytest_twisted.ensureDeferred
async def test_a_first_response_slower_than_the_delay_holds_the_second_request(
    mock_site: MockSite, scheduler: dict[str, str]
) -> None:
    """Acceptance probe (DOWNLOAD_DELAY 0.3, 0.4 s responses): the second request
    reached the server 4-7 ms short of the delay after the first, which had
    also opened the connection. It waits for the first's end now."""
    delay, answer = 0.3, 0.4
    urls = [mock_site.url("127.0.0.1", f"/page/{i}", delay=answer) for i in range(3)]
    settings = {
        **SLOTKIT,
        **scheduler,
        "DOWNLOAD_DELAY": delay,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
    }
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 3
    arrivals = mock_site.recorder.arrivals("127.0.0.1")
    assert arrivals[1] - arrivals[0] >= answer + delay
    assert arrivals[2] - arrivals[1] >= delay - 0.001


@pytest_twisted.ensureDeferred
async def test_a_first_request_that_hangs_holds_its_scope_only_a_second_past_the_delay(
    mock_site: MockSite,
) -> None:
    """The second request does not wait for the first one's DOWNLOAD_TIMEOUT."""
    delay, timeout = 0.3, 2.5
    urls = [
        {"url": mock_site.url("127.0.0.1", "/hang"), "meta": {"dont_retry": True}},
        mock_site.url("127.0.0.1", "/page/1"),
    ]
    settings = {
        **SLOTKIT,
        "DOWNLOAD_DELAY": delay,
        "DOWNLOAD_TIMEOUT": timeout,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
    }
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 1
    hang = mock_site.recorder.arrivals("127.0.0.1", "/hang")[0]
    page = mock_site.recorder.arrivals("127.0.0.1", "/page")[0]
    assert delay + OPENING_ALLOWANCE - 0.01 <= page - hang < timeout


@pytest_twisted.ensureDeferred
async def test_throttling_scopes_meta_shares_a_custom_scope(mock_site: MockSite) -> None:
    """Requests to two hosts in one custom scope share its concurrency of 1."""
    urls = [
        {"url": mock_site.url(host, f"/page/{i}", delay=SLOW), "meta": {"throttling_scopes": "api"}}
        for i in range(3)
        for host in ("127.0.0.1", "127.0.0.2")
    ]
    result = await run_crawl(ListSpider, SLOTKIT, urls=urls)
    assert len(result.responses) == 6
    assert mock_site.recorder.max_concurrency() == 1


@pytest_twisted.ensureDeferred
async def test_download_slots_setting_maps_onto_scopes(mock_site: MockSite) -> None:
    """DOWNLOAD_SLOTS keeps its meaning: per-slot concurrency and delay."""
    urls = [mock_site.url("127.0.0.2", f"/page/{i}", delay=SLOW) for i in range(6)]
    settings = {**SLOTKIT, "DOWNLOAD_SLOTS": {"127.0.0.2": {"concurrency": 1}}}
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 6
    assert mock_site.recorder.max_in_flight["127.0.0.2"] == 1


@pytest_twisted.ensureDeferred
async def test_download_slot_meta_is_honoured(mock_site: MockSite) -> None:
    """A user-set download_slot groups hosts like in stock Scrapy."""
    urls = [
        {"url": mock_site.url(host, f"/page/{i}", delay=SLOW), "meta": {"download_slot": "shared"}}
        for i in range(3)
        for host in ("127.0.0.1", "127.0.0.2")
    ]
    settings = {**SLOTKIT, "DOWNLOAD_SLOTS": {"shared": {"concurrency": 2}}}
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 6
    assert mock_site.recorder.max_concurrency() == 2


@pytest_twisted.ensureDeferred
async def test_redirect_to_another_host_gets_that_hosts_scope(mock_site: MockSite) -> None:
    """A redirect is throttled by its new host, not pinned to the old one's slot."""
    target = mock_site.url("127.0.0.2", "/page/9")
    urls = [mock_site.url("127.0.0.1", "/redirect", to=target)]
    result = await run_crawl(ListSpider, SLOTKIT, urls=urls)
    assert [r.download_slot for r in result.responses] == ["127.0.0.2"]


@pytest_twisted.ensureDeferred
async def test_per_request_delay_holds_one_request(mock_site: MockSite) -> None:
    """throttling_delay holds a single request that long before it competes."""
    urls = [
        mock_site.url("127.0.0.1", "/page/0"),
        {"url": mock_site.url("127.0.0.2", "/page/1"), "meta": {"throttling_delay": 0.3}},
    ]
    result = await run_crawl(ListSpider, SLOTKIT, urls=urls)
    assert len(result.responses) == 2
    early = mock_site.recorder.arrivals("127.0.0.1")[0]
    late = mock_site.recorder.arrivals("127.0.0.2")[0]
    assert late - early >= 0.25


class ChainSpider(ListSpider):
    """Each response leads to the next page, a request made from ``response.meta``."""

    def parse(self, response: Any, **kwargs: Any) -> Any:
        yield from super().parse(response, **kwargs)
        hop = int(response.url.rsplit("/", 1)[1])
        if hop < 2:
            url = response.url.rsplit("/", 1)[0] + f"/{hop + 1}"
            yield Request(url, meta=response.meta, callback=self.parse, dont_filter=True)


@pytest.mark.parametrize("aware", [False, True], ids=["downloader", "addon"])
@pytest_twisted.ensureDeferred
async def test_a_request_made_from_response_meta_waits_its_own_delay(
    mock_site: MockSite, aware: bool
) -> None:
    """An acceptance probe: the delay's end, kept in the meta, came along with
    ``response.meta``, and the next request (another one) went 5 ms after the
    response instead of its 0.3 s later."""
    settings = {**SLOTKIT, "ADDONS": {"slotkit.Addon": 0}} if aware else SLOTKIT
    start = {"url": mock_site.url("127.0.0.1", "/page/0"), "meta": {"throttling_delay": 0.3}}
    result = await run_crawl(ChainSpider, settings, urls=[start])
    result.assert_no_unhandled_errors()
    assert len(result.responses) == 3
    answered = [r.received for r in result.responses]
    sent = result.dispatch_times("127.0.0.1")
    assert [b - a >= 0.3 - 1e-3 for a, b in zip(answered, sent[1:], strict=False)] == [True] * 2


@pytest_twisted.ensureDeferred
async def test_a_bad_per_request_delay_is_ignored_with_a_warning(mock_site: MockSite) -> None:
    """Acceptance probes: ``inf`` was taken as a delay, and the crawl never ended by
    itself; the text ``"1"`` was taken as 1 s without a word (delay_scope refuses it)."""
    bad: list[Any] = [float("inf"), float("nan"), -3, True, "abc", 1e400, "1"]
    urls = [
        {"url": mock_site.url("127.0.0.1", f"/page/{i}"), "meta": {"throttling_delay": value}}
        for i, value in enumerate(bad)
    ]
    result = await run_crawl(ListSpider, SLOTKIT, urls=urls, crawl_timeout=10.0)
    assert len(result.responses) == len(bad)
    assert result.stats.get("finish_reason") == "finished"
    warned = [
        r.getMessage() for r in result.log_records if "Ignoring throttling_delay" in r.getMessage()
    ]
    assert len(warned) == len(bad)
    assert all("expected a finite number of seconds >= 0" in message for message in warned)


@pytest_twisted.ensureDeferred
async def test_a_misspelt_meta_key_is_warned_about_once(mock_site: MockSite) -> None:
    """A spec audit: ``throttling_scope`` was ignored without a word (settings get a warning).

    Near misses without the prefix (``throttle_delay``) too; other keys not.
    """
    meta = {"throttling_scope": "api", "throttle_delay": 0.1, "download_timeout": 5}
    urls = [{"url": mock_site.url("127.0.0.1", f"/page/{i}"), "meta": meta} for i in range(3)]
    result = await run_crawl(ListSpider, SLOTKIT, urls=urls)
    assert len(result.responses) == 3
    said = "is ignored: slotkit reads"
    warned = [r.getMessage() for r in result.log_records if said in r.getMessage()]
    assert len(warned) == 2
    assert "'throttling_scope' is ignored" in warned[0]
    assert "(did you mean 'throttling_scopes'?)" in warned[0]
    assert "(did you mean 'throttling_delay'?)" in warned[1]
    again = await run_crawl(ListSpider, SLOTKIT, urls=urls[:1])  # each crawl says it
    assert sum(said in r.getMessage() for r in again.log_records) == 2


@pytest_twisted.ensureDeferred
async def test_a_bad_throttling_scopes_meta_fails_its_request_naming_the_meta(
    mock_site: MockSite,
) -> None:
    """Acceptance probe: the error blamed a get_scopes() the user never wrote."""
    urls = [
        {"url": mock_site.url("127.0.0.1", "/page/0"), "meta": {"throttling_scopes": 5}},
        {"url": mock_site.url("127.0.0.1", "/page/1"), "meta": {"throttling_scopes": b"api"}},
        {"url": mock_site.url("127.0.0.1", "/page/2"), "meta": {"throttling_scopes": "api"}},
        {"url": mock_site.url("127.0.0.1", "/page/3"), "meta": {"throttling_scopes": {"a": -1}}},
        # An acceptance probe: "" was taken as a scope, where THROTTLING_SCOPES refuses it.
        {"url": mock_site.url("127.0.0.1", "/page/4"), "meta": {"throttling_scopes": ""}},
        {"url": mock_site.url("127.0.0.1", "/page/5"), "meta": {"throttling_scopes": ["", "a"]}},
    ]
    result = await run_crawl(ListSpider, SLOTKIT, urls=urls)
    assert len(result.responses) == 1
    failed = sorted(error.url.rsplit("/", 1)[1] for error in result.errors)
    assert failed == ["0", "1", "3", "4", "5"]
    for error in result.errors:
        assert error.type in {"TypeError", "ValueError"}
        assert error.message.startswith("the throttling_scopes meta of <GET ")


@pytest_twisted.ensureDeferred
async def test_stats_count_waiting(mock_site: MockSite) -> None:
    """throttling/* stats report delayed requests and the waiting peak."""
    urls = [mock_site.url("127.0.0.1", f"/page/{i}") for i in range(4)]
    result = await run_crawl(ListSpider, {**SLOTKIT, "DOWNLOAD_DELAY": 0.05}, urls=urls)
    assert result.stats["throttling/requests_delayed"] >= 3
    assert result.stats["throttling/waiting_peak"] >= 1
    assert result.stats["throttling/wait_time_max"] > 0


@pytest_twisted.ensureDeferred
async def test_bad_setting_fails_at_start(mock_site: MockSite) -> None:
    """A misspelt THROTTLING_SCOPES key stops the crawl before any request."""
    from slotkit import SettingsError

    with pytest.raises(SettingsError, match="did you mean 'concurrency'"):
        await run_crawl(
            ListSpider,
            {**SLOTKIT, "THROTTLING_SCOPES": {"a": {"concurency": 2}}},
            urls=[mock_site.url("127.0.0.1", "/page/1")],
        )
    assert mock_site.recorder.count() == 0


@pytest_twisted.ensureDeferred
async def test_priority_goes_first_within_a_scope(mock_site: MockSite) -> None:
    """Among waiting requests of a scope, the higher priority is sent first."""
    low = [{"url": mock_site.url("127.0.0.1", f"/page/{i}"), "priority": 0} for i in range(3)]
    high = [{"url": mock_site.url("127.0.0.1", "/page/99"), "priority": 10}]
    settings = {**SLOTKIT, "DOWNLOAD_DELAY": 0.05, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    result = await run_crawl(ListSpider, settings, urls=low + high)
    assert len(result.responses) == 4
    paths = mock_site.recorder.paths("127.0.0.1")
    assert paths.index("/page/99") <= 1


def test_request_class_is_scrapys() -> None:
    """Requests stay plain Scrapy requests (no subclassing needed)."""
    assert Request("http://127.0.0.1/").meta == {}
