"""Unit tests for slotkit.Downloader on a Clock, with a download handler driven by hand.

The throttling time is a :class:`~twisted.internet.task.Clock`; nothing sleeps.
The ``fetch()`` tests run under pytest-twisted because Scrapy's middleware
chain goes through asyncio futures on the asyncio reactor: they only let the
loop turn with zero-delay calls (:func:`settle`) and move throttling time with
``clock.advance``.
"""

from __future__ import annotations

import asyncio
import math
from types import MethodType
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request, Spider, signals
from scrapy.http import Response
from scrapy.signalmanager import SignalManager
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.test import get_crawler
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from slotkit import (
    Downloader,
    GateClosedError,
    ThrottlingManager,
    ThrottlingScopeManager,
    scope_cache,
)
from slotkit.manager import AUTO_SLOT, DOWNLOAD_SLOT
from slotkit.scope_managers import ScopeManagerError
from slotkit.settings import DOMAIN, IP, SettingsError
from slotkit.slots import SlotView

ONE_DELAY = 1.0
HALF_DELAY = 0.5
HOLD = 30.0


class ManualHandler:
    """A download handler whose downloads end when the test says so."""

    lazy = False

    def __init__(self, crawler) -> None:
        self.pending: list[tuple[Request, Deferred[Response]]] = []
        self.started: list[str] = []
        crawler.manual_handler = self

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    async def download_request(self, request: Request) -> Response:
        self.started.append(request.url)
        if request.meta.get("raise_now"):
            raise ValueError("the handler failed before any I/O")
        canceller = _cut_off if request.meta.get("cut_off_on_cancel") else None
        deferred: Deferred[Response] = Deferred(canceller)
        self.pending.append((request, deferred))
        return await maybe_deferred_to_future(deferred)

    def finish(self, url: str, status: int = 200) -> None:
        """Answer the pending download of *url*."""
        for index, (request, deferred) in enumerate(self.pending):
            if request.url == url:
                del self.pending[index]
                deferred.callback(Response(url, status=status, request=request))
                return
        raise AssertionError(f"{url} is not being downloaded")

    async def close(self) -> None:
        pass


def _cut_off(deferred: Deferred[Response]) -> None:
    """Fail *deferred* as Scrapy's HTTP handler does when its transfer is
    cancelled: a response never received (reason: CancelledError), wrapped."""
    from scrapy.exceptions import DownloadFailedError
    from twisted.web._newclient import ResponseNeverReceived

    try:
        raise DownloadFailedError("cut") from ResponseNeverReceived([Failure(CancelledError())])
    except DownloadFailedError as exc:
        deferred.errback(Failure(exc))


BASE_SETTINGS: dict[str, Any] = {
    "DOWNLOAD_HANDLERS": {"http": ManualHandler, "https": ManualHandler},
    "RETRY_ENABLED": False,
    "DOWNLOAD_DELAY_JITTER": 0,
    "TELNETCONSOLE_ENABLED": False,
}


def make_downloader(
    settings: dict[str, Any] | None = None, clock: Clock | None = None
) -> tuple[Downloader, Clock]:
    clock = clock if clock is not None else Clock()
    crawler = get_crawler(Spider, settings_dict={**BASE_SETTINGS, **(settings or {})})
    crawler.spider = crawler._create_spider("unit")
    return Downloader(crawler, clock=clock), clock


def handler_of(downloader: Downloader) -> ManualHandler:
    return downloader.crawler.manual_handler  # type: ignore[attr-defined,no-any-return]


async def settle(turns: int = 30) -> None:
    """Let the event loop run pending callbacks (zero-delay turns; no time passes)."""
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    for _ in range(turns):
        await deferLater(reactor, 0)


async def finish_each(handler: ManualHandler, requests: list[Request]) -> None:
    """Answer *requests* one by one, letting the next ones start in between."""
    for request in requests:
        await settle()
        handler.finish(request.url)
    await settle()


def outcome(deferred: Deferred[Any]) -> list[Any]:
    """A list that receives the result (or Failure) of *deferred*, consuming errors."""
    box: list[Any] = []
    deferred.addBoth(box.append)
    return box


# ----------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"THROTTLING_SCOPES": {"a": 1}}, "THROTTLING_SCOPES['a'] must be a dict"),
        ({"THROTTLING_SCOPES": {"a": {"delay": -1}}}, "THROTTLING_SCOPES['a']['delay']"),
        ({"THROTTLING_SCOPES": {"a": {"concurrency": 0}}}, "THROTTLING_SCOPES['a']['concurrency']"),
        ({"THROTTLING_SCOPES": {"a": {"concurency": 2}}}, "did you mean 'concurrency'?"),
        ({"THROTTLING_MANAGER": "tests.test_downloader_unit.NotAManager"}, "IThrottlingManager"),
        ({"THROTTLING_MANAGER": "no.such.Manager"}, "THROTTLING_MANAGER could not be imported"),
        (
            {"THROTTLING_SCOPE_MANAGER": "tests.test_downloader_unit.HalfScopeManager"},
            "THROTTLING_SCOPE_MANAGER names",
        ),
        (
            {
                "THROTTLING_SCOPES": {
                    "api": {"manager": "tests.test_downloader_unit.HalfScopeManager"}
                }
            },
            "THROTTLING_SCOPES['api']['manager'] names",
        ),
        # Probes: checked even where nothing reads them (no store, robots off).
        ({"THROTTLING_REDIS_TIMEOUT": -1}, "THROTTLING_REDIS_TIMEOUT must be"),
        (
            {"ROBOTSTXT_OBEY": False, "THROTTLING_ROBOTSTXT_OBEY": "maybe"},
            "THROTTLING_ROBOTSTXT_OBEY must be True or False",
        ),
    ],
)
def test_bad_settings_fail_at_construction(settings: dict[str, Any], fragment: str):
    """A bad setting raises SettingsError when the downloader is built, before any request."""
    with pytest.raises(SettingsError) as info:
        make_downloader(settings)
    assert fragment in str(info.value)


class NotAManager:
    """Has none of the throttling manager's methods."""


class HalfScopeManager:
    """A scope manager class that lacks most of the interface."""

    def can_send(self, now, amount):
        return 0.0


def test_construction_exposes_the_manager_as_crawler_throttler():
    """The throttling manager is reachable as crawler.throttler, attached to the downloader."""
    downloader, _ = make_downloader()
    assert isinstance(downloader.manager, ThrottlingManager)
    assert downloader.crawler.throttler is downloader.manager  # type: ignore[attr-defined]
    assert downloader.active == set()
    assert len(downloader.slots) == 0


# ----------------------------------------------------------------- slot keys


def test_get_slot_key_defaults_to_the_host():
    """get_slot_key is the request's host name by default."""
    downloader, _ = make_downloader()
    assert downloader.get_slot_key(Request("https://books.toscrape.com/x")) == "books.toscrape.com"


def test_get_slot_key_honours_download_slot_and_throttling_scopes():
    """A user download_slot, or the first of the throttling_scopes, is the slot key."""
    downloader, _ = make_downloader()
    assert (
        downloader.get_slot_key(Request("https://a.example/", meta={DOWNLOAD_SLOT: "mine"}))
        == "mine"
    )
    request = Request("https://a.example/", meta={"throttling_scopes": ["api", "users"]})
    assert downloader.get_slot_key(request) == "api"


def test_get_slot_key_ignores_the_automatic_slot_after_a_redirect():
    """A download_slot written by slotkit itself does not pin a redirected request."""
    downloader, _ = make_downloader()
    request = Request("https://old.example/")
    request.meta[DOWNLOAD_SLOT] = request.meta[AUTO_SLOT] = "old.example"
    assert downloader.get_slot_key(request.replace(url="https://new.example/")) == "new.example"


class AsyncManager(ThrottlingManager):
    @scope_cache
    async def get_scopes(self, request):
        return ["api", "other"]


class _Pending:
    def __await__(self):
        yield self  # as a pending Future or Deferred does


class WaitingAsyncManager(ThrottlingManager):
    async def get_scopes(self, request):
        await _Pending()  # a DNS lookup, say
        return ["api", "other"]


def test_get_slot_key_with_an_async_manager_that_awaits_nothing_pending():
    """An async get_scopes that needs no wait answers get_slot_key synchronously."""
    downloader, _ = make_downloader(
        {"THROTTLING_MANAGER": "tests.test_downloader_unit.AsyncManager"}
    )
    assert downloader.get_slot_key(Request("https://a.example/")) == "api"


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_get_slot_key_with_an_async_manager_that_waits_falls_back_quietly():
    """With an async get_scopes that must wait, get_slot_key falls back to the host."""
    downloader, _ = make_downloader(
        {"THROTTLING_MANAGER": "tests.test_downloader_unit.WaitingAsyncManager"}
    )
    request = Request("https://a.example/")
    assert downloader.get_slot_key(request) == "a.example"
    assert downloader.get_slot_key(request) == "a.example"  # remembered, not asked again


def test_get_slot_creates_the_scope_and_returns_a_view():
    """_get_slot returns (key, SlotView) and makes the scope visible in downloader.slots."""
    downloader, _ = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 3, "DOWNLOAD_DELAY": 2.0})
    key, slot = downloader._get_slot(Request("https://a.example/"))
    assert key == "a.example"
    assert isinstance(slot, SlotView)
    assert "a.example" in downloader.slots
    assert downloader.slots["a.example"].concurrency == 3
    assert downloader.slots["a.example"].delay == 2.0
    with pytest.raises(KeyError):
        downloader.slots["b.example"]


def test_get_slot_scope_uses_throttling_scopes_config():
    """A scope configured in THROTTLING_SCOPES is built with that configuration."""
    downloader, _ = make_downloader(
        {"THROTTLING_SCOPES": {"api": {"concurrency": 5, "delay": 0.25}}}
    )
    _, slot = downloader._get_slot(Request("https://a.example/", meta={"throttling_scopes": "api"}))
    assert (slot.concurrency, slot.delay) == (5, 0.25)


# ----------------------------------------------------------------- backout, close, hold


def test_needs_backout_follows_concurrent_requests():
    """needs_backout is true once CONCURRENT_REQUESTS requests are in the downloader."""
    downloader, _ = make_downloader({"CONCURRENT_REQUESTS": 2})
    assert not downloader.needs_backout()
    downloader.active.update({Request("https://a.example/1"), Request("https://a.example/2")})
    assert downloader.needs_backout()


def test_needs_backout_never_with_no_cap():
    """CONCURRENT_REQUESTS = 0 means no cap: never back out."""
    downloader, _ = make_downloader({"CONCURRENT_REQUESTS": 0})
    downloader.active.update(Request(f"https://a.example/{index}") for index in range(1000))
    assert not downloader.needs_backout()


def test_close_with_nothing_leaves_no_delayed_calls():
    """Closing an unused downloader leaves nothing scheduled."""
    downloader, clock = make_downloader()
    downloader.close()
    assert clock.getDelayedCalls() == []


def test_hold_scope_holds_the_scope():
    """hold_scope (delay_scope) makes the scope answer a wait until the hold ends."""
    downloader, clock = make_downloader()
    clock.advance(10.0)
    downloader.hold_scope("a.example", HOLD)
    scope = downloader.registry.peek("a.example")
    assert scope is not None
    assert scope.manager.can_send(clock.seconds(), None) == HOLD
    downloader.crawler.throttler.delay_scope("a.example", 5.0)  # type: ignore[attr-defined]
    assert scope.manager.can_send(clock.seconds(), None) == HOLD  # never shortened
    downloader.close()
    assert clock.getDelayedCalls() == []


@pytest.mark.parametrize(
    ("named", "site"),
    [
        ("a.example:8080", "a.example"),
        # An acceptance probe: these held a scope no request used, and the
        # site went on at full speed.
        ("svc:8080", "svc"),  # a single-label host, as in a compose network
        ("Shop.Example.test", "shop.example.test"),  # hosts' scopes are lower-case
        ("SHOP.EXAMPLE.TEST:8080", "shop.example.test"),
    ],
)
def test_hold_scope_of_a_netloc_holds_its_hosts_scope(named, site):
    downloader, clock = make_downloader()
    clock.advance(10.0)
    downloader.hold_scope(named, HOLD)
    scope = downloader.registry.peek(site)
    assert scope is not None
    assert scope.manager.can_send(clock.seconds(), None) == HOLD
    downloader.close()


@pytest.mark.parametrize("named", ["api.example.com:8443", "API.example.com:8443"])
def test_hold_scope_of_a_netloc_holds_the_scope_a_settings_key_names(named):
    """A review: a "host:port" key keeps its case as its requests' scope id, so the
    recipe's lower-case netloc held nothing they use."""
    key = "API.example.com:8443"
    downloader, clock = make_downloader({"THROTTLING_SCOPES": {key: {"concurrency": 2}}})
    request = Request("https://api.example.com:8443/v1")
    assert downloader.get_slot_key(request) == key
    clock.advance(10.0)
    downloader.hold_scope(named, HOLD)
    assert downloader.time_until_ready(request) == HOLD
    downloader.close()


def test_hold_scope_of_a_custom_scope_holds_only_that_scope():
    downloader, _clock = make_downloader()
    for custom in ("API", "api:v2", "cost"):
        downloader.hold_scope(custom, HOLD)
    assert sorted(downloader.registry) == ["API", "api:v2", "cost"]
    downloader.close()


@pytest.mark.parametrize("named", ["books.example.co.uk", "books.example.co.uk:8080"])
def test_hold_scope_of_a_host_holds_its_registrable_domain_group(named):
    """A probe: with registrable-domain grouping, delay_scope(response's hostname), as
    the recipe reads, held 'books.example.co.uk', a scope no request used, and the
    site went on at full speed. The host's group is held too now."""
    downloader, clock = make_downloader({"THROTTLING_DOMAIN_GROUPING": "registrable_domain"})
    clock.advance(10.0)
    downloader.hold_scope(named, HOLD)
    group = downloader.registry.peek("example.co.uk")
    assert group is not None
    assert group.manager.can_send(clock.seconds(), None) == HOLD
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_429_answered_after_close_leaves_no_timer():
    """A review: a request in flight at close answered 429 asked the crowding
    watch for a look after close() had cancelled its timer; it stayed behind."""
    downloader, clock = make_downloader({"RETRY_ENABLED": True, "CONCURRENT_REQUESTS": 2})
    handler = handler_of(downloader)
    request = Request("https://a.example/1")
    outcome(downloader.fetch(request))
    await settle()
    assert handler.started == [request.url]
    downloader.close()
    await settle()
    handler.finish(request.url, 429)
    await settle()
    assert clock.getDelayedCalls() == []


# ----------------------------------------------------------------- fetch, driven by hand


@pytest_twisted.ensureDeferred
async def test_fetch_respects_concurrency():
    """With CONCURRENT_REQUESTS_PER_DOMAIN = 2 the third download starts only when one ends."""
    downloader, clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 2})
    handler = handler_of(downloader)
    urls = [f"https://a.example/{index}" for index in range(3)]
    results = [outcome(downloader.fetch(Request(url))) for url in urls]
    await settle()
    assert handler.started == urls[:2]
    slot = downloader.slots["a.example"]
    assert len(slot.active) == 3
    assert len(slot.transferring) == 2
    handler.finish(urls[0])
    await settle()
    assert handler.started == urls
    assert isinstance(results[0][0], Response)
    handler.finish(urls[1])
    handler.finish(urls[2])
    await settle()
    assert all(isinstance(box[0], Response) for box in results)
    assert downloader.active == set()
    assert len(slot.active) == 0
    downloader.close()
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_fetch_respects_the_delay():
    """With DOWNLOAD_DELAY = 1 the second download starts exactly one clock second later."""
    downloader, clock = make_downloader({"DOWNLOAD_DELAY": ONE_DELAY})
    handler = handler_of(downloader)
    first, second = Request("https://a.example/1"), Request("https://a.example/2")
    outcome(downloader.fetch(first))
    outcome(downloader.fetch(second))
    await settle()
    assert handler.started == [first.url]
    handler.finish(first.url)
    await settle()  # it ends at 0: the gap after a scope's first request runs from its end
    clock.advance(HALF_DELAY)
    await settle()
    assert handler.started == [first.url]
    clock.advance(HALF_DELAY)
    await settle()
    assert handler.started == [first.url, second.url]
    handler.finish(second.url)
    await settle()
    downloader.close()
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_cancelling_a_waiting_fetch_withdraws_it():
    """Cancelling a fetch waiting at the gate fails it and hands its place to the next one."""
    downloader, clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 1})
    handler = handler_of(downloader)
    running, victim, after = (Request(f"https://a.example/{name}") for name in ("r", "v", "n"))
    outcome(downloader.fetch(running))
    victim_deferred = downloader.fetch(victim)
    victim_box = outcome(victim_deferred)
    outcome(downloader.fetch(after))
    await settle()
    victim_deferred.cancel()
    await settle()
    assert isinstance(victim_box[0], Failure)
    # Under the asyncio reactor the cancellation arrives through an asyncio future.
    assert victim_box[0].check(CancelledError, asyncio.CancelledError)
    scope = downloader.registry.peek("a.example")
    assert scope is not None
    assert victim not in scope.requests
    assert victim not in downloader.active
    handler.finish(running.url)
    await settle()
    assert handler.started == [running.url, after.url]
    handler.finish(after.url)
    await settle()
    downloader.close()
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_a_fetch_cancelled_as_the_gate_admits_it_gives_its_slot_back():
    """A cancel landing between the gate's admission and the fetch resuming (a
    caller's timeout expiring in the same reactor pass as the scope's timer)
    frees the slot it was admitted with: the scope does not stay full."""
    downloader, clock = make_downloader(
        {"CONCURRENT_REQUESTS_PER_DOMAIN": 1, "DOWNLOAD_DELAY": ONE_DELAY}
    )
    handler = handler_of(downloader)
    first, victim, after = (Request(f"https://a.example/{name}") for name in ("f", "v", "n"))
    outcome(downloader.fetch(first))
    await settle()
    handler.finish(first.url)
    await settle()
    victim_deferred = downloader.fetch(victim)
    victim_box = outcome(victim_deferred)
    await settle()
    clock.advance(ONE_DELAY)  # admitted: the gate hands over its ticket...
    victim_deferred.cancel()  # ...and the cancel comes before the fetch resumes
    await settle()
    assert isinstance(victim_box[0], Failure)
    outcome(downloader.fetch(after))
    await settle()
    clock.advance(ONE_DELAY)
    await settle()
    assert handler.started == [first.url, after.url]
    handler.finish(after.url)
    await settle()
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_close_fails_a_waiting_fetch_with_gate_closed_error():
    """Closing the downloader fails requests still waiting at the gate with GateClosedError."""
    downloader, clock = make_downloader({"DOWNLOAD_DELAY": ONE_DELAY})
    handler = handler_of(downloader)
    first, second = Request("https://a.example/1"), Request("https://a.example/2")
    outcome(downloader.fetch(first))
    box = outcome(downloader.fetch(second))
    await settle()
    downloader.close()
    await settle()
    assert isinstance(box[0], Failure)
    assert box[0].check(GateClosedError)
    assert clock.getDelayedCalls() == []
    handler.finish(first.url)
    await settle()
    assert handler.started == [first.url]
    assert downloader.active == set()


@pytest_twisted.ensureDeferred
async def test_a_request_reaching_a_closed_gate_counts_as_unsent():
    """One that arrives after the close is counted and told why, like those that waited.

    A probe saw requests_unsent_at_close one lower than the GateClosedError
    count now and then: a late arrival was not counted.
    """
    downloader, _ = make_downloader({"DOWNLOAD_DELAY": ONE_DELAY})
    handler = handler_of(downloader)
    first = Request("https://a.example/1")
    outcome(downloader.fetch(first))
    await settle()
    downloader.close()
    before = downloader.crawler.stats.get_value("throttling/requests_unsent_at_close", 0)
    box = outcome(downloader.fetch(Request("https://a.example/late")))
    await settle()
    assert box[0].check(GateClosedError)
    assert "https://a.example/late" in str(box[0].value)
    assert "a.example" in str(box[0].value)
    after = downloader.crawler.stats.get_value("throttling/requests_unsent_at_close", 0)
    assert after == before + 1
    handler.finish(first.url)
    await settle()


@pytest_twisted.ensureDeferred
async def test_handler_raising_releases_the_scope():
    """A handler that raises before any I/O still gives the scope's slot back."""
    downloader, clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 1})
    handler = handler_of(downloader)
    failing = Request("https://a.example/fail", meta={"raise_now": True})
    fine = Request("https://a.example/fine")
    failing_box = outcome(downloader.fetch(failing))
    fine_box = outcome(downloader.fetch(fine))
    await settle()
    assert failing_box[0].check(ValueError)
    assert handler.started == [failing.url, fine.url]
    scope = downloader.registry.peek("a.example")
    assert scope is not None
    assert scope.manager.active == 1
    handler.finish(fine.url)
    await settle()
    assert isinstance(fine_box[0], Response)
    assert scope.manager.active == 0
    assert scope.requests == set()
    downloader.close()
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_hold_scope_delays_waiting_fetches():
    """delay_scope holds requests of the scope until the hold ends on the clock."""
    downloader, clock = make_downloader()
    handler = handler_of(downloader)
    downloader.crawler.throttler.delay_scope("a.example", HOLD)  # type: ignore[attr-defined]
    request = Request("https://a.example/")
    box = outcome(downloader.fetch(request))
    await settle()
    assert handler.started == []
    clock.advance(HOLD)
    await settle()
    assert handler.started == [request.url]
    handler.finish(request.url)
    await settle()
    assert isinstance(box[0], Response)
    downloader.close()
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_signals_in_stock_order():
    """reached, downloaded, left: the downloader sends the stock signals once each, in order."""
    downloader, _ = make_downloader()
    handler = handler_of(downloader)
    seen: list[str] = []
    for name in ("request_reached_downloader", "response_downloaded", "request_left_downloader"):
        downloader.crawler.signals.connect(
            lambda name=name, **kwargs: seen.append(name), signal=getattr(signals, name), weak=False
        )
    request = Request("https://a.example/")
    outcome(downloader.fetch(request))
    await settle()
    assert seen == ["request_reached_downloader"]
    handler.finish(request.url)
    await settle()
    assert seen == [
        "request_reached_downloader",
        "response_downloaded",
        "request_left_downloader",
    ]


DOWNLOADER_SIGNALS = (
    signals.request_reached_downloader,
    signals.response_downloaded,
    signals.request_left_downloader,
)


@pytest_twisted.ensureDeferred
async def test_unheard_signals_are_not_sent_and_a_patched_sender_gets_them_all():
    """With no receiver the three sends are skipped; a replaced send_catch_log sees each."""
    downloader, _ = make_downloader()
    handler = handler_of(downloader)
    manager = downloader.crawler.signals
    sent: list[object] = []

    def counting_send(self: Any, signal: object, **kwargs: Any) -> Any:
        sent.append(signal)
        return SignalManager.send_catch_log(self, signal, **kwargs)

    async def fetch_one(name: str) -> None:
        request = Request(f"https://a.example/{name}")
        box = outcome(downloader.fetch(request))
        await settle()
        handler.finish(request.url)
        await settle()
        assert isinstance(box[0], Response)

    with pytest.MonkeyPatch.context() as patch:
        # counting_send stands in for the stock method: only real sends are counted.
        patch.setattr("slotkit.signaling._STOCK_SEND", counting_send)
        patch.setattr(manager, "send_catch_log", MethodType(counting_send, manager))
        await fetch_one("unheard")
    assert [s for s in sent if s in DOWNLOADER_SIGNALS] == []

    sent.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(manager, "send_catch_log", MethodType(counting_send, manager))
        await fetch_one("watched")
    assert [s for s in sent if s in DOWNLOADER_SIGNALS] == list(DOWNLOADER_SIGNALS)


@pytest_twisted.ensureDeferred
async def test_multi_scope_request_waits_for_the_shared_scope():
    """Two hosts sharing an 'api' scope of concurrency 1 take turns."""
    downloader, _ = make_downloader({"THROTTLING_SCOPES": {"api": {"concurrency": 1}}})
    handler = handler_of(downloader)
    first = Request("https://a.example/", meta={"throttling_scopes": ["a.example", "api"]})
    second = Request("https://b.example/", meta={"throttling_scopes": ["b.example", "api"]})
    outcome(downloader.fetch(first))
    outcome(downloader.fetch(second))
    await settle()
    assert handler.started == [first.url]
    assert second.meta[DOWNLOAD_SLOT] == "b.example"
    handler.finish(first.url)
    await settle()
    assert handler.started == [first.url, second.url]
    assert math.isclose(len(downloader.slots["api"].transferring), 1)
    handler.finish(second.url)
    await settle()


class AmountRecorder(ThrottlingScopeManager):
    """Records the amounts slotkit hands to a scope manager."""

    seen: list[float | None] = []

    def record_sent(self, now: float, amount: float | None = None) -> None:
        AmountRecorder.seen.append(amount)
        super().record_sent(now, amount)


@pytest_twisted.ensureDeferred
async def test_a_request_without_amounts_spends_one_unit_in_every_manager():
    """Custom managers get 1.0 when a request names no amount, its own amount otherwise.

    A manager that counts ``amount or 0`` (the spec's fixed-window example)
    would otherwise never limit plain requests.
    """
    AmountRecorder.seen = []
    downloader, _clock = make_downloader({"THROTTLING_SCOPE_MANAGER": AmountRecorder})
    handler = handler_of(downloader)
    plain = Request("https://a.example/1")
    costed = Request("https://a.example/2", meta={"throttling_scopes": {"a.example": 3.0}})
    for request in (plain, costed):
        outcome(downloader.fetch(request))
        await settle()
        handler.finish(request.url)
        await settle()
    assert AmountRecorder.seen == [1.0, 3.0]
    downloader.close()


class QuotaOnlyManager(ThrottlingScopeManager):
    """Built only for scopes with a quota, as the spec's fixed-window example is."""

    @classmethod
    def from_crawler(cls, crawler: Any, config: dict[str, Any]) -> QuotaOnlyManager:
        return cls(quota=config["quota"], window=config["window"])


@pytest_twisted.ensureDeferred
async def test_a_scope_manager_that_cannot_be_built_fails_its_requests_saying_why():
    """An acceptance probe: the spec's fixed-window manager set as the global
    THROTTLING_SCOPE_MANAGER failed every request with a bare KeyError: 'quota'."""
    downloader, _clock = make_downloader({"THROTTLING_SCOPE_MANAGER": QuotaOnlyManager})
    box = outcome(downloader.fetch(Request("https://a.example/1")))
    await settle()
    (failure,) = box
    assert failure.check(ScopeManagerError)
    message = str(failure.value)
    assert f"{QuotaOnlyManager.__module__}.QuotaOnlyManager" in message
    assert "THROTTLING_SCOPE_MANAGER" in message
    assert "KeyError: 'quota'" in message
    assert "building scope 'a.example'" in message
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_single_label_host_is_a_site_not_a_custom_scope():
    """``https://vm/`` gets CONCURRENT_REQUESTS_PER_DOMAIN; a custom ``"api"`` scope does not.

    Found by an acceptance probe: hosts from /etc/hosts or docker-compose
    (no dot in the name) ran one request at a time.
    """
    downloader, _clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 4})
    handler = handler_of(downloader)
    site = Request("https://vm/1")
    custom = Request("https://a.example/1", meta={"throttling_scopes": "api"})
    for request in (site, custom):
        outcome(downloader.fetch(request))
    await settle()
    assert downloader.slots["vm"].concurrency == 4
    assert downloader.slots["api"].concurrency == 1
    for request in (site, custom):
        handler.finish(request.url)
    await settle()
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_an_ipv6_address_in_a_url_keeps_an_ip_scope():
    """``https://[::1]/`` has no dot in its host, like a single-label site, but
    its scope is an address's: CONCURRENT_REQUESTS_PER_IP, shared with the host
    names that resolve to it. An acceptance probe saw it turned into a site's
    scope (8 in flight for a per-IP limit of 2)."""
    downloader, _clock = make_downloader(
        {"CONCURRENT_REQUESTS_PER_DOMAIN": 8, "CONCURRENT_REQUESTS_PER_IP": 2}
    )
    handler = handler_of(downloader)
    requests = [Request(f"https://[::1]:8443/{n}") for n in range(3)]
    for request in requests:
        outcome(downloader.fetch(request))
    await settle()
    scope = downloader.registry.peek("::1")
    assert scope is not None
    assert scope.kind == IP
    assert len(handler.pending) == 2
    await finish_each(handler, requests)
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_urls_without_a_host_share_a_site_scope():
    """``data:`` and ``file:`` URLs go through the scope ``""`` with
    CONCURRENT_REQUESTS_PER_DOMAIN, as through Scrapy's slot ``""``: a slow
    handler ran them one at a time."""
    downloader, _clock = make_downloader(
        {"CONCURRENT_REQUESTS_PER_DOMAIN": 3, "DOWNLOAD_HANDLERS": {"data": ManualHandler}}
    )
    handler = handler_of(downloader)
    requests = [Request(f"data:,{n}") for n in range(4)]
    for request in requests:
        outcome(downloader.fetch(request))
    await settle()
    assert len(handler.pending) == 3
    assert downloader.slots[""].concurrency == 3
    await finish_each(handler, requests)
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_transfer_cut_by_cancelling_is_no_backoff_signal(monkeypatch):
    """A download cut off by its caller's cancel ends in CancelledError and
    backs nothing off.

    On the plain Twisted reactor a cancelled in-flight fetch reaches slotkit
    as DownloadFailedError from a response never received; an acceptance
    probe saw it retried and the host backed off as if the site had failed.
    """
    import scrapy.utils.defer

    # The plain reactor's path: the fetch is a Deferred driving the coroutine,
    # and its cancel reaches the handler's Deferred.
    monkeypatch.setattr(scrapy.utils.defer, "is_asyncio_available", lambda: False)
    downloader, _clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 1})
    request = Request("https://a.example/1", meta={"dont_retry": True, "cut_off_on_cancel": True})
    fetching = downloader.fetch(request)
    box = outcome(fetching)
    await settle()
    assert handler_of(downloader).pending
    fetching.cancel()
    await settle()
    assert isinstance(box[0], Failure)
    assert box[0].check(CancelledError)
    assert "was cancelled" in str(box[0].value)
    assert downloader.registry.get("a.example").manager.backoff_delay is None
    stats = downloader.crawler.stats.get_stats()
    assert not [name for name in stats if name.startswith("throttling/backoff/")]
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_handler_cancelling_its_own_transfer_fails_as_it_says():
    """A handler that times out by cancelling its own transfer (a Twisted Agent
    with ``addTimeout``) fails with its own exception, as with Scrapy's
    downloader, and that failure counts for backoff: nobody cancelled the fetch.
    An acceptance probe saw it reported as a cancelled download instead."""
    from scrapy.exceptions import DownloadFailedError

    downloader, _clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 1})
    handler = handler_of(downloader)
    request = Request("https://a.example/1", meta={"cut_off_on_cancel": True})
    box = outcome(downloader.fetch(request))
    await settle()
    (_, pending) = handler.pending.pop()
    pending.cancel()  # the handler's own timeout
    await settle()
    assert isinstance(box[0], Failure)
    assert box[0].check(DownloadFailedError)
    assert not box[0].check(CancelledError)
    assert downloader.registry.get("a.example").manager.backoff_delay is not None
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_cancelling_a_finished_fetch_leaves_no_mark_on_its_request():
    """A review: the mark outlived the fetch, so the same request fetched again
    (re-yielded with dont_filter) and cut off by its handler's own timeout would
    have failed as cancelled by its caller: no backoff, no retry."""
    from scrapy.exceptions import DownloadFailedError

    downloader, _clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 1})
    handler = handler_of(downloader)
    request = Request("https://a.example/1", meta={"cut_off_on_cancel": True})
    dfd = downloader.fetch(request)
    box = outcome(dfd)
    await settle()
    handler.finish(request.url)
    await settle()
    assert not isinstance(box[0], Failure)
    dfd.cancel()  # too late: nothing to cancel
    again = outcome(downloader.fetch(request))
    await settle()
    (_, pending) = handler.pending.pop()
    pending.cancel()  # the handler's own timeout this time
    await settle()
    assert again[0].check(DownloadFailedError)
    downloader.close()


def test_a_servers_request_count_is_not_applied_to_a_cost_scope():
    """X-RateLimit-Remaining counts requests: it reconciles the scopes the request
    spends one unit in, not a scope where it names a cost."""
    downloader, _ = make_downloader(
        {"THROTTLING_SCOPES": {"a.example": {"quota": 12}, "cost": {"quota": 50}}}
    )
    request = Request("https://a.example/", meta={"throttling_scopes": {"a.example": None}})
    for scope_id in ("a.example", "cost"):
        downloader.registry.get(scope_id)
    downloader._scope_ids[request] = {"a.example": None, "cost": 5.0}
    response = Response(request.url, headers={"X-RateLimit-Remaining": "3"}, request=request)
    backoff = downloader.manager.get_response_backoff(response)
    assert set(backoff) == {"a.example"}
    assert backoff["a.example"].remaining == 3.0


@pytest.mark.parametrize(
    "headers",
    [
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2"},
        {"RateLimit-Remaining": "0", "RateLimit-Reset": "2"},
        {"RateLimit": "limit=100, remaining=0, reset=2"},
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_quota_the_server_reports_spent_opens_at_its_reset(headers):
    """A server that says its quota is spent and resets in 2 s holds the scope
    2 s, not the scope's whole window: an acceptance probe saw a 60 s window
    hold the crawl 60 s after ``remaining=0, reset=2``."""
    downloader, clock = make_downloader(
        {"THROTTLING_SCOPES": {"a.example": {"quota": 100, "window": 60}}}
    )
    handler = handler_of(downloader)
    first = Request("https://a.example/1")
    box = outcome(downloader.fetch(first))
    await settle()
    (_, pending) = handler.pending.pop()
    pending.callback(Response(first.url, headers=headers, request=first))
    await settle()
    assert box
    assert not isinstance(box[0], Failure)
    manager = downloader.registry.get("a.example").manager
    assert manager.can_send(clock.seconds()) == pytest.approx(2.0)
    clock.advance(2.0)
    assert manager.can_send(clock.seconds()) == 0.0
    second = outcome(downloader.fetch(Request("https://a.example/2")))
    await settle()
    assert handler.started[-1] == "https://a.example/2"
    handler.finish("https://a.example/2")
    await settle()
    assert second
    assert not isinstance(second[0], Failure)
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_spent_server_quota_holds_a_scope_without_a_quota_until_its_reset():
    """A 200 saying ``remaining 0, reset 2`` holds the scope 2 s though no quota is
    configured: the next request would only be answered 429 (the demo's API site
    answered 25 of 146 requests 429 before). A cost scope is left alone."""
    downloader, clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 3})
    handler = handler_of(downloader)
    request = Request("https://a.example/1")
    box = outcome(downloader.fetch(request))
    await settle()
    downloader._scope_ids[request] = {"a.example": None, "cost": 5.0}
    downloader.registry.get("cost")
    (_, pending) = handler.pending.pop()
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2"}
    pending.callback(Response(request.url, headers=headers, request=request))
    await settle()
    assert box
    assert not isinstance(box[0], Failure)
    now = clock.seconds()
    assert downloader.registry.get("a.example").manager.can_send(now) == pytest.approx(2.0)
    assert downloader.registry.get("cost").manager.can_send(now) == 0.0
    stats = downloader.crawler.stats.get_stats()
    assert stats.get("throttling/backoff/header_hints") == 1
    # Remaining 1 is no reason to wait.
    second = Request("https://b.example/1")
    outcome(downloader.fetch(second))
    await settle()
    (_, pending) = handler.pending.pop()
    headers = {"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "2"}
    pending.callback(Response(second.url, headers=headers, request=second))
    await settle()
    assert downloader.registry.get("b.example").manager.can_send(clock.seconds()) == 0.0
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_limit_below_one_request_never_stops_a_scope():
    """``X-RateLimit-Limit: 0.5`` would give every new window half a request to
    spend, so none would ever go: a limit under one is no limit."""
    downloader, clock = make_downloader()
    handler = handler_of(downloader)
    request = Request("https://a.example/1")
    outcome(downloader.fetch(request))
    await settle()
    (_, pending) = handler.pending.pop()
    headers = {"X-RateLimit-Limit": "0.5", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2"}
    pending.callback(Response(request.url, headers=headers, request=request))
    await settle()
    rest = [Request(f"https://a.example/{n}") for n in range(2, 5)]
    boxes = [outcome(downloader.fetch(r)) for r in rest]
    for _ in range(10):
        clock.advance(2.0)
        await settle()
        while handler.pending:
            handler.finish(handler.pending[0][0].url)
            await settle()
    assert all(box and not isinstance(box[0], Failure) for box in boxes)
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_429_in_flight_when_a_count_is_spent_takes_no_step():
    """Review: the budget's hold of a spent count did not start a step, so a 429
    to a request already in flight stepped the backoff (1 s) instead of counting
    as the same signal."""
    downloader, clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 3})
    handler = handler_of(downloader)
    first, second = Request("https://a.example/1"), Request("https://a.example/2")
    boxes = [outcome(downloader.fetch(first)), outcome(downloader.fetch(second))]
    await settle()
    clock.advance(0.1)
    pendings = {request.url: pending for request, pending in handler.pending}
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2"}
    pendings[first.url].callback(Response(first.url, headers=headers, request=first))
    await settle()
    pendings[second.url].callback(Response(second.url, status=429, request=second))
    await settle()
    stats = downloader.crawler.stats.get_stats()
    assert stats.get("throttling/backoff/steps") is None
    assert stats.get("throttling/backoff/deduplicated") == 1
    assert boxes[0]
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_longer_retry_after_on_a_spent_count_still_holds():
    """The budget keeps a spent count's hold from the earliest moment the window
    can end; a ``Retry-After`` asking for longer is a hold of its own."""
    downloader, clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 3})
    handler = handler_of(downloader)
    request = Request("https://a.example/1")
    box = outcome(downloader.fetch(request))
    await settle()
    (_, pending) = handler.pending.pop()
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2", "Retry-After": "7"}
    pending.callback(Response(request.url, headers=headers, request=request))
    await settle()
    assert box
    now = clock.seconds()
    assert downloader.registry.get("a.example").manager.can_send(now) == pytest.approx(7.0)
    downloader.close()


@pytest.mark.parametrize(
    ("url", "held"),
    [("https://a.example/1", {"a.example"}), ("https://10.0.0.1/1", {"10.0.0.1"})],
)
def test_a_spent_server_quota_leaves_the_ip_scope_of_a_host_name_alone(url, held):
    """Sites sharing an address keep quotas of their own: one site's spent quota
    holds its own scope, not the address's (unless the site is the address)."""
    downloader, _clock = make_downloader()
    request = Request(url)
    downloader._scope_ids[request] = {urlparse_cached(request).hostname: None, "10.0.0.1": None}
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2"}
    response = Response(request.url, headers=headers, request=request)
    for scope_id in downloader._scope_ids[request]:
        downloader.registry.get(scope_id)
    backoff = downloader.manager.get_response_backoff(response)
    assert {scope_id for scope_id, record in backoff.items() if record.delay} == held
    downloader.close()


@pytest.mark.parametrize(
    ("url", "triggered"),
    [("https://a.example/1", {"a.example"}), ("https://10.0.0.1/1", {"10.0.0.1"})],
)
@pytest.mark.parametrize("headers", [{}, {"Retry-After": "5"}])
def test_a_sites_response_does_not_back_off_the_ip_scope_of_its_host_name(url, triggered, headers):
    """Acceptance probe: one site's 503s backed off the address it shares with
    another site (CONCURRENT_REQUESTS_PER_IP), whose 40 pages went from 0.2 s to
    105 s. A response speaks for its site; a request to the address itself
    still backs the address off."""
    downloader, _clock = make_downloader()
    request = Request(url)
    downloader._scope_ids[request] = {urlparse_cached(request).hostname: None, "10.0.0.1": None}
    for scope_id in downloader._scope_ids[request]:
        downloader.registry.get(scope_id)
    response = Response(request.url, status=503, headers=headers, request=request)
    backoff = downloader.manager.get_response_backoff(response)
    assert {scope_id for scope_id, record in backoff.items() if record.trigger} == triggered
    assert {scope_id for scope_id, record in backoff.items() if record.delay} == (
        triggered if headers else set()
    )
    downloader.close()


def test_an_address_that_is_the_requests_first_scope_is_backed_off():
    """Review: an IP scope named by the throttling_scopes meta (or a manager
    grouping by address) got no backoff from responses once IP scopes of host
    names were exempt: it is what the request was grouped by."""
    downloader, _clock = make_downloader()
    request = Request("https://a.example/1", meta={"throttling_scopes": "10.0.0.1"})
    downloader._scope_ids[request] = {"10.0.0.1": None}
    downloader.registry.get("10.0.0.1")
    response = Response(request.url, status=503, request=request)
    backoff = downloader.manager.get_response_backoff(response)
    assert {scope_id for scope_id, record in backoff.items() if record.trigger} == {"10.0.0.1"}
    downloader.close()


def test_an_entry_keyed_host_and_port_names_that_ports_scope(caplog):
    """Default scopes are host names, but an entry keyed 'host:port' (as the spec's
    recipes name sites) gives that port's requests their own scope, without a warning."""
    with caplog.at_level("WARNING", logger="slotkit"):
        downloader, _ = make_downloader({"THROTTLING_SCOPES": {"127.0.0.1:8801": {"delay": 1.0}}})
    assert "127.0.0.1:8801" not in caplog.text
    assert downloader.get_slot_key(Request("http://127.0.0.1:8801/a")) == "127.0.0.1:8801"
    assert downloader.get_slot_key(Request("http://user:pw@127.0.0.1:8801/a")) == "127.0.0.1:8801"
    assert downloader.get_slot_key(Request("http://127.0.0.1:8802/a")) == "127.0.0.1"
    assert downloader.get_slot_key(Request("http://127.0.0.1/a")) == "127.0.0.1"
    assert downloader.scope_config("127.0.0.1:8801").delay == 1.0
    upper, _ = make_downloader({"THROTTLING_SCOPES": {"Example.com:8080": {"delay": 3.0}}})
    key = upper.get_slot_key(Request("http://example.com:8080/a"))
    assert key == "Example.com:8080"  # the entry's own key, so its settings apply
    assert upper.scope_config(key).delay == 3.0
    # A single-label host (a compose service) with a port: a review found the
    # entry never applied.
    service, _ = make_downloader({"THROTTLING_SCOPES": {"svc:8080": {"delay": 2.0}}})
    assert service.get_slot_key(Request("http://svc:8080/a")) == "svc:8080"
    assert service.get_slot_key(Request("http://svc:8081/a")) == "svc"


def test_schedulers_see_the_address_scope_of_a_request_with_meta_scopes():
    """known_scopes (what schedulers ask) adds the per-IP scope as the downloader does."""
    downloader, _ = make_downloader({"CONCURRENT_REQUESTS_PER_IP": 1})
    request = Request("http://127.0.0.1/", meta={"throttling_scopes": "api"})
    assert downloader.known_scopes(request) == {"api": None, "127.0.0.1": None}


class RawWaitHeaderManager(ThrottlingManager):
    """Returns a header's raw bytes from get_response_delay: a natural mistake."""

    def get_response_delay(self, response: Response) -> float | None:
        return response.headers.get("X-Wait", b"5")  # type: ignore[return-value]


class DuckWaitManager:
    """A manager of its own (no ThrottlingManager base) with the same mistake."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler

    def get_scopes(self, request: Request) -> str:
        return urlparse_cached(request).hostname or ""

    def get_response_delay(self, response: Response) -> Any:
        return b"5"


class ClassWaitManager(ThrottlingManager):
    @classmethod
    def get_response_delay(cls, response: Response) -> float | None:
        return b"5"  # type: ignore[return-value]


class HugeWaitManager(ThrottlingManager):
    def get_response_delay(self, response: Response) -> float | None:
        return 10**400  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("manager", "named"),
    [
        (RawWaitHeaderManager, "RawWaitHeaderManager"),
        (DuckWaitManager, "DuckWaitManager"),
        (HugeWaitManager, "HugeWaitManager"),
        (ClassWaitManager, "ClassWaitManager"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_an_unusable_get_response_delay_is_named(manager: type, named: str):
    """An override of get_response_delay returning bytes fails the request with
    an error naming the method and its class, as get_response_backoff's bad
    values do; an acceptance probe saw a bare TypeError from deep inside."""
    downloader, _clock = make_downloader({"THROTTLING_MANAGER": manager})
    request = Request("https://a.example/1")
    box = outcome(downloader.fetch(request))
    await settle()
    handler_of(downloader).finish(request.url, status=429)
    await settle()
    assert isinstance(box[0], Failure)
    assert box[0].check(ValueError)
    assert f"{named}.get_response_delay() must return None or a finite" in str(box[0].value)
    downloader.close()


class FractionWaitManager(ThrottlingManager):
    def get_response_delay(self, response: Response) -> float | None:
        from fractions import Fraction

        return Fraction(3, 2)  # type: ignore[return-value]


@pytest_twisted.ensureDeferred
async def test_any_real_number_from_get_response_delay_is_a_wait():
    """A Fraction (or Decimal, numpy float) is a number of seconds: it holds the scope."""
    downloader, clock = make_downloader({"THROTTLING_MANAGER": FractionWaitManager})
    handler = handler_of(downloader)
    first, second = Request("https://a.example/1"), Request("https://a.example/2")
    box = outcome(downloader.fetch(first))
    await settle()
    handler.finish(first.url, status=429)
    await settle()
    assert not isinstance(box[0], Failure)
    outcome(downloader.fetch(second))
    await settle()
    clock.advance(1.4)
    await settle()
    assert second.url not in handler.started
    clock.advance(0.2)
    await settle()
    assert second.url in handler.started
    handler.finish(second.url)
    await settle()
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_per_scope_bookkeeping_is_bounded_on_a_broad_crawl(monkeypatch):
    """What the downloader keeps per scope id does not grow with every scope
    seen: an acceptance probe saw the kind hints of 40,000 download_slot
    values kept while THROTTLING_SCOPE_LIMIT held the registry at 1,000."""
    monkeypatch.setattr("slotkit.downloader.KIND_HINTS_KEPT", 4)
    downloader, _clock = make_downloader(
        {"THROTTLING_SCOPE_LIMIT": 2, "THROTTLING_DEBUG": True, "DOWNLOAD_SLOTS": {"kept": {}}}
    )
    handler = handler_of(downloader)
    for n in range(10):
        request = Request(f"https://a.example/{n}", meta={"download_slot": f"slot{n}"})
        outcome(downloader.fetch(request))
        await settle()
        handler.finish(request.url)
        await settle()
    assert len(downloader.registry) <= 3
    assert len(downloader._kind_hints) <= 4
    assert set(downloader._recoveries_seen) <= set(downloader.registry)
    assert downloader.registry.get("kept").kind == DOMAIN  # a DOWNLOAD_SLOTS key, always
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_site_scope_made_again_without_a_request_stays_a_site():
    """A single-label host's scope evicted, then made again by delay_scope()
    (no request to say it is a site), keeps CONCURRENT_REQUESTS_PER_DOMAIN:
    dropping its kind hint with the scope made it a custom scope of 1."""
    downloader, _clock = make_downloader(
        {"THROTTLING_SCOPE_LIMIT": 2, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}
    )
    handler = handler_of(downloader)
    for url in (
        "https://vm/1",
        "https://b.example/1",
        "https://c.example/1",
        "https://d.example/1",
    ):
        request = Request(url)
        outcome(downloader.fetch(request))
        await settle()
        handler.finish(url)
        await settle()
    assert downloader.registry.peek("vm") is None  # evicted
    downloader.manager.delay_scope("vm", 5)
    scope = downloader.registry.peek("vm")
    assert scope is not None
    assert (scope.kind, downloader.slots["vm"].concurrency) == (DOMAIN, 8)
    downloader.close()


def test_throttling_debug_tells_rampups_steps_at_info(caplog):
    """THROTTLING_DEBUG (AUTOTHROTTLE_DEBUG's successor) says what rampup does,
    at INFO as AutoThrottle's debug lines were: an acceptance probe saw a delay
    go from 1 s to 0.03 s with no line of its own, and nothing at LOG_LEVEL=INFO.
    A pace change that is not rampup's (a Crawl-delay, a slots write) is not
    reported as one (a review)."""
    import logging

    downloader, _clock = make_downloader(
        {"THROTTLING_DEBUG": True, "THROTTLING_SCOPES": {"a.example": {"rampup": True}}}
    )
    scope = downloader.registry.get("a.example")
    manager = scope.manager
    with caplog.at_level(logging.INFO, logger="slotkit"):
        downloader._log_recoveries([scope])
        manager.delay = 7.0  # written through slots[...]: not a rampup step
        downloader._log_recoveries([scope])
        manager.rampup.steps += 1
        manager.concurrency += 1
        downloader._log_recoveries([scope])
    lines = [r for r in caplog.records if "rampup" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO]
    assert "scope 'a.example' rampup stepped up: concurrency 2, delay 7 s" in lines[0].getMessage()
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_single_label_hosts_kind_outlives_many_download_slot_values(monkeypatch):
    """Kind hints are kept only where they change a kind: a broad crawl's
    download_slot host names pushed a single-label host's hint out, and its
    scope, made again by delay_scope(), came back custom with concurrency 1."""
    monkeypatch.setattr("slotkit.downloader.KIND_HINTS_KEPT", 4)
    downloader, _clock = make_downloader(
        {"THROTTLING_SCOPE_LIMIT": 2, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}
    )
    handler = handler_of(downloader)
    urls = ["https://vm/1"] + [f"https://a.example/{n}" for n in range(6)]
    for n, url in enumerate(urls):
        meta = {"download_slot": f"h{n}.example"} if n else {}
        request = Request(url, meta=meta)
        outcome(downloader.fetch(request))
        await settle()
        handler.finish(url)
        await settle()
    assert downloader.registry.peek("vm") is None
    downloader.manager.delay_scope("vm", 5)
    assert downloader.registry.get("vm").kind == DOMAIN
    downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_netloc_scope_of_a_single_label_host_is_a_site():
    """``svc:8080``, the spec's netloc recipe for ``http://svc:8080/``, is the
    site's scope (CONCURRENT_REQUESTS_PER_DOMAIN), not a custom one of 1."""
    downloader, _clock = make_downloader({"CONCURRENT_REQUESTS_PER_DOMAIN": 4})
    handler = handler_of(downloader)
    request = Request("https://svc:8443/1", meta={"throttling_scopes": "svc:8443"})
    outcome(downloader.fetch(request))
    await settle()
    assert downloader.slots["svc:8443"].concurrency == 4
    handler.finish(request.url)
    await settle()
    downloader.close()
