"""Pause and resume with JOBDIR keeps a site's backoff and deadlines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request

from slotkit.gate import GateClosedError
from slotkit.persistence import ScopeStateStore
from slotkit.scope import ThrottlingScopeManager
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite, fail_first

SLOTKIT: dict[str, Any] = {"DOWNLOADER": "slotkit.Downloader", "DOWNLOAD_DELAY_JITTER": 0}
HOST, OTHER = "127.0.0.1", "127.0.0.2"
RETRY_AFTER = 30


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
        "CLOSESPIDER_TIMEOUT": 1,
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
    second = await run_crawl(
        ListSpider, {**settings, "CLOSESPIDER_TIMEOUT": 2}, urls=[], crawl_timeout=20
    )
    assert second.finish_reason == "closespider_timeout"
    assert mock_site.recorder.count(HOST) == 0  # still inside the 30 s deadline
    # The held request came back from the job's queue, waited, and was saved again.
    assert second.stats["throttling/requests_requeued"] == 1


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
        "CLOSESPIDER_TIMEOUT": 1,
        "THROTTLING_SCOPES": {OTHER: {"delay": 3.0}},
    }
    urls = [
        seen,
        mock_site.url(OTHER, "/page/1"),
        mock_site.url(OTHER, "/redirect", to=seen),  # held by the 3 s delay at close
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
        "CLOSESPIDER_TIMEOUT": 1,
        "THROTTLING_SCOPES": {HOST: {"delay": 5.0}},
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
