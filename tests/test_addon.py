"""Tests for slotkit.addon: ADDONS = {"slotkit.Addon": 0} enables slotkit."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import pytest_twisted
from scrapy.core.downloader import Downloader as StockDownloader
from scrapy.settings import Settings

import slotkit
from slotkit import addon as addon_module
from slotkit.addon import Addon
from slotkit.downloader import Downloader
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite

ADDON_PATH = "slotkit.addon.Addon"
SLOW = 0.3  # seconds each page takes to answer
PAGES = 8
SCHEDULER = "slotkit.scheduler.ThrottlingAwareScheduler"
PRIORITY_QUEUE = "slotkit.scheduler.ThrottlingAwarePriorityQueue"


def apply(settings: Settings) -> Settings:
    Addon().update_settings(settings)
    return settings


# ----------------------------------------------------------------- update_settings


def test_sets_the_downloader_at_addon_priority():
    """With nothing set by the user, DOWNLOADER becomes slotkit's, at the add-on priority."""
    settings = apply(Settings())
    assert settings["DOWNLOADER"] == "slotkit.Downloader"
    assert settings.getpriority("DOWNLOADER") == 15


def test_keeps_a_downloader_the_project_set(caplog):
    """A DOWNLOADER set at project priority is not overridden, and the log line says so."""
    settings = Settings()
    settings.set("DOWNLOADER", "myproject.Downloader", priority="project")
    with caplog.at_level(logging.INFO, logger="slotkit"):
        apply(settings)
    assert settings["DOWNLOADER"] == "myproject.Downloader"
    (message,) = [r.getMessage() for r in caplog.records if "add-on" in r.getMessage()]
    assert "kept the user's DOWNLOADER='myproject.Downloader'" in message


def test_logs_one_line_with_what_it_set(caplog):
    """One INFO line names every setting written."""
    with caplog.at_level(logging.INFO, logger="slotkit"):
        apply(Settings())
    messages = [r.getMessage() for r in caplog.records if r.name == "slotkit"]
    assert len(messages) == 1
    assert messages[0].startswith("slotkit add-on: set DOWNLOADER=slotkit.Downloader")


def test_sets_the_throttling_aware_scheduler_pair_when_available(monkeypatch):
    """Both scheduler settings are written when slotkit.scheduler has both classes."""
    fake = types.ModuleType("slotkit.scheduler")
    fake.ThrottlingAwareScheduler = type("ThrottlingAwareScheduler", (), {})  # type: ignore[attr-defined]
    fake.ThrottlingAwarePriorityQueue = type("ThrottlingAwarePriorityQueue", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "slotkit.scheduler", fake)
    settings = apply(Settings())
    assert settings["SCHEDULER"] == SCHEDULER
    assert settings["SCHEDULER_PRIORITY_QUEUE"] == PRIORITY_QUEUE


def test_leaves_the_scheduler_alone_without_the_classes(monkeypatch):
    """Without slotkit's scheduler classes, Scrapy's scheduler settings stay untouched."""
    monkeypatch.setitem(sys.modules, "slotkit.scheduler", types.ModuleType("slotkit.scheduler"))
    settings = apply(Settings())
    assert settings["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"
    assert settings.getpriority("SCHEDULER") == 0


def test_leaves_the_scheduler_alone_when_its_module_is_missing(monkeypatch):
    """An ImportError of slotkit.scheduler only skips the scheduler settings."""
    monkeypatch.setitem(sys.modules, "slotkit.scheduler", None)
    settings = apply(Settings())
    assert settings["DOWNLOADER"] == "slotkit.Downloader"
    assert settings.getpriority("SCHEDULER") == 0


def test_a_user_scheduler_keeps_the_priority_queue_untouched(monkeypatch):
    """The scheduler and its queue go together: a user-chosen SCHEDULER blocks both."""
    monkeypatch.setattr(
        addon_module,
        "_scheduler_settings",
        lambda: {"SCHEDULER": SCHEDULER, "SCHEDULER_PRIORITY_QUEUE": PRIORITY_QUEUE},
    )
    settings = Settings()
    settings.set("SCHEDULER", "myproject.Scheduler", priority="project")
    apply(settings)
    assert settings["SCHEDULER"] == "myproject.Scheduler"
    assert settings.getpriority("SCHEDULER_PRIORITY_QUEUE") == 0
    assert settings["DOWNLOADER"] == "slotkit.Downloader"


def test_no_throttling_aware_scheduler_with_a_foreign_downloader(monkeypatch):
    """The scheduler pair needs slotkit's downloader: with the user's own, it is not set."""
    monkeypatch.setattr(
        addon_module,
        "_scheduler_settings",
        lambda: {"SCHEDULER": SCHEDULER, "SCHEDULER_PRIORITY_QUEUE": PRIORITY_QUEUE},
    )
    settings = Settings()
    settings.set("DOWNLOADER", "scrapy.core.downloader.Downloader", priority="project")
    apply(settings)
    assert settings.getpriority("SCHEDULER") == 0
    assert settings.getpriority("SCHEDULER_PRIORITY_QUEUE") == 0


def test_a_slotkit_downloader_subclass_keeps_the_scheduler_pair(monkeypatch):
    """A user's subclass of slotkit.Downloader still gets the throttling-aware scheduler."""
    monkeypatch.setattr(
        addon_module,
        "_scheduler_settings",
        lambda: {"SCHEDULER": SCHEDULER, "SCHEDULER_PRIORITY_QUEUE": PRIORITY_QUEUE},
    )
    subclass = type("MyDownloader", (Downloader,), {})
    settings = Settings()
    settings.set("DOWNLOADER", subclass, priority="project")
    apply(settings)
    assert settings["SCHEDULER"] == SCHEDULER


@pytest.mark.skipif(
    not hasattr(slotkit, "Addon"), reason="slotkit/__init__.py does not export Addon yet"
)
def test_exported_as_slotkit_addon():
    """ADDONS = {"slotkit.Addon": 0} names this class."""
    assert slotkit.Addon is Addon  # type: ignore[attr-defined]


# ----------------------------------------------------------------- real crawls


def _urls(site: MockSite, count: int = PAGES) -> list[str]:
    return [site.url("127.0.0.2", f"/page/{i}", delay=SLOW) for i in range(count)]


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_crawl_with_the_addon_behaves_like_one_configured_by_hand(mock_site: MockSite):
    """Enabled only through ADDONS, slotkit holds CONCURRENT_REQUESTS_PER_DOMAIN=2 like
    DOWNLOADER = "slotkit.Downloader" does."""
    common = {"CONCURRENT_REQUESTS_PER_DOMAIN": 2, "DOWNLOAD_DELAY_JITTER": 0}
    by_addon = await run_crawl(
        ListSpider, {**common, "ADDONS": {ADDON_PATH: 0}}, urls=_urls(mock_site)
    )
    by_addon.assert_no_unhandled_errors()
    assert isinstance(by_addon.crawler.engine.downloader, Downloader)
    assert len(by_addon.responses) == PAGES
    assert mock_site.recorder.max_in_flight["127.0.0.2"] == 2

    mock_site.recorder.clear()
    by_hand = await run_crawl(
        ListSpider, {**common, "DOWNLOADER": "slotkit.Downloader"}, urls=_urls(mock_site)
    )
    assert len(by_hand.responses) == PAGES
    assert mock_site.recorder.max_in_flight["127.0.0.2"] == 2


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_crawl_keeps_a_downloader_set_at_project_priority(mock_site: MockSite):
    """A DOWNLOADER the user set explicitly (project priority) wins over the add-on."""
    result = await run_crawl(
        ListSpider,
        {
            "ADDONS": {ADDON_PATH: 0},
            "DOWNLOADER": "scrapy.core.downloader.Downloader",
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        },
        urls=_urls(mock_site, 2),
    )
    result.assert_no_unhandled_errors()
    assert len(result.responses) == 2
    downloader = result.crawler.engine.downloader
    assert type(downloader) is StockDownloader
