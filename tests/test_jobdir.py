"""Pause and resume with JOBDIR keeps a site's backoff and deadlines."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request
from twisted.internet.task import Clock

from slotkit.gate import GateClosedError
from slotkit.persistence import ScopeStateStore
from slotkit.scope import ThrottlingScopeManager
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite, fail_first

SLOTKIT: dict[str, Any] = {"DOWNLOADER": "slotkit.Downloader", "DOWNLOAD_DELAY_JITTER": 0}
HOST, OTHER = "127.0.0.1", "127.0.0.2"
RETRY_AFTER = 30
PAUSE_AFTER = 3
"""CLOSESPIDER_TIMEOUT of a first run, whose requests must have gone (or reached the
gate) before it pauses, on a busy machine too: a cold start alone took 0.3 s of the
1 s this was."""
HELD = 2 * PAUSE_AFTER
"""A delay that still holds a request when that run pauses."""


def test_scope_state_round_trip(tmp_path: Path) -> None:
    """A hold and a backoff level survive export, save, load and import."""
    scope = ThrottlingScopeManager(concurrency=2)
    scope.record_backoff(None, now=100.0)
    scope.record_backoff(30.0, now=100.0)
    store = ScopeStateStore(str(tmp_path))
    store.save({"a": scope.export_state(101.0) or {}}, {"a": 2.0})
    states, delays = store.load()
    fresh = ThrottlingScopeManager(concurrency=2)
    fresh.import_state(states["a"], now=105.0)
    assert fresh.can_send(105.0) == pytest.approx(25.0)
    assert fresh.backoff_delay == 1.0
    assert delays == {"a": 2.0}


def test_a_running_delay_is_saved_as_a_deadline() -> None:
    """Paused 0.5 s into a 2 s gap, the resumed crawl still waits the other 1.5 s."""
    scope = ThrottlingScopeManager(concurrency=1, delay=2.0)
    scope.record_sent(100.0)
    scope.record_done(100.0)
    state = scope.export_state(100.5)
    assert state == {"last_sent": 100.0}
    fresh = ThrottlingScopeManager(concurrency=1, delay=2.0)
    fresh.import_state(state, now=100.6)
    assert fresh.can_send(100.6) == pytest.approx(1.4)
    # Resumed with a shorter delay (the user changed it), the new one applies.
    faster = ThrottlingScopeManager(concurrency=1, delay=0.05)
    faster.import_state(state, now=100.6)
    assert faster.can_send(100.6) == 0.0
    assert scope.export_state(102.0) is None  # the gap is over: nothing to keep


def test_saved_times_move_onto_the_resumed_crawls_clock(tmp_path: Path) -> None:
    """Saved on a Twisted reactor (epoch seconds), resumed reactorless (the loop's monotonic clock).

    A probe paused one way and resumed the other: the resumed crawl sent
    nothing for 25 s (a delay ending in 57 years), or dropped a Retry-After
    hold. Times are moved to the new clock, less the time spent paused.
    """
    epoch, monotonic = Clock(), Clock()
    epoch.advance(1_796_000_000.0)
    monotonic.advance(500.0)
    wall = [1_796_000_000.0]
    saving = ScopeStateStore(str(tmp_path), epoch, wall=lambda: wall[0])
    saving.save({"a": {"hold_until": epoch.seconds() + 10.0, "backoff_delay": 4.0}}, {})
    wall[0] += 3.0  # paused for 3 s
    states, _ = ScopeStateStore(str(tmp_path), monotonic, wall=lambda: wall[0]).load()
    assert states["a"]["hold_until"] == pytest.approx(500.0 + 7.0)
    assert states["a"]["backoff_delay"] == 4.0, "a duration is not a time"


def test_a_file_of_the_first_format_is_read_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "slotkit-scopes.json").write_text(
        '{"version": 1, "scopes": {"a": {"hold_until": 130.0}}, "crawl_delays": {}}'
    )
    clock = Clock()
    clock.advance(100.0)
    states, _ = ScopeStateStore(str(tmp_path), clock).load()
    assert states == {"a": {"hold_until": 130.0}}


def test_quota_spent_before_the_pause_stays_spent() -> None:
    """3 of a quota of 3 per 30 s spent, paused, resumed: the next unit waits for the window."""
    scope = ThrottlingScopeManager(concurrency=4, quota=3, window=30.0)
    for _ in range(3):
        scope.record_sent(100.0)
    for _ in range(3):
        scope.record_done(100.5)
    state = scope.export_state(102.0)
    assert state is not None
    assert state["quota_used"] == 3.0
    assert state["quota_until"] == pytest.approx(130.5)
    fresh = ThrottlingScopeManager(concurrency=4, quota=3, window=30.0)
    fresh.import_state(state, now=103.0)
    assert fresh.can_send(103.0) == pytest.approx(27.5)
    assert fresh.can_send(131.0) == 0.0


def test_the_gap_after_a_resumed_scopes_first_request_runs_from_its_end() -> None:
    """As after any scope's first request: it also opened the connection (probe: 3-30 ms short)."""
    scope = ThrottlingScopeManager(concurrency=1, delay=0.4)
    scope.import_state({"last_sent": 99.9}, now=100.0)
    assert scope.can_send(100.0) == pytest.approx(0.3)
    scope.record_sent(100.3)
    scope.record_done(100.35)  # connection set-up and the answer took 50 ms
    assert scope.can_send(100.35) == pytest.approx(0.4)
    scope.record_sent(100.75)
    scope.record_done(100.8)
    assert scope.can_send(100.8) == pytest.approx(0.35), "only once"


def test_a_quota_saved_for_a_scope_left_unused_survives_another_pause(tmp_path: Path) -> None:
    """Review: a resumed crawl that never touched the scope dropped its spent quota at its pause."""
    from tests.test_downloader_unit import make_downloader

    clock = Clock()
    clock.advance(100.0)
    ScopeStateStore(str(tmp_path), clock).save(
        {"q.example": {"quota_used": 3.0, "quota_until": 130.0}}, {}
    )
    downloader, _ = make_downloader({"JOBDIR": str(tmp_path)}, clock=clock)
    clock.advance(5.0)
    downloader._save_states()
    states, _ = ScopeStateStore(str(tmp_path), clock).load()
    assert states["q.example"]["quota_until"] == pytest.approx(130.0, abs=0.5)
    assert states["q.example"]["quota_used"] == 3.0


def test_unreadable_state_file_is_ignored(tmp_path: Path) -> None:
    """A damaged state file means a fresh start, not a crash."""
    (tmp_path / "slotkit-scopes.json").write_text("{not json")
    assert ScopeStateStore(str(tmp_path)).load() == ({}, {})


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_resume_during_retry_after_waits_for_the_deadline(
    mock_site: MockSite, tmp_path: Path
) -> None:
    """Paused during a Retry-After: 30 hold and resumed at once, nothing reaches the site."""
    mock_site.set_behaviour(HOST, fail_first(1, 429, {"Retry-After": str(RETRY_AFTER)}))
    settings = {
        **SLOTKIT,
        "JOBDIR": str(tmp_path / "job"),
        "CLOSESPIDER_TIMEOUT": PAUSE_AFTER,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    }
    urls = [mock_site.url(HOST, "/page/0"), mock_site.url(OTHER, "/page/1")]
    first = await run_crawl(ListSpider, settings, urls=urls, crawl_timeout=20)
    assert first.finish_reason == "closespider_timeout"
    assert mock_site.recorder.count(HOST) == 1
    assert first.stats["throttling/requests_requeued"] == 1
    # Put back, not failed: the spider's errback never hears of the paused request.
    assert first.errors == []

    mock_site.recorder.clear()
    second = await run_crawl(ListSpider, settings, urls=[], crawl_timeout=20)
    assert second.finish_reason == "closespider_timeout"
    assert mock_site.recorder.count(HOST) == 0  # still inside the 30 s deadline
    # The held request came back from the job's queue, waited, and was saved again.
    assert second.stats["throttling/requests_requeued"] == 1


@pytest.mark.integration
@pytest.mark.parametrize("aware", [False, True], ids=["scrapy-scheduler", "slotkit-scheduler"])
@pytest_twisted.ensureDeferred
async def test_a_pause_keeps_what_is_left_of_a_throttling_delay(
    mock_site: MockSite, tmp_path: Path, aware: bool
) -> None:
    """Paused 3 s into a 30 s throttling_delay and resumed at once, the request
    still waits: the copy put back kept its deadline (it went out at once). With
    slotkit's scheduler it waits in the job's queue, on disk, with its deadline."""
    settings = {**SLOTKIT, "JOBDIR": str(tmp_path / "job"), "CLOSESPIDER_TIMEOUT": PAUSE_AFTER}
    if aware:
        settings["ADDONS"] = {"slotkit.Addon": 0}
    urls = [{"url": mock_site.url(HOST, "/page/0"), "meta": {"throttling_delay": 30.0}}]
    first = await run_crawl(ListSpider, settings, urls=urls, crawl_timeout=20)
    assert first.finish_reason == "closespider_timeout"
    assert first.stats.get("throttling/requests_requeued", 0) == (0 if aware else 1)
    # It never went: the downloader stats count it when the resumed crawl sends it
    # (a chaos probe: put-back requests counted, request_count above responses).
    assert first.stats.get("downloader/request_count", 0) == 0
    assert first.stats.get("downloader/request_bytes", 0) == 0
    second = await run_crawl(
        ListSpider, {**settings, "CLOSESPIDER_TIMEOUT": 2}, urls=[], crawl_timeout=20
    )
    assert "Resuming crawl (1 requests scheduled)" in second.log_text
    assert second.finish_reason == "closespider_timeout"
    assert mock_site.recorder.count(HOST) == 0  # still inside the 30 s delay


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_spent_quota_stays_spent_across_a_pause(
    mock_site: MockSite, tmp_path: Path
) -> None:
    """Quota 3 per 30 s: 3 pages, pause, resume at once: nothing more for the window."""
    settings = {
        **SLOTKIT,
        "JOBDIR": str(tmp_path / "job"),
        "CLOSESPIDER_TIMEOUT": PAUSE_AFTER,
        "THROTTLING_SCOPES": {HOST: {"quota": 3, "window": 30}},
    }
    urls = [mock_site.url(HOST, f"/page/{i}") for i in range(6)]
    first = await run_crawl(ListSpider, settings, urls=urls, crawl_timeout=20)
    assert first.finish_reason == "closespider_timeout"
    assert mock_site.recorder.count(HOST) == 3
    mock_site.recorder.clear()
    second = await run_crawl(ListSpider, settings, urls=[], crawl_timeout=20)
    assert second.finish_reason == "closespider_timeout"
    assert mock_site.recorder.count(HOST) == 0, "the window's 3 units were spent before the pause"


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_requeued_request_is_filtered_as_usual_once_back(
    mock_site: MockSite, tmp_path: Path
) -> None:
    """Put back at close, a request passes the dupefilter once; its redirect does not.

    The resumed crawl sends the held request; its redirect leads to a page
    the first run already fetched, which the dupefilter drops, as it would
    have without the pause.
    """
    seen = mock_site.url(HOST, "/page/0")
    settings = {
        **SLOTKIT,
        "JOBDIR": str(tmp_path / "job"),
        "CLOSESPIDER_TIMEOUT": PAUSE_AFTER,
        "THROTTLING_SCOPES": {OTHER: {"delay": HELD}},
    }
    urls = [
        seen,
        mock_site.url(OTHER, "/page/1"),
        mock_site.url(OTHER, "/redirect", to=seen),  # held by the delay at close
    ]
    first = await run_crawl(ListSpider, settings, urls=urls, crawl_timeout=20, dont_filter=False)
    assert first.stats["throttling/requests_requeued"] == 1
    assert mock_site.recorder.count(HOST) == 1

    second = await run_crawl(
        ListSpider,
        {**settings, "CLOSESPIDER_TIMEOUT": 0},
        urls=[],
        crawl_timeout=20,
        dont_filter=False,
    )
    assert second.finish_reason == "finished"
    assert mock_site.recorder.count(OTHER) == 2  # the held request went out
    assert mock_site.recorder.count(HOST) == 1  # its redirect target was filtered
    assert second.stats.get("dupefilter/filtered") == 1


class DownloadFromCallbackSpider(ListSpider):
    """Its callback awaits an ``engine.download_async()`` of the same (delayed) host."""

    outcome: list[str]

    async def parse(self, response: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        assert self.crawler.engine is not None
        follow = Request(response.url + "?again", dont_filter=True)
        try:
            await self.crawler.engine.download_async(follow)
        except GateClosedError:
            type(self).outcome.append("GateClosedError")
        else:
            type(self).outcome.append("response")
        return None


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_pause_ends_an_engine_download_waiting_at_the_gate(
    mock_site: MockSite, tmp_path: Path
) -> None:
    """engine.download() requests bypass the scheduler: a pause fails them, once.

    Handed back as a copy (as scheduled ones are), the engine would fetch the
    copy again at once, and again: the crawl never closed.
    """
    DownloadFromCallbackSpider.outcome = []
    settings = {
        **SLOTKIT,
        "JOBDIR": str(tmp_path / "job"),
        "CLOSESPIDER_TIMEOUT": PAUSE_AFTER,
        "THROTTLING_SCOPES": {HOST: {"delay": HELD}},
    }
    result = await run_crawl(
        DownloadFromCallbackSpider,
        settings,
        urls=[mock_site.url(HOST, "/page/0")],
        crawl_timeout=20,
    )
    assert result.finish_reason == "closespider_timeout"
    assert result.duration < 10  # the watchdog is 20 s; it closed at the timeout
    assert DownloadFromCallbackSpider.outcome == ["GateClosedError"]
    assert mock_site.recorder.count(HOST) == 1
    # Handed back and straight back again: unsent once, requeued never.
    assert result.stats.get("throttling/requests_requeued", 0) == 0
    assert result.stats["throttling/requests_unsent_at_close"] == 1


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_held_request_the_job_cannot_store_fails_at_a_pause(
    mock_site: MockSite, tmp_path: Path
) -> None:
    """A request the scheduler's disk queue cannot store (here a meta value that
    does not pickle; often a lambda callback) ends as without JOBDIR: put back,
    it went to Scrapy's memory queue, dropped at the pause, and was never sent
    nor failed (an acceptance probe)."""
    settings = {
        **SLOTKIT,
        "JOBDIR": str(tmp_path / "job"),
        "CLOSESPIDER_TIMEOUT": PAUSE_AFTER,
        "THROTTLING_SCOPES": {HOST: {"delay": HELD}},
    }
    urls = [mock_site.url(HOST, "/page/0"), mock_site.url(HOST, "/page/1")]
    first = await run_crawl(
        ListSpider, settings, urls=urls, meta={"lock": threading.Lock()}, crawl_timeout=20
    )
    assert first.finish_reason == "closespider_timeout"
    assert mock_site.recorder.count(HOST) == 1
    assert [error.type for error in first.errors] == ["GateClosedError"]
    assert first.stats.get("throttling/requests_requeued", 0) == 0
    assert "1 cannot be saved there" in first.log_text


@pytest.mark.parametrize(
    ("settings", "start", "saved"),
    [
        ({}, False, True),  # Scrapy's pickle queues take a datetime
        ({"SCHEDULER_DISK_QUEUE": "scrapy.squeues.MarshalFifoDiskQueue"}, False, False),
        # Start requests go to SCHEDULER_START_DISK_QUEUE, pickle by default.
        ({"SCHEDULER_DISK_QUEUE": "scrapy.squeues.MarshalLifoDiskQueue"}, True, True),
        ({"SCHEDULER_START_DISK_QUEUE": "scrapy.squeues.MarshalFifoDiskQueue"}, True, False),
    ],
)
def test_what_the_jobs_disk_queue_cannot_store_is_known(
    settings: dict[str, Any], start: bool, saved: bool
) -> None:
    """A datetime in the meta pickles but does not marshal: with a marshal
    queue the request would be lost in the memory queue at a pause (a review:
    every Scrapy queue class is named ScrapyRequestQueue, so the name said
    nothing)."""
    import datetime

    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from slotkit.closing import can_be_saved

    crawler = get_crawler(Spider, settings_dict=settings)
    crawler.spider = crawler._create_spider("jobs")
    meta: dict[str, Any] = {"when": datetime.datetime(2026, 1, 1)}
    if start:
        meta["is_start_request"] = True
    assert can_be_saved(Request("https://a.example/", meta=meta), crawler) is saved
