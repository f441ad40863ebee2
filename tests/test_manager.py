"""Tests for slotkit.manager: a request's scopes, the helpers, building THROTTLING_MANAGER."""

from __future__ import annotations

import dataclasses
import inspect
from collections import deque
from collections.abc import Coroutine
from typing import Any

import pytest
import tldextract
from scrapy import Request, Spider
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.test import get_crawler
from zope.interface.verify import verifyObject

from slotkit.interfaces import IThrottlingManager
from slotkit.manager import (
    AUTO_SLOT,
    DOWNLOAD_SLOT,
    ScopeBackoff,
    ThrottlingManager,
    add_scope,
    build_manager,
    normalize_scopes,
    scope_cache,
    scope_kind,
    update_scope_backoff,
)
from slotkit.outcomes import as_backoff
from slotkit.settings import CUSTOM, DOMAIN, IP, SettingsError

HOLD = 30.0


@pytest.fixture
def crawler():
    return get_crawler(Spider)


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends, synchronously, and return its value."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the coroutine suspended; this helper only runs ready ones")


# ----------------------------------------------------------------- default get_scopes


@pytest.mark.parametrize(
    ("url", "scope"),
    [
        ("https://example.com/page", "example.com"),
        ("https://books.toscrape.com/", "books.toscrape.com"),
        ("https://quotes.toscrape.com/", "quotes.toscrape.com"),
        ("https://toscrape.com/", "toscrape.com"),
        ("http://Example.COM:8080/x", "example.com"),
        ("http://127.0.0.1:8000/", "127.0.0.1"),
        ("http://[::1]:8000/", "::1"),
    ],
)
def test_default_scope_is_the_host_name(crawler, url: str, scope: str):
    """By default a request's scope is its host name: each subdomain is separate, ports ignored."""
    assert ThrottlingManager(crawler).get_scopes(Request(url)) == scope


def test_subdomains_are_separate_scopes(crawler):
    """books.toscrape.com, quotes.toscrape.com and toscrape.com are three scopes."""
    manager = ThrottlingManager(crawler)
    urls = ["https://books.toscrape.com/", "https://quotes.toscrape.com/", "https://toscrape.com/"]
    assert len({manager.get_scopes(Request(url)) for url in urls}) == 3


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("api", id="str"),
        pytest.param({"api", "users"}, id="set"),
        pytest.param(["api", "users"], id="list"),
        pytest.param({"api": 1.0, "cost": 3.5}, id="dict"),
    ],
)
def test_throttling_scopes_meta_is_used_as_is(crawler, value: Any):
    """The throttling_scopes meta, in any accepted form, replaces the default scope."""
    request = Request("https://api.example/x", meta={"throttling_scopes": value})
    scopes = ThrottlingManager(crawler).get_scopes(request)
    assert normalize_scopes(scopes) == normalize_scopes(value)
    assert run(_awaited(scopes)) == scopes  # and an async override may await it


async def _awaited(value: Any) -> Any:
    return await value


@pytest.mark.parametrize(
    "empty",
    [set(), [], (), {}, {}.keys(), range(0), deque(), iter([])],
    ids=["set", "list", "tuple", "dict", "keys", "range", "deque", "iterator"],
)
def test_empty_throttling_scopes_meta_keeps_the_site_scope(crawler, empty: Any):
    """A scope list that came out empty must not send the request with no limit at all."""
    request = Request("https://a.example/x", meta={"throttling_scopes": empty})
    assert ThrottlingManager(crawler).get_scopes(request) == "a.example"


def test_a_throttling_scopes_iterator_is_read_once_and_kept(crawler):
    """A review: a generator in the meta was used up by its first reader (the
    priority queue), and the download then ran with no scope at all."""
    request = Request("https://a.example/x", meta={"throttling_scopes": (s for s in ["api"])})
    manager = ThrottlingManager(crawler)
    assert normalize_scopes(manager.get_scopes(request)) == {"api": None}
    assert normalize_scopes(manager.get_scopes(request)) == {"api": None}


def test_throttling_scopes_meta_wins_over_download_slot(crawler):
    """throttling_scopes takes precedence over a download_slot meta."""
    request = Request("https://a.example/", meta={"throttling_scopes": "api", DOWNLOAD_SLOT: "x"})
    assert ThrottlingManager(crawler).get_scopes(request) == "api"


def test_user_download_slot_meta_is_honoured(crawler):
    """A download_slot set by the user (Scrapy's way to name a slot) becomes the scope."""
    request = Request("https://a.example/", meta={DOWNLOAD_SLOT: "shared-slot"})
    assert ThrottlingManager(crawler).get_scopes(request) == "shared-slot"


def test_non_string_download_slot_is_stringified(crawler):
    """A download_slot that is not a string is turned into one."""
    request = Request("https://a.example/", meta={DOWNLOAD_SLOT: 7})
    assert ThrottlingManager(crawler).get_scopes(request) == "7"


def test_auto_written_download_slot_is_ignored(crawler):
    """A download_slot the downloader wrote itself (AUTO_SLOT) does not pin a redirect's scope."""
    original = Request("https://old.example/")
    original.meta[DOWNLOAD_SLOT] = original.meta[AUTO_SLOT] = "old.example"
    redirected = original.replace(url="https://new.example/")
    assert redirected.meta[DOWNLOAD_SLOT] == "old.example"
    assert ThrottlingManager(crawler).get_scopes(redirected) == "new.example"


def test_user_download_slot_survives_auto_slot_of_another_value(crawler):
    """A user slot that differs from the recorded automatic one is still honoured."""
    request = Request("https://a.example/", meta={DOWNLOAD_SLOT: "mine", AUTO_SLOT: "a.example"})
    assert ThrottlingManager(crawler).get_scopes(request) == "mine"


def test_url_without_host_gives_the_empty_scope(crawler):
    """A request without a host name (data: URLs) falls back to the empty scope id."""
    assert ThrottlingManager(crawler).get_scopes(Request("data:,hello")) == ""


# ----------------------------------------------------------------- scope_kind


@pytest.mark.parametrize(
    ("scope", "kind"),
    [
        ("1.2.3.4", IP),
        ("::1", IP),
        ("[2001:db8::1]", IP),
        ("example.com", DOMAIN),
        ("books.toscrape.com", DOMAIN),
        ("localhost", DOMAIN),
        ("example.com.", DOMAIN),
        ("api", CUSTOM),
        ("cost", CUSTOM),
        ("api.toscrape.com/fast-endpoint", DOMAIN),  # an endpoint of a site is a site
        ("127.0.0.1:8080/v1/search", DOMAIN),
        ("10.0.0.1/api", DOMAIN),
        ("api/v1", CUSTOM),
        ("/v1", CUSTOM),
        ("", DOMAIN),  # URLs without a host (data:, file:), as Scrapy's slot ""
        ("127.0.0.1:8080", DOMAIN),  # a netloc is a site, even with an address for a host
        ("example.com:8443", DOMAIN),
        ("localhost:6800", DOMAIN),
        ("[::1]:8080", DOMAIN),
        ("api:80", CUSTOM),
        ("example.com:http", CUSTOM),
    ],
)
def test_scope_kind(scope: str, kind: str):
    """IP addresses, host names and anything else are told apart by their id."""
    assert scope_kind(scope) == kind


# ----------------------------------------------------------------- normalize_scopes


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, {}),
        ("api", {"api": None}),
        (["b", "a", "c"], {"b": None, "a": None, "c": None}),
        (("a",), {"a": None}),
        ({"a"}, {"a": None}),
        (frozenset(), {}),
        ({"a": 1, "b": None, "c": 2.5}, {"a": 1.0, "b": None, "c": 2.5}),
        ((scope for scope in ["x", "y"]), {"x": None, "y": None}),
    ],
)
def test_normalize_scopes_forms(value: Any, expected: dict[str, float | None]):
    """Every accepted form becomes an ordered {scope id: amount or None} dict."""
    result = normalize_scopes(value)
    assert result == expected
    assert list(result) == list(expected)


def test_normalize_scopes_takes_a_set_sorted():
    """A set has no order (string hashes change per run): its ids come sorted,
    so the primary scope, the download_slot, is the same in every run."""
    ids = {f"scope-{n}" for n in range(20)}
    assert list(normalize_scopes(ids)) == sorted(ids)
    assert list(normalize_scopes(frozenset(ids))) == sorted(ids)


def test_normalize_scopes_amounts_are_floats():
    """Integer amounts are converted to floats."""
    assert isinstance(normalize_scopes({"a": 3})["a"], float)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ([1, 2], "non-string scope id 1"),
        ({1: 2.0}, "non-string scope id 1"),
        ({"a": "3"}, "gave scope 'a' the amount '3'"),
        ({"a": True}, "gave scope 'a' the amount True"),
        # A NaN, infinite or negative amount would switch a quota off while counted.
        ({"a": float("nan")}, "gave scope 'a' the amount nan"),
        ({"a": float("inf")}, "the amount inf; expected a finite number >= 0"),
        ({"a": -100}, "gave scope 'a' the amount -100"),
        (42, "(got 42)"),
        (3.5, "(got 3.5)"),
    ],
)
def test_normalize_scopes_errors_name_the_source(value: Any, fragment: str):
    """Bad values raise TypeError naming where they came from and what arrived."""
    with pytest.raises(TypeError) as info:
        normalize_scopes(value, where="MyManager.get_scopes()")
    message = str(info.value)
    assert message.startswith("MyManager.get_scopes()")
    assert fragment in message


# ----------------------------------------------------------------- add_scope


@pytest.mark.parametrize(
    ("scopes", "expected"),
    [
        (None, ["x"]),
        ("a", ["a", "x"]),
        (["a"], ["a", "x"]),
        (("a", "b"), ["a", "b", "x"]),
        ({"a"}, ["a", "x"]),
        ({"a": None}, ["a", "x"]),
        ({"a": 2.0}, {"a": 2.0, "x": None}),
        (["a", "x"], ["a", "x"]),
    ],
)
def test_add_scope_every_form(scopes: Any, expected: Any):
    """add_scope accepts every get_scopes form and returns a list, or a dict when amounts exist."""
    assert add_scope(scopes, "x") == expected


def test_add_scope_with_amount_returns_a_dict():
    """Adding a scope with a quota amount gives a dict, the others keeping None."""
    assert add_scope("api.example", "cost", 3.5) == {"api.example": None, "cost": 3.5}
    assert add_scope({"cost": 1.0}, "cost", 2) == {"cost": 2.0}


def test_add_scope_does_not_modify_its_input():
    """The scopes passed to add_scope are left untouched."""
    as_list = ["a"]
    as_dict = {"a": 1.0}
    as_set = {"a"}
    add_scope(as_list, "x")
    add_scope(as_dict, "x", 2.0)
    add_scope(as_set, "x")
    assert as_list == ["a"]
    assert as_dict == {"a": 1.0}
    assert as_set == {"a"}


def test_add_scope_result_is_a_valid_get_scopes_value():
    """What add_scope returns normalises again without error, first scope first."""
    result = add_scope(add_scope("a.example", "api"), "cost", 2.0)
    assert list(normalize_scopes(result)) == ["a.example", "api", "cost"]


# ----------------------------------------------------------------- scope_cache


class CountingManager(ThrottlingManager):
    calls = 0

    @scope_cache
    def get_scopes(self, request):
        type(self).calls += 1
        return add_scope(super().get_scopes(request), "counted")


class AsyncCountingManager(ThrottlingManager):
    calls = 0

    @scope_cache
    async def get_scopes(self, request):
        type(self).calls += 1
        return add_scope(super().get_scopes(request), "counted")


def test_scope_cache_sync_same_request_is_cached(crawler):
    """A sync get_scopes wrapped in scope_cache runs once per request object."""
    CountingManager.calls = 0
    manager = CountingManager(crawler)
    request = Request("https://a.example/")
    first = manager.get_scopes(request)
    assert manager.get_scopes(request) is first
    assert first == ["a.example", "counted"]
    assert CountingManager.calls == 1


def test_scope_cache_sync_new_request_object_is_recomputed(crawler):
    """An equal-looking but different request object (a retry, a redirect) is asked again."""
    CountingManager.calls = 0
    manager = CountingManager(crawler)
    request = Request("https://a.example/")
    manager.get_scopes(request)
    manager.get_scopes(request.replace(url="https://b.example/"))
    manager.get_scopes(Request("https://a.example/"))
    assert CountingManager.calls == 3


def test_scope_cache_async_stays_a_coroutine_function(crawler):
    """scope_cache on an async method keeps it a coroutine function, so callers await it."""
    assert inspect.iscoroutinefunction(AsyncCountingManager.get_scopes)
    assert inspect.iscoroutinefunction(AsyncCountingManager(crawler).get_scopes)


def test_scope_cache_async_same_request_is_cached(crawler):
    """An async get_scopes wrapped in scope_cache runs once per request object."""
    AsyncCountingManager.calls = 0
    manager = AsyncCountingManager(crawler)
    request = Request("https://a.example/")
    first = run(manager.get_scopes(request))
    second = run(manager.get_scopes(request))
    assert first == second == ["a.example", "counted"]
    assert AsyncCountingManager.calls == 1
    run(manager.get_scopes(Request("https://a.example/")))
    assert AsyncCountingManager.calls == 2


def test_scope_cache_does_not_keep_requests_alive(crawler):
    """The cache holds requests weakly: a finished request can be garbage collected."""
    import gc
    import weakref

    manager = CountingManager(crawler)
    request = Request("https://a.example/")
    manager.get_scopes(request)
    ref = weakref.ref(request)
    del request
    gc.collect()
    assert ref() is None


class SpecApiManager(ThrottlingManager):
    """The spec's 'web scraping API' recipe: also throttle the target URL's domain."""

    @scope_cache
    async def get_scopes(self, request):
        scopes = await super().get_scopes(request)
        if urlparse_cached(request).netloc != "api.toscrape.com":
            return scopes
        target = request.meta.get("target")
        return add_scope(scopes, target) if target else scopes


def test_spec_recipe_awaiting_super_get_scopes(crawler):
    """The spec's recipes `await super().get_scopes(request)`; the default manager allows it."""
    manager = SpecApiManager(crawler)
    request = Request("https://api.toscrape.com/?url=x", meta={"target": "example.com"})
    assert list(normalize_scopes(run(manager.get_scopes(request)))) == [
        "api.toscrape.com",
        "example.com",
    ]


# ----------------------------------------------------------------- update_scope_backoff


def test_update_scope_backoff_from_nothing():
    """Starting from None, a new dict with one record is returned."""
    result = update_scope_backoff(None, "cost", consumed=2.0)
    assert result == {"cost": ScopeBackoff(consumed=2.0)}


def test_update_scope_backoff_does_not_modify_its_input():
    """The input mapping and its records are left as they were."""
    original = {"a.example": ScopeBackoff(trigger=True, delay=HOLD)}
    snapshot = dict(original)
    result = update_scope_backoff(original, "a.example", delay=5.0)
    update_scope_backoff(original, "cost", consumed=1.0)
    assert original == snapshot
    assert result is not original
    assert result["a.example"] == ScopeBackoff(trigger=True, delay=5.0)
    assert "cost" not in result


@pytest.mark.parametrize(
    ("scope", "figures", "error"),
    [
        ("a", {"delay": -1.0}, ValueError),
        ("a", {"delay": float("nan")}, ValueError),
        ("a", {"remaining": -3.0}, ValueError),
        ("a", {"consumed": float("inf")}, ValueError),
        ("a", {"consumed": "2"}, ValueError),
        (5, {"delay": 1.0}, TypeError),
    ],
)
def test_update_scope_backoff_refuses_figures_no_server_means(scope, figures, error):
    """A probe: a negative delay or remaining, NaN and a non-str scope were taken
    silently (a remaining of -3 would spend more than the whole quota)."""
    with pytest.raises(error, match="update_scope_backoff"):
        update_scope_backoff(None, scope, **figures)


@pytest.mark.parametrize(("scope", "amount"), [("x", -1.0), ("x", float("nan")), (5, None)])
def test_add_scope_refuses_what_the_meta_key_refuses(scope, amount):
    with pytest.raises(TypeError, match="add_scope"):
        add_scope(["a"], scope, amount)


def test_update_scope_backoff_accumulates_consumed_and_keeps_others():
    """consumed adds to what the record already had; unspecified fields stay."""
    backoff = update_scope_backoff(None, "cost", consumed=2.0, remaining=10.0)
    backoff = update_scope_backoff(backoff, "cost", consumed=-0.5)
    backoff = update_scope_backoff(backoff, "other", trigger=True)
    assert backoff["cost"] == ScopeBackoff(consumed=1.5, remaining=10.0)
    assert backoff["other"] == ScopeBackoff(trigger=True)
    backoff = update_scope_backoff(backoff, "other", trigger=False)
    assert backoff["other"].trigger is False


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        (None, None),
        ("a", {"a": ScopeBackoff(trigger=True)}),
        (["a", "b"], {"a": ScopeBackoff(trigger=True), "b": ScopeBackoff(trigger=True)}),
        ({"a"}, {"a": ScopeBackoff(trigger=True)}),
        ({"a": None, "b": {}}, {"a": ScopeBackoff(trigger=True), "b": ScopeBackoff(trigger=True)}),
        ({"a": {"delay": 5.0}}, {"a": ScopeBackoff(trigger=True, delay=5.0)}),
        ({"cost": {"consumed": -1.5}}, {"cost": ScopeBackoff(consumed=-1.5)}),
        ({"api": {"quota": 0}}, {"api": ScopeBackoff(remaining=0)}),
        ({"api": {"remaining": 3, "trigger": True}}, {"api": ScopeBackoff(True, remaining=3)}),
        ({"api": {"remaining": None, "quota": 0}}, {"api": ScopeBackoff(remaining=0)}),
        ({"api": {"trigger": None}}, {"api": ScopeBackoff(trigger=True)}),
        (
            {"api": {"remaining": 0, "reset": 2.0, "limit": 10}},
            {"api": ScopeBackoff(remaining=0, reset=2.0, limit=10)},
        ),
        # Anything false says nothing (a review: ``status == 429 and {...}`` lost the page).
        (False, None),
        ("", None),
        ({}, None),
    ],
)
def test_as_backoff_reads_the_drafts_shapes(said, expected):
    """A manager written against the upstream draft (a scope id, a list of them,
    dict records) works: each shape becomes slotkit's records."""
    assert as_backoff(said, "get_response_backoff()") == expected


def test_as_backoff_passes_slotkits_own_shape_through():
    records = {"a": ScopeBackoff(trigger=True)}
    assert as_backoff(records, "get_response_backoff()") is records


@pytest.mark.parametrize(
    ("said", "error", "match"),
    [
        (5, TypeError, "returned 5; expected None, a scope id"),
        (b"a", TypeError, "returned b'a'"),
        ({1: None}, TypeError, "scope id must be a str"),
        (["a", 2], TypeError, "scope id must be a str"),
        ({"a": 1.0}, TypeError, "record of scope 'a' is 1.0"),
        ({"a": {"dealy": 1.0}}, TypeError, "unknown key 'dealy' \\(did you mean 'delay'\\?\\)"),
        ({"a": {"delay": -1.0}}, ValueError, "delay must be a finite number >= 0"),
        ({"a": {"trigger": "no"}}, TypeError, "trigger='no'; expected True or False"),
    ],
)
def test_as_backoff_names_the_method_and_the_accepted_shapes(said, error, match):
    """A probe: a custom get_response_backoff returning a str failed its request
    with "'str' object has no attribute 'items'"."""
    with pytest.raises(error, match="get_response_backoff\\(\\)") as caught:
        as_backoff(said, "get_response_backoff()")
    assert caught.match(match)


def test_update_scope_backoff_with_a_bare_scope_backs_it_off():
    """Given only a scope, the scope is added as a trigger (the draft's bare
    scope); a scope already named is left as it was."""
    assert update_scope_backoff(None, "x") == {"x": ScopeBackoff(trigger=True)}
    kept = update_scope_backoff({"x": ScopeBackoff(consumed=1.0)}, "x")
    assert kept == {"x": ScopeBackoff(consumed=1.0)}
    # A review: a figure read from a header that was missing (None) backed the scope off.
    assert update_scope_backoff(None, "x", consumed=None) == {"x": ScopeBackoff()}
    assert update_scope_backoff("a", "cost", consumed=2.0) == {
        "a": ScopeBackoff(trigger=True),
        "cost": ScopeBackoff(consumed=2.0),
    }


def test_scope_backoff_is_frozen():
    """ScopeBackoff records cannot be changed in place."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        ScopeBackoff().trigger = True  # type: ignore[misc]


# ----------------------------------------------------------------- the manager's other methods


def test_default_manager_provides_the_interface(crawler):
    """ThrottlingManager provides IThrottlingManager, crawler attribute included."""
    manager = ThrottlingManager(crawler)
    assert verifyObject(IThrottlingManager, manager)
    assert manager.crawler is crawler
    assert ThrottlingManager.from_crawler(crawler).crawler is crawler


def test_outcomes_say_nothing_without_a_downloader(crawler):
    """Detached from slotkit's downloader, responses and errors trigger nothing."""
    from scrapy.http import Response

    manager = ThrottlingManager(crawler)
    request = Request("https://a.example/")
    response = Response("https://a.example/", status=429, request=request)
    assert not manager.get_response_backoff(response)
    assert not manager.get_exception_backoff(request, TimeoutError())


def test_delay_scope_needs_the_downloader(crawler):
    """delay_scope without slotkit's downloader explains how to enable it."""
    with pytest.raises(RuntimeError, match=r"DOWNLOADER = 'slotkit\.Downloader'"):
        ThrottlingManager(crawler).delay_scope("a.example", HOLD)


def holding_manager(crawler) -> tuple[ThrottlingManager, list[tuple[str, float]]]:
    """A manager attached to a controller that records the holds it is asked for."""
    held: list[tuple[str, float]] = []

    class Controller:
        def hold_scope(self, scope: str, seconds: float) -> None:
            held.append((scope, seconds))

    manager = ThrottlingManager(crawler)
    manager.attach(Controller())  # type: ignore[arg-type]
    return manager, held


def test_delay_scope_forwards_to_the_controller(crawler):
    """delay_scope asks the attached downloader to hold the scope, as a float."""
    manager, held = holding_manager(crawler)
    manager.delay_scope("a.example", 30)
    assert held == [("a.example", 30.0)]
    assert isinstance(held[0][1], float)


@pytest.mark.parametrize(
    ("scope", "seconds", "error"),
    [
        (None, 1.0, TypeError),
        (b"a.example", 1.0, TypeError),
        ("a.example", -1, ValueError),
        ("a.example", float("nan"), ValueError),
        ("a.example", float("inf"), ValueError),
        ("a.example", "abc", TypeError),
        ("a.example", "3", TypeError),  # a docs probe: text was taken as seconds
        ("a.example", True, ValueError),
        ("", 1.0, ValueError),  # an acceptance probe: refused in throttling_scopes, not here
    ],
)
def test_delay_scope_refuses_bad_arguments_before_holding_anything(crawler, scope, seconds, error):
    """Acceptance probe: a negative or NaN hold did nothing yet counted as a trigger."""
    manager, held = holding_manager(crawler)
    with pytest.raises(error, match="delay_scope"):
        manager.delay_scope(scope, seconds)
    assert held == []


# ----------------------------------------------------------------- build_manager


class RegistrableDomainManager:
    """The spec's 'alternative domain throttling' example, offline: one duck-typed method."""

    _extract = tldextract.TLDExtract(cache_dir=None, suffix_list_urls=())

    def get_request_scopes(self, request):
        extracted = self._extract(request.url)
        if extracted.domain and extracted.suffix:
            return f"{extracted.domain}.{extracted.suffix}"
        return urlparse_cached(request).netloc


class OnlyGetScopes:
    def __init__(self, crawler):
        self.crawler = crawler

    def get_scopes(self, request):
        return "fixed"


class Complete:
    """A duck-typed manager with every method: used as is."""

    def __init__(self, crawler):
        self.crawler = crawler

    def get_scopes(self, request):
        return "complete"

    def get_response_backoff(self, response):
        return None

    def get_exception_backoff(self, request, exception):
        return None

    def delay_scope(self, scope, seconds):
        pass


class WithFromCrawler:
    built_by: str = ""

    @classmethod
    def from_crawler(cls, crawler):
        instance = cls()
        instance.built_by = "from_crawler"
        return instance

    def get_scopes(self, request):
        return "x"


class NoScopes:
    def get_response_backoff(self, response):
        return None


class Subclassed(ThrottlingManager):
    pass


def test_build_manager_default(crawler):
    """No THROTTLING_MANAGER gives the default manager."""
    assert type(build_manager(crawler, None)) is ThrottlingManager


def test_build_manager_subclass(crawler):
    """A ThrottlingManager subclass is built with the crawler."""
    manager = build_manager(crawler, Subclassed)
    assert type(manager) is Subclassed
    assert manager.crawler is crawler


def test_build_manager_adapts_the_spec_duck_typed_example(crawler):
    """A class with only get_request_scopes (the spec's example) is adapted into a full manager."""
    manager = build_manager(crawler, RegistrableDomainManager)
    assert verifyObject(IThrottlingManager, manager)
    assert manager.get_scopes(Request("https://books.toscrape.com/")) == "toscrape.com"
    assert manager.get_scopes(Request("https://quotes.toscrape.com/")) == "toscrape.com"
    assert manager.get_scopes(Request("http://localhost:8080/")) == "localhost:8080"
    assert not manager.get_response_backoff(object())
    assert manager.crawler is crawler


def test_build_manager_adapts_a_class_with_only_get_scopes(crawler):
    """A class with only get_scopes is adapted too, built with the crawler when it takes one."""
    manager = build_manager(crawler, OnlyGetScopes)
    assert verifyObject(IThrottlingManager, manager)
    assert manager.get_scopes(Request("https://a.example/")) == "fixed"
    assert manager.inner.crawler is crawler


def test_build_manager_keeps_a_complete_duck_typed_class(crawler):
    """A class that has every method is used as is, not wrapped."""
    manager = build_manager(crawler, Complete)
    assert type(manager) is Complete


def test_build_manager_uses_from_crawler(crawler):
    """A class with from_crawler is built through it."""
    manager = build_manager(crawler, WithFromCrawler)
    assert manager.get_scopes(Request("https://a.example/")) == "x"
    assert manager.inner.built_by == "from_crawler"


def test_build_manager_refuses_a_class_without_scopes(crawler):
    """A class with neither get_scopes nor get_request_scopes is refused, naming it."""
    with pytest.raises(SettingsError) as info:
        build_manager(crawler, NoScopes)
    message = str(info.value)
    assert message.startswith("THROTTLING_MANAGER")
    assert f"{NoScopes.__module__}.NoScopes" in message
    assert "IThrottlingManager" in message
    assert "get_scopes(request)" in message


class SpecUpstreamManager(ThrottlingManager):
    """The spec's 'upstream status' recipe shape: `await super().get_response_backoff(...)`."""

    async def get_response_backoff(self, response):
        return await super().get_response_backoff(response)


def test_spec_recipe_awaiting_super_get_response_backoff(crawler):
    """The spec's recipes `await super().get_response_backoff(response)`; it should not raise."""
    from scrapy.http import Response

    response = Response("https://a.example/", request=Request("https://a.example/"))
    assert not run(SpecUpstreamManager(crawler).get_response_backoff(response))
