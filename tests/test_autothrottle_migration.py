"""Leaving AutoThrottle: the mapping, one warning, one controller."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import pytest_twisted
from scrapy.exceptions import ScrapyDeprecationWarning
from scrapy.settings import Settings

from slotkit.migration import format_report, migration_report
from slotkit.settings import ThrottlingSettings
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite

SLOTKIT: dict[str, Any] = {"DOWNLOADER": "slotkit.Downloader", "DOWNLOAD_DELAY_JITTER": 0}
AUTOTHROTTLE = {
    "AUTOTHROTTLE_ENABLED": True,
    "AUTOTHROTTLE_START_DELAY": 0.1,
    "AUTOTHROTTLE_MAX_DELAY": 7.0,
    "AUTOTHROTTLE_DEBUG": True,
}


def test_mapping_applies_to_scope_configs() -> None:
    """START_DELAY -> delay, MAX_DELAY -> backoff max, TARGET_CONCURRENCY -> rampup, DEBUG."""
    settings = ThrottlingSettings.from_settings(Settings(AUTOTHROTTLE))
    config = settings.scope_config("example.com", "domain")
    assert config.delay == 0.1
    assert config.backoff.max_delay == 7.0
    assert config.rampup is not None
    assert config.sources["delay"] == "AutoThrottle mapping"
    assert settings.debug
    assert settings.scope_config("api", "custom").rampup is None
    # A site reached by its address (a crawl of 127.0.0.1) is a site too.
    assert settings.scope_config("127.0.0.1", "ip").rampup is not None


def test_the_mapped_rampup_never_goes_below_the_projects_download_delay() -> None:
    """AutoThrottle never set a delay below DOWNLOAD_DELAY; the mapping's rampup
    took a 0.5 s DOWNLOAD_DELAY down to 0 (an acceptance probe: 58 requests a
    second against a floor of 2). The migrate report keeps the floor too."""
    values = {**AUTOTHROTTLE, "DOWNLOAD_DELAY": 0.05}
    config = ThrottlingSettings.from_settings(Settings(values)).scope_config("a.test", "domain")
    assert config.rampup is not None
    assert config.rampup.min_delay == 0.05
    text = format_report(migration_report(Settings(values)))
    assert "'rampup': {'min_delay': 0.05}" in text
    assert "min_delay keeps DOWNLOAD_DELAY = 0.05 its floor" in text


def test_explicit_slotkit_settings_win() -> None:
    """An explicit BACKOFF_MAX_DELAY is kept over AUTOTHROTTLE_MAX_DELAY."""
    values = {**AUTOTHROTTLE, "BACKOFF_MAX_DELAY": 42.0}
    settings = ThrottlingSettings.from_settings(Settings(values, priority="project"))
    assert settings.backoff.max_delay == 42.0


@pytest.mark.parametrize(
    ("value", "jitter"),
    [(False, "0.0"), (True, "0.5"), (0.2, "0.2"), (1.0, "1.0"), ([-0.1, 0.3], "[-0.1, 0.3]")],
)
def test_migrate_reads_randomize_download_delay_as_slotkit_does(value: object, jitter: str) -> None:
    """A review: a factor (0.2, the float 1.0) was read as Scrapy's boolean, so the
    report suggested a jitter other than the one the crawl ran with."""
    changes = migration_report(Settings({"RANDOMIZE_DOWNLOAD_DELAY": value}, priority="project"))
    assert f"DOWNLOAD_DELAY_JITTER = {jitter}" in format_report(changes)


def test_migrate_keeps_a_download_delay_jitter_set_above_randomize() -> None:
    """A review: with both set, the report gave RANDOMIZE_DOWNLOAD_DELAY's reading
    though DOWNLOAD_DELAY_JITTER, set at the same priority, is what the crawl uses."""
    values = {"RANDOMIZE_DOWNLOAD_DELAY": False, "DOWNLOAD_DELAY_JITTER": 0.3}
    changes = migration_report(Settings(values, priority="project"))
    assert "DOWNLOAD_DELAY_JITTER = 0.3" in format_report(changes)


def test_migrate_report_lists_every_change() -> None:
    """The report names each replacement with a note."""
    text = format_report(
        migration_report(Settings({**AUTOTHROTTLE, "RANDOMIZE_DOWNLOAD_DELAY": False}))
    )
    for expected in (
        "DOWNLOADER = 'slotkit.Downloader'",
        "DOWNLOAD_DELAY = 0.1",
        "BACKOFF_MAX_DELAY = 7.0",
        "THROTTLING_DEBUG = True",
        "'rampup': True",
        "throttling_dont_track",
        "DOWNLOAD_DELAY_JITTER = 0.0",
    ):
        assert expected in text


def test_migrate_report_says_the_start_delay_stays_without_rampup() -> None:
    """Acceptance probe: pasted into a project that only enabled AutoThrottle, the
    report's 'the delay scopes start at' DOWNLOAD_DELAY = 5.0 held every site at 5 s
    gaps (4 pages in 20 s; AutoThrottle: 100). The note says so, and names the
    project's own delay as the faster choice."""
    text = format_report(migration_report(Settings({"AUTOTHROTTLE_ENABLED": True})))
    assert "DOWNLOAD_DELAY = 5.0" in text
    assert "lowered only where rampup is on" in text
    assert "Without rampup, DOWNLOAD_DELAY = 0.0 (the project's own) is far faster" in text


def test_migrate_report_keeps_a_backoff_max_delay_the_project_sets() -> None:
    """The project's own BACKOFF_MAX_DELAY wins at run time, so the report must
    not tell the user to replace it with AUTOTHROTTLE_MAX_DELAY (an acceptance
    probe saw ``BACKOFF_MAX_DELAY = 7.0`` printed over a project's 42)."""
    values = {**AUTOTHROTTLE, "BACKOFF_MAX_DELAY": 42.0}
    text = format_report(migration_report(Settings(values, priority="project")))
    assert "BACKOFF_MAX_DELAY = 42.0" in text
    assert "BACKOFF_MAX_DELAY = 7.0" not in text


def test_migrate_keeps_the_projects_own_throttling_scopes() -> None:
    """A probe: the printed THROTTLING_SCOPES held only the DOWNLOAD_SLOTS entries,
    so pasting it dropped the project's own (a quota went with it)."""
    values = {
        "DOWNLOAD_SLOTS": {
            "a.example": {"delay": 2.0, "concurrency": 4},
            "b.example": {"delay": 1},
        },
        "THROTTLING_SCOPES": {
            "shop.example": {"quota": 100, "window": 30},
            "a.example": {"concurrency": 2},
        },
    }
    (change,) = [
        c
        for c in migration_report(Settings(values, priority="project"))
        if c.setting == "THROTTLING_SCOPES"
    ]
    assert change.value == {
        "a.example": {"delay": 2.0, "concurrency": 2},
        "b.example": {"delay": 1},
        "shop.example": {"quota": 100, "window": 30},
    }
    assert "entries are kept" in change.note


@pytest.mark.integration
@pytest.mark.parametrize("extension", ["enabled", "disabled"])
@pytest_twisted.ensureDeferred
async def test_crawl_with_autothrottle_settings(mock_site: MockSite, extension: str) -> None:
    """The crawl works with AutoThrottle's settings; only slotkit steers the delay."""
    settings: dict[str, Any] = {**SLOTKIT, **AUTOTHROTTLE}
    if extension == "disabled":
        settings["EXTENSIONS"] = {"scrapy.extensions.throttle.AutoThrottle": None}
    delays: list[float] = []

    def watch(crawler: Any) -> None:
        from scrapy import signals

        def downloaded(response: Any, request: Any, spider: Any) -> None:
            downloader = crawler.engine.downloader
            delays.append(downloader.slots["127.0.0.1"].delay)
            rampups.append(downloader.registry.peek("127.0.0.1").manager.rampup is not None)

        crawler.signals.connect(downloaded, signal=signals.response_downloaded)
        keep.append(downloaded)

    keep: list[Any] = []
    rampups: list[bool] = []
    urls = [mock_site.url("127.0.0.1", f"/page/{i}", delay=0.05) for i in range(4)]
    with pytest.warns(ScrapyDeprecationWarning, match="AUTOTHROTTLE_ENABLED is deprecated"):
        result = await run_crawl(ListSpider, settings, urls=urls, on_crawler=watch)
    assert len(result.responses) == 4
    assert result.log_text.count("AUTOTHROTTLE_ENABLED is set") == 1
    # An acceptance probe: a slot's concurrency of 6 went to 1, and nothing said so.
    assert "rampup starts every site at concurrency 1" in result.log_text
    # AutoThrottle would move the delay toward the latency; slotkit keeps the mapped one.
    assert set(delays) == {0.1}
    assert rampups  # AUTOTHROTTLE_TARGET_CONCURRENCY -> rampup
    assert all(rampups)


def test_migrate_download_slots_become_valid_throttling_scopes() -> None:
    """DOWNLOAD_SLOTS entries are translated, not copied: randomize_delay becomes the jitter
    Scrapy derives from it (an explicit jitter wins), keys Scrapy ignores are left out, and
    the suggested THROTTLING_SCOPES is accepted and means the same."""
    slots = {
        "on": {"delay": 2, "randomize_delay": True, "concurency": 3},
        "off": {"concurrency": 1, "delay": 0.4, "randomize_delay": False},
        "both": {"jitter": 0.1, "randomize_delay": True},
    }
    settings = Settings({"DOWNLOAD_SLOTS": slots, "DOWNLOAD_DELAY_JITTER": 0.2})
    (change,) = [c for c in migration_report(settings) if c.setting == "THROTTLING_SCOPES"]
    assert change.value == {
        "on": {"delay": 2, "jitter": 0.5},
        "off": {"concurrency": 1, "delay": 0.4, "jitter": 0},
        "both": {"jitter": 0.1},
    }
    for expected in ("randomize_delay", "'concurency'", "'jitter' wins"):
        assert expected in change.note
    text = format_report([change])
    assert all(line.startswith("# ") for line in text.splitlines()[2:-1]), text
    before = ThrottlingSettings.from_settings(settings)
    after = ThrottlingSettings.from_settings(
        Settings({"THROTTLING_SCOPES": change.value, "DOWNLOAD_DELAY_JITTER": 0.2})
    )
    for scope in slots:
        old, new = before.scope_config(scope, "domain"), after.scope_config(scope, "domain")
        assert (old.concurrency, old.delay, old.jitter) == (new.concurrency, new.delay, new.jitter)


def test_migrate_warns_that_download_slots_keep_the_address_pace_per_ip() -> None:
    """An acceptance probe: stock Scrapy let a download_slot skip the per-IP slot,
    slotkit's address scope keeps DOWNLOAD_DELAY for it too; migrate now says so."""
    values = {
        "CONCURRENT_REQUESTS_PER_IP": 3,
        "DOWNLOAD_DELAY": 2.0,
        "DOWNLOAD_SLOTS": {"bulk": {"delay": 0.5}},
    }
    text = format_report(migration_report(Settings(values, priority="project")))
    assert "download_slot also keep their address's DOWNLOAD_DELAY" in text
    quiet = format_report(migration_report(Settings({"CONCURRENT_REQUESTS_PER_IP": 3})))
    assert "download_slot" not in quiet
    # A docs probe: a delay that comes from AUTOTHROTTLE_START_DELAY got no note.
    autothrottled = {
        "AUTOTHROTTLE_ENABLED": True,
        "CONCURRENT_REQUESTS_PER_IP": 3,
        "DOWNLOAD_SLOTS": {"bulk": {"delay": 0.5}},
    }
    text = format_report(migration_report(Settings(autothrottled, priority="project")))
    assert "download_slot also keep their address's DOWNLOAD_DELAY" in text


def test_the_warning_says_when_the_start_delay_is_slower_than_the_projects_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A startproject project (DOWNLOAD_DELAY 0.25, AutoThrottle on) crawled 10 times
    slower after the switch, and the warning only listed 'DOWNLOAD_DELAY = 5.0'."""
    from scrapy.utils.test import get_crawler

    from slotkit.migration import silence_autothrottle

    crawler = get_crawler(settings_dict={"AUTOTHROTTLE_ENABLED": True, "DOWNLOAD_DELAY": 0.25})
    with caplog.at_level(logging.WARNING, logger="slotkit"), pytest.warns(ScrapyDeprecationWarning):
        silence_autothrottle(crawler)
    assert "starts at AUTOTHROTTLE_START_DELAY = 5s" in caplog.text
    assert "far slower than AutoThrottle" in caplog.text
    assert "drop the AUTOTHROTTLE_* settings: DOWNLOAD_DELAY = 0.25 then applies" in caplog.text
