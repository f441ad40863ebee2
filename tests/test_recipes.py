"""Every recipe under docs/recipes/ runs here, exactly as the docs show it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request
from scrapy.utils.test import get_crawler
from zope.interface.verify import verifyObject

from slotkit.interfaces import IThrottlingScopeManager
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite, Reply, fail_first

RECIPES = Path(__file__).resolve().parent.parent / "docs" / "recipes"
SLOTKIT: dict[str, Any] = {"DOWNLOADER": "slotkit.Downloader", "DOWNLOAD_DELAY_JITTER": 0}
API = "api.toscrape.com"


def recipe(name: str) -> ModuleType:
    """Import docs/recipes/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_recipe_file_is_tested() -> None:
    """A recipe added to the docs without a test here fails this test."""
    tested = {
        "fixed_window",
        "endpoints",
        "scraping_api",
        "cost_cap",
        "registrable_domain",
        "ip_scopes",
        "maintenance",
    }
    assert {path.stem for path in RECIPES.glob("*.py")} == tested


def test_fixed_window_manager_provides_the_interface() -> None:
    """The docs' custom scope manager passes verifyObject."""
    manager_cls = recipe("fixed_window").FixedWindowScopeManager
    manager = manager_cls.from_crawler(get_crawler(), {"quota": 3.0})
    assert verifyObject(IThrottlingScopeManager, manager)


@pytest.mark.integration
@pytest.mark.parametrize("how", ["THROTTLING_SCOPE_MANAGER", "manager key"])
@pytest_twisted.ensureDeferred
async def test_fixed_window_manager_drives_a_crawl(mock_site: MockSite, how: str) -> None:
    """3 requests per 0.5 s window, whether set globally or for one scope."""
    manager = recipe("fixed_window").FixedWindowScopeManager
    scope: dict[str, Any] = {"quota": 3, "window": 0.5, "concurrency": 8}
    settings = {**SLOTKIT, "THROTTLING_SCOPES": {"127.0.0.1": scope}}
    if how == "manager key":
        scope["manager"] = manager
    else:
        settings["THROTTLING_SCOPE_MANAGER"] = manager
    urls = [mock_site.url("127.0.0.1", f"/page/{i}") for i in range(6)]
    before = mock_site.reactor.seconds()
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 6
    arrivals = mock_site.recorder.arrivals("127.0.0.1")
    # The window opens no earlier than the crawl starts, and the 4th request
    # waits for the next one. Measuring from the first arrival instead was
    # flaky: that request also sets up a connection, which a busy machine
    # can stretch past 0.1 s.
    assert arrivals[3] - before >= 0.5


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_endpoints_get_their_own_scopes(mock_site: MockSite) -> None:
    """Each API endpoint is its own scope; other hosts keep the host scope."""
    module = recipe("endpoints")
    urls = [
        f"http://{API}:{mock_site.port}/fast-endpoint",
        f"http://{API}:{mock_site.port}/slow-endpoint",
        mock_site.url("127.0.0.2", "/page/1"),
    ]
    settings = {**SLOTKIT, **module.SETTINGS}
    settings["THROTTLING_SCOPES"] = {
        f"{API}/slow-endpoint": {"delay": 0.1},
    }
    result = await run_crawl(ListSpider, settings, urls=urls, resolve={API: "127.0.0.1"})
    slots = sorted(r.download_slot for r in result.responses)
    assert slots == ["127.0.0.2", f"{API}/fast-endpoint", f"{API}/slow-endpoint"]


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_scraping_api_adds_the_target_scope_and_reads_upstream_status(
    mock_site: MockSite,
) -> None:
    """The target site gets a scope too, and an upstream 429 behind a 200 backs off."""
    module = recipe("scraping_api")
    mock_site.set_behaviour(
        "api.toscrape.com", fail_first(1, 200, {"X-Upstream-Status-Code": "429"})
    )
    url = f"http://{API}:{mock_site.port}/?url=https://example.com/a"
    seen: list[list[str]] = []

    def hook(crawler: Any) -> None:
        def reached(request: Request, spider: Any) -> None:
            seen.append(crawler.engine.downloader.scope_ids(request))

        from scrapy import signals

        crawler.signals.connect(reached, signal=signals.response_downloaded)
        handlers.append(reached)  # signal receivers are weak references

    handlers: list[Any] = []

    settings = {**SLOTKIT, **module.SETTINGS, "BACKOFF_MIN_DELAY": 0.05}
    result = await run_crawl(
        ListSpider, settings, urls=[url], resolve={API: "127.0.0.1"}, on_crawler=hook
    )
    assert seen[0] == [API, "example.com"]
    assert result.stats["throttling/backoff/steps"] == 1


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_cost_cap_spends_the_quota_per_window(mock_site: MockSite) -> None:
    """Rendering requests cost 5: with a quota of 10 per 0.5 s, two go per window."""
    module = recipe("cost_cap")

    def cost(request: Any, n: int) -> Reply:
        return Reply(200, {"X-Actual-Cost": "5"}, b"ok")

    mock_site.set_behaviour(API, cost)
    urls = [f"http://{API}:{mock_site.port}/p{i}?render=1" for i in range(4)]
    settings = {
        **SLOTKIT,
        **module.SETTINGS,
        "THROTTLING_SCOPES": {"cost": {"quota": 10.0, "window": 0.5, "concurrency": 8}},
    }
    before = mock_site.reactor.seconds()
    result = await run_crawl(ListSpider, settings, urls=urls, resolve={API: "127.0.0.1"})
    assert len(result.responses) == 4
    arrivals = mock_site.recorder.arrivals(API)
    assert arrivals[2] - before >= 0.5  # from the crawl's start: see the fixed-window test


def test_registrable_domain_grouping() -> None:
    """Subdomains share their registrable domain's scope; IPs and single labels stay per host."""
    module = recipe("registrable_domain")
    flat = module.RegistrableDomainManager()
    nested = module.NestedDomainManager()
    assert flat.get_scopes(Request("https://books.toscrape.com/")) == "toscrape.com"
    assert flat.get_scopes(Request("http://127.0.0.1:8000/")) == "127.0.0.1"
    assert flat.get_scopes(Request("http://localhost/")) == "localhost"
    assert nested.get_scopes(Request("https://a.books.toscrape.com/")) == [
        "toscrape.com",
        "books.toscrape.com",
        "a.books.toscrape.com",
    ]


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_nested_scopes_share_the_parent_limit(mock_site: MockSite) -> None:
    """Two subdomains with their own limits never exceed the parent's together."""
    module = recipe("registrable_domain")
    hosts = {"books.toscrape.com": "127.0.0.1", "quotes.toscrape.com": "127.0.0.2"}
    urls = [
        f"http://{host}:{mock_site.port}/page/{i}?delay=0.2" for i in range(4) for host in hosts
    ]
    settings = {
        **SLOTKIT,
        "THROTTLING_MANAGER": module.NestedDomainManager,
        "THROTTLING_SCOPES": {
            "toscrape.com": {"concurrency": 3},
            "books.toscrape.com": {"concurrency": 2},
            "quotes.toscrape.com": {"concurrency": 2},
        },
    }
    result = await run_crawl(ListSpider, settings, urls=urls, resolve=hosts)
    assert len(result.responses) == 8
    assert mock_site.recorder.max_concurrency() == 3


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_ip_scopes_manager_shares_the_address_limit(mock_site: MockSite) -> None:
    """localhost and 127.0.0.1 resolve to one address: together at most 2 in flight."""
    module = recipe("ip_scopes")
    urls = [
        f"http://{host}:{mock_site.port}/page/{i}?delay=0.2"
        for i in range(3)
        for host in ("localhost", "127.0.0.1")
    ]
    settings = {**SLOTKIT, **module.SETTINGS, "CONCURRENT_REQUESTS_PER_DOMAIN": 4}
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 6
    assert mock_site.recorder.max_concurrency() == 2


def test_fixed_window_manager_without_a_quota_does_not_limit() -> None:
    """A scope with no "quota" (every other site, under THROTTLING_SCOPE_MANAGER) is
    not quota-limited, instead of failing each request with KeyError('quota')."""
    manager_cls = recipe("fixed_window").FixedWindowScopeManager
    manager = manager_cls.from_crawler(get_crawler(), {"window": 1.0})
    assert verifyObject(IThrottlingScopeManager, manager)
    for _ in range(1000):
        assert manager.can_send(0.0, None) == 0.0
        manager.record_sent(0.0, None)
    manager.reconcile_quota(None, 0.0, 0.0)
    assert manager.can_send(0.0, 5.0) == 0.0
    for _ in range(1000):
        manager.record_done(0.5)
    assert manager.is_idle(1.0, 0.0)


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_fixed_window_manager_for_every_scope_leaves_others_unlimited(
    mock_site: MockSite,
) -> None:
    """THROTTLING_SCOPE_MANAGER = the recipe: the quota scope waits for its next window,
    a site without a quota is crawled at once."""
    manager = recipe("fixed_window").FixedWindowScopeManager
    settings = {
        **SLOTKIT,
        "THROTTLING_SCOPE_MANAGER": manager,
        "THROTTLING_SCOPES": {"127.0.0.1": {"quota": 2, "window": 0.5}},
    }
    urls = [
        mock_site.url(host, f"/page/{i}") for host in ("127.0.0.1", "127.0.0.2") for i in range(3)
    ]
    result = await run_crawl(ListSpider, settings, urls=urls)
    assert len(result.responses) == 6
    assert not result.errors
    # Measured where the downloader let the requests go, from the first one
    # (which opened the window), not from before the crawler started.
    quota = result.dispatch_times("127.0.0.1")
    assert quota[2] - quota[0] >= 0.5 - 1e-3
    # At once: all of the other site's pages went while the quota scope waited.
    assert result.dispatch_times("127.0.0.2")[-1] < quota[2]


@pytest.mark.integration
@pytest.mark.parametrize("grouping", ["host", "registrable_domain"])
@pytest_twisted.ensureDeferred
async def test_maintenance_page_holds_the_whole_site(mock_site: MockSite, grouping: str) -> None:
    """The page says 'under maintenance': the site's scope is held, however sites
    are grouped, and the page is fetched again once the pause ends."""
    module = recipe("maintenance")

    class Spider(module.MaintenanceAwareSpider, ListSpider):  # type: ignore[misc,name-defined]
        maintenance_pause = 0.5

        def parse_page(self, response: Any) -> Any:
            return ListSpider.parse(self, response)

    def maintenance_first(request: Any, n: int) -> Reply | None:
        return Reply(200, {}, b"<p>under maintenance</p>") if n == 0 else None

    mock_site.set_behaviour("books.toscrape.com", maintenance_first)
    url = f"http://books.toscrape.com:{mock_site.port}/page/0"
    settings = {**SLOTKIT, "THROTTLING_DOMAIN_GROUPING": grouping}
    result = await run_crawl(
        Spider, settings, urls=[url], resolve={"books.toscrape.com": "127.0.0.1"}
    )
    assert [r.url for r in result.responses] == [url]  # the page, fetched again
    first, again = mock_site.recorder.arrivals("books.toscrape.com")
    assert again - first >= 0.5
