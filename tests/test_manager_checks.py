"""How THROTTLING_MANAGER and scope manager classes are accepted, completed or refused.

* A duck-typed THROTTLING_MANAGER (or one that declares IThrottlingManager
  but defines only part of it) keeps every method it defines; the default
  manager supplies the rest.
* Methods slotkit calls must accept the arguments it passes: a mismatch is a
  SettingsError when the crawler starts, not a TypeError on every request.
* Errors about a completed class name the user's class, not the adapter.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock
from zope.interface import implementer
from zope.interface.verify import verifyObject

from slotkit import Downloader, ScopeBackoff, ThrottlingManager, ThrottlingScopeManager
from slotkit.interfaces import IThrottlingManager
from slotkit.manager import build_manager
from slotkit.scope_managers import check_scope_manager_class
from slotkit.settings import SettingsError
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite, fail_first

HOST = "127.0.0.1"
SOFT_BAN = "X-Soft-Ban"
HOLD = 1.0
EPSILON = 1e-3  # float rounding of reactor times; gaps are measured at dispatch


@pytest.fixture
def crawler() -> Any:
    return get_crawler(Spider)


def host_of(request: Request) -> str:
    return urlparse_cached(request).hostname or ""


# --------------------------------------------------------------------- duck-typed managers


class DuckWithBackoff:
    """get_scopes and get_response_backoff, nothing else: a held host on a soft-ban header."""

    def get_scopes(self, request: Request) -> str:
        return host_of(request)

    def get_response_backoff(self, response: Response) -> dict[str, ScopeBackoff] | None:
        if response.headers.get(SOFT_BAN):
            return {urlparse_cached(response).hostname or "": ScopeBackoff(delay=HOLD)}
        return None


class DuckWithDelay:
    """get_scopes and get_response_delay: the default backoff reads the wait from this."""

    def get_scopes(self, request: Request) -> str:
        return host_of(request)

    def get_response_delay(self, response: Response) -> float | None:
        value = response.headers.get("X-Wait")
        return float(value) if value else None


class DuckEverythingElse:
    """Every optional method, some async; tells which of them ran."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.calls: list[str] = []

    async def get_request_scopes(self, request: Request) -> str:
        return "async-scope"

    async def get_exception_backoff(self, request: Request, exception: BaseException) -> None:
        self.calls.append("get_exception_backoff")

    def delay_scope(self, scope: str, seconds: float) -> None:
        self.calls.append(f"delay_scope {scope} {seconds}")

    def attach(self, controller: Any) -> None:
        self.calls.append("attach")

    def custom_helper(self) -> str:
        return "mine"


@implementer(IThrottlingManager)
class ClaimsButPartial:
    """Declares the interface, defines only get_scopes."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler

    def get_scopes(self, request: Request) -> str:
        return host_of(request)


class ReturnsGarbage:
    def get_scopes(self, request: Request) -> int:
        return 42


def test_duck_get_response_backoff_is_used(crawler: Any) -> None:
    """The duck's own get_response_backoff answers; get_exception_backoff is the default's."""
    manager = build_manager(crawler, DuckWithBackoff)
    response = Response(f"http://{HOST}/", headers={SOFT_BAN: "1"})
    assert manager.get_response_backoff(response) == {HOST: ScopeBackoff(delay=HOLD)}
    assert not manager.get_exception_backoff(Request(f"http://{HOST}/"), ValueError())
    assert isinstance(manager.inner, DuckWithBackoff)
    assert verifyObject(IThrottlingManager, manager)


def test_duck_get_response_delay_feeds_the_default_backoff(crawler: Any) -> None:
    """The default get_response_backoff asks self.get_response_delay: the duck's answers."""
    manager = build_manager(crawler, DuckWithDelay)
    assert manager.get_response_delay(Response("http://a.example/", headers={"X-Wait": "3"})) == 3
    assert manager.get_response_delay.__self__ is manager.inner


def test_duck_async_and_optional_methods_are_forwarded(crawler: Any) -> None:
    """get_request_scopes (async), get_exception_backoff, delay_scope, attach and extras."""
    manager = build_manager(crawler, DuckEverythingElse)
    inner = manager.inner
    assert inspect.iscoroutinefunction(manager.get_scopes)  # the downloader awaits it
    assert manager.get_exception_backoff.__self__ is inner
    manager.delay_scope("api", 2.0)
    manager.attach(object())
    assert inner.calls == ["delay_scope api 2.0", "attach"]
    assert manager.custom_helper() == "mine"
    assert inner.crawler is crawler


def test_claiming_the_interface_without_its_methods_is_completed(crawler: Any) -> None:
    """@implementer(IThrottlingManager) with only get_scopes gets the default's other methods."""
    manager = build_manager(crawler, ClaimsButPartial)
    assert isinstance(manager, ThrottlingManager)
    assert manager.get_scopes(Request("http://b.example/")) == "b.example"
    assert not manager.get_response_backoff(Response("http://b.example/"))
    assert verifyObject(IThrottlingManager, manager)


def test_completed_manager_is_named_after_the_users_class(crawler: Any) -> None:
    """Errors built from type(manager).__name__ name the user's class."""
    manager = build_manager(crawler, ReturnsGarbage)
    assert type(manager).__name__ == "ReturnsGarbage"
    assert type(manager).__qualname__ == ReturnsGarbage.__qualname__


def test_a_completed_manager_is_an_instance_of_the_users_class() -> None:
    """An acceptance probe: isinstance(crawler.throttler, TheUsersClass) was False
    for a class that left some methods to slotkit's defaults."""
    crawler = get_crawler(
        Spider, {"THROTTLING_MANAGER": ReturnsGarbage, "TELNETCONSOLE_ENABLED": False}
    )
    Downloader(crawler, clock=Clock())
    assert isinstance(crawler.throttler, ReturnsGarbage)
    assert isinstance(crawler.throttler, ThrottlingManager)  # the defaults it runs on


def test_garbage_from_get_scopes_names_the_users_class() -> None:
    """The downloader's TypeError for a bad get_scopes result names the user's class."""
    crawler = get_crawler(
        Spider, {"THROTTLING_MANAGER": ReturnsGarbage, "TELNETCONSOLE_ENABLED": False}
    )
    downloader = Downloader(crawler, clock=Clock())
    request = Request("http://c.example/")
    with pytest.raises(TypeError, match=r"^ReturnsGarbage\.get_scopes\(\)"):
        downloader._normalized_scopes(request, downloader.manager.get_scopes(request))


# --------------------------------------------------------------- THROTTLING_MANAGER signatures


class ScopesWithoutRequest:
    def get_scopes(self) -> str:
        return "x"


class BackoffNeedsSpider:
    def get_scopes(self, request: Request) -> str:
        return "x"

    def get_response_backoff(self, response: Response, spider: Spider) -> None:
        return None


class ExceptionBackoffOneArgument:
    def get_scopes(self, request: Request) -> str:
        return "x"

    def get_exception_backoff(self, request: Request) -> None:
        return None


class DelayScopeOneArgument:
    def get_scopes(self, request: Request) -> str:
        return "x"

    def delay_scope(self, scope: str) -> None:
        pass


class DelayWithoutResponse(ThrottlingManager):
    def get_response_delay(self) -> float:  # type: ignore[override]
        return 1.0


class SubclassScopesWithoutRequest(ThrottlingManager):
    def get_scopes(self) -> str:  # type: ignore[override]
        return "x"


class RequestScopesWithoutRequest:
    def get_request_scopes(self) -> str:
        return "x"


class AttachWithoutController:
    def get_scopes(self, request: Request) -> str:
        return "x"

    def attach(self) -> None:
        pass


@pytest.mark.parametrize(
    ("cls", "found", "call"),
    [
        (ScopesWithoutRequest, "get_scopes(self)", "get_scopes(request)"),
        (
            BackoffNeedsSpider,
            "get_response_backoff(self, response: 'Response', spider: 'Spider')",
            "get_response_backoff(response)",
        ),
        (
            ExceptionBackoffOneArgument,
            "get_exception_backoff(self, request: 'Request')",
            "get_exception_backoff(request, exception)",
        ),
        (DelayScopeOneArgument, "delay_scope(self, scope: 'str')", "delay_scope(scope, seconds)"),
        (DelayWithoutResponse, "get_response_delay(self)", "get_response_delay(response)"),
        (SubclassScopesWithoutRequest, "get_scopes(self)", "get_scopes(request)"),
        (RequestScopesWithoutRequest, "get_request_scopes(self)", "get_request_scopes(request)"),
        (AttachWithoutController, "attach(self)", "attach(controller)"),
    ],
)
def test_manager_method_with_a_wrong_signature_is_refused(
    crawler: Any, cls: type, found: str, call: str
) -> None:
    """The error names the setting, the class, the signature found and slotkit's call."""
    with pytest.raises(SettingsError) as info:
        build_manager(crawler, cls)
    message = str(info.value)
    assert message.startswith(f"THROTTLING_MANAGER names {cls.__module__}.{cls.__qualname__}")
    assert found in message
    assert f"the call slotkit makes, {call}" in message


class FromCrawlerWithoutCrawler:
    @classmethod
    def from_crawler(cls) -> FromCrawlerWithoutCrawler:
        return cls()

    def get_scopes(self, request: Request) -> str:
        return "x"


class InitNeedsMore:
    def __init__(self, crawler: Any, extra: Any) -> None:
        pass

    def get_scopes(self, request: Request) -> str:
        return "x"


def test_manager_from_crawler_must_take_the_crawler(crawler: Any) -> None:
    with pytest.raises(
        SettingsError, match=r"from_crawler\(cls\) cannot take .*from_crawler\(crawler\)"
    ):
        build_manager(crawler, FromCrawlerWithoutCrawler)


def test_manager_constructor_must_take_the_crawler_or_nothing(crawler: Any) -> None:
    with pytest.raises(SettingsError, match=r"InitNeedsMore\(crawler: 'Any', extra: 'Any'\)"):
        build_manager(crawler, InitNeedsMore)


class Flexible:
    """Signatures that accept slotkit's calls in other ways than the interface spells them."""

    def __init__(self) -> None:  # no crawler: built with cls()
        pass

    def get_scopes(self, *args: Any) -> str:
        return "x"

    def get_response_backoff(self, response: Response, spider: Spider | None = None) -> None:
        return None

    @staticmethod
    def get_exception_backoff(request: Request, exception: BaseException, **extra: Any) -> None:
        return None

    @classmethod
    def delay_scope(cls, scope: str, seconds: float, *, reason: str = "") -> None:
        pass


def test_manager_signatures_that_bind_are_accepted(crawler: Any) -> None:
    """*args, defaults, **kwargs, optional keyword-only, static and class methods all pass."""
    manager = build_manager(crawler, Flexible)
    assert type(manager) is Flexible  # it has every method: used as is


# ------------------------------------------------------------------- scope manager signatures


class GoodScopeManager:
    """The interface's signatures; without from_crawler it is built with cls(crawler, config)."""

    def __init__(self, crawler: Any, config: Any) -> None:
        self.config = config

    def can_send(self, now: float, amount: float | None) -> float:
        return 0.0

    def record_sent(self, now: float, amount: float | None) -> None:
        pass

    def record_done(self, now: float) -> None:
        pass

    def record_backoff(self, delay: float | None, now: float) -> None:
        pass

    def reconcile_quota(self, consumed: float | None, remaining: float | None, now: float) -> None:
        pass

    def set_base_delay(self, delay: float) -> None:
        pass

    def set_concurrency(self, concurrency: int) -> None:
        pass

    def is_idle(self, now: float, max_idle: float) -> bool:
        return True


class ScrapyStyleFromCrawler(GoodScopeManager):
    @classmethod
    def from_crawler(cls, crawler: Any) -> ScrapyStyleFromCrawler:
        return cls(crawler, {})


class CanSendWithoutArguments(GoodScopeManager):
    def can_send(self) -> float:  # type: ignore[override]
        return 0.0


class InitWithoutConfig(GoodScopeManager):
    def __init__(self, crawler: Any) -> None:  # type: ignore[override]
        pass


class StaticWithSelf(GoodScopeManager):
    @staticmethod
    def record_done(self: Any, now: float) -> None:  # type: ignore[override]
        pass


class RequiredKeywordOnly(GoodScopeManager):
    def is_idle(self, now: float, *, max_idle: float) -> bool:  # type: ignore[override]
        return True


class ImportStateOneArgument(GoodScopeManager):
    def import_state(self, state: dict[str, float]) -> None:
        pass


@pytest.mark.parametrize(
    ("cls", "found", "call"),
    [
        (
            ScrapyStyleFromCrawler,
            "from_crawler(cls, crawler: 'Any')",
            "from_crawler(crawler, config)",
        ),
        (CanSendWithoutArguments, "can_send(self)", "can_send(now, amount)"),
        (
            InitWithoutConfig,
            "constructor InitWithoutConfig(crawler: 'Any')",
            "InitWithoutConfig(crawler, config)",
        ),
        (StaticWithSelf, "record_done(self: 'Any', now: 'float')", "record_done(now)"),
        (
            RequiredKeywordOnly,
            "is_idle(self, now: 'float', *, max_idle: 'float')",
            "is_idle(now, max_idle)",
        ),
        (
            ImportStateOneArgument,
            "import_state(self, state: 'dict[str, float]')",
            "import_state(state, now)",
        ),
    ],
)
def test_scope_manager_with_a_wrong_signature_is_refused(cls: type, found: str, call: str) -> None:
    """The error names the setting, the class, the signature found and slotkit's call."""
    with pytest.raises(SettingsError) as info:
        check_scope_manager_class("THROTTLING_SCOPE_MANAGER", cls)
    message = str(info.value)
    assert message.startswith(f"THROTTLING_SCOPE_MANAGER names {cls.__module__}.{cls.__qualname__}")
    assert found in message
    assert f"the call slotkit makes, {call}" in message


class FlexibleScopeManager(GoodScopeManager):
    @classmethod
    def from_crawler(cls, crawler: Any, config: Any = None, **extra: Any) -> FlexibleScopeManager:
        return cls(crawler, config)

    def can_send(self, *args: Any) -> float:
        return 0.0

    @staticmethod
    def record_done(now: float) -> None:
        pass

    @classmethod
    def set_concurrency(cls, concurrency: int, *, strict: bool = False) -> None:
        pass


class DefaultSubclass(ThrottlingScopeManager):
    pass


@pytest.mark.parametrize(
    "cls", [GoodScopeManager, FlexibleScopeManager, ThrottlingScopeManager, DefaultSubclass]
)
def test_scope_manager_signatures_that_bind_are_accepted(cls: type) -> None:
    check_scope_manager_class("THROTTLING_SCOPE_MANAGER", cls)


def test_scope_entry_manager_error_names_its_setting() -> None:
    """A THROTTLING_SCOPES entry's manager is checked when the downloader is built."""
    crawler = get_crawler(
        Spider,
        {
            "THROTTLING_SCOPES": {"api": {"manager": CanSendWithoutArguments}},
            "TELNETCONSOLE_ENABLED": False,
        },
    )
    with pytest.raises(SettingsError) as info:
        Downloader(crawler, clock=Clock())
    message = str(info.value)
    assert message.startswith("THROTTLING_SCOPES['api']['manager'] names ")
    assert "can_send(self)" in message


# ------------------------------------------------------------------------------- real crawls

SLOTKIT: dict[str, Any] = {
    "DOWNLOADER": "slotkit.Downloader",
    "DOWNLOAD_DELAY_JITTER": 0,
    "BACKOFF_JITTER": 0,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
}


def pages(site: MockSite, count: int) -> list[str]:
    return [site.url(HOST, f"/page/{i}") for i in range(count)]


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_crawl_honours_a_duck_managers_response_backoff(mock_site: MockSite) -> None:
    """A soft-ban header on a 200 holds the host for HOLD seconds, as the duck's method says."""
    mock_site.set_behaviour(HOST, fail_first(1, 200, {SOFT_BAN: "1"}))
    settings = {**SLOTKIT, "THROTTLING_MANAGER": DuckWithBackoff}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, 2))
    assert result.statuses == {200: 2}
    result.assert_no_unhandled_errors()
    assert result.stats["throttling/backoff/header_hints"] == 1
    assert result.dispatch_gaps(HOST)[0] >= HOLD - EPSILON


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_crawl_honours_a_duck_managers_response_delay(mock_site: MockSite) -> None:
    """The duck's get_response_delay (a custom header) sets the wait after a 429."""
    mock_site.set_behaviour(HOST, fail_first(1, 429, {"X-Wait": str(HOLD)}))
    settings = {**SLOTKIT, "THROTTLING_MANAGER": DuckWithDelay, "BACKOFF_MIN_DELAY": 0.05}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, 1))
    assert result.statuses == {200: 1}
    assert len(result.dispatch_gaps(HOST)) == 1
    assert result.dispatch_gaps(HOST)[0] >= HOLD - EPSILON


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_crawl_with_a_manager_claiming_the_interface_partially(
    mock_site: MockSite,
) -> None:
    """The 'claims but partial' class crawls normally instead of failing every request."""
    settings = {**SLOTKIT, "THROTTLING_MANAGER": ClaimsButPartial}
    result = await run_crawl(ListSpider, settings, urls=pages(mock_site, 3))
    assert result.statuses == {200: 3}
    assert not result.errors
    result.assert_no_unhandled_errors()


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_crawl_refuses_a_scrapy_style_scope_manager_at_start(mock_site: MockSite) -> None:
    """from_crawler(cls, crawler) stops the crawl before any request reaches the site."""
    settings = {**SLOTKIT, "THROTTLING_SCOPE_MANAGER": ScrapyStyleFromCrawler}
    with pytest.raises(SettingsError, match=r"from_crawler\(crawler, config\)"):
        await run_crawl(ListSpider, settings, urls=pages(mock_site, 2))
    assert mock_site.recorder.count() == 0
