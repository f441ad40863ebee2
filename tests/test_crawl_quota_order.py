"""Real crawls: all else equal, the request spending more of a quota goes first.

The spec: "Everything else being equal, [the priority queue] will prioritize
requests that consume a higher portion of the available throttling quota, to
minimize the risk of those requests getting stuck." slotkit does it where
requests wait: in the gate (any scheduler) and, with the throttling-aware
scheduler, when choosing among slots.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted

from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
SMALL, BIG = 1.0, 3.0
BASE: dict[str, Any] = {
    "DOWNLOADER": "slotkit.Downloader",
    "RANDOMIZE_DOWNLOAD_DELAY": False,
    "DOWNLOAD_DELAY_JITTER": 0,
    "LOG_LEVEL": "INFO",
}


def kinds_in_arrival_order(site: MockSite) -> list[str]:
    """``"big"`` / ``"small"`` per request, in the order the server saw them."""
    return [path.split("/")[1] for path in site.recorder.paths(HOST)]


def alternating(site: MockSite, scopes_of: dict[str, dict[str, float | None]]) -> list[Any]:
    """Four small and four big requests, interleaved, at equal priority."""
    return [
        {"url": site.url(HOST, f"/{kind}/{n}"), "meta": {"throttling_scopes": scopes_of[kind]}}
        for n in range(4)
        for kind in ("small", "big")
    ]


def assert_big_ones_first(site: MockSite) -> None:
    # The first request may go before the others have arrived; after it,
    # every waiting big spender goes before every small one.
    kinds = kinds_in_arrival_order(site)
    assert len(kinds) == 8
    rest = kinds[1:]
    assert rest == sorted(rest), kinds  # "big" < "small"


@pytest_twisted.ensureDeferred
async def test_the_gate_sends_the_bigger_spender_first(mock_site: MockSite) -> None:
    """Stock scheduler: requests wait in the gate, which orders them by quota portion."""
    scopes_of: dict[str, dict[str, float | None]] = {
        "small": {HOST: None, "budget": SMALL},
        "big": {HOST: None, "budget": BIG},
    }
    settings = {
        **BASE,
        "THROTTLING_SCOPES": {
            HOST: {"concurrency": 1, "delay": 0.1},
            "budget": {"concurrency": 8, "quota": 100.0},
        },
    }
    result = await run_crawl(ListSpider, settings, urls=alternating(mock_site, scopes_of))
    result.assert_no_unhandled_errors()
    assert_big_ones_first(mock_site)


@pytest_twisted.ensureDeferred
async def test_the_aware_scheduler_picks_the_slot_of_the_bigger_spender(
    mock_site: MockSite,
) -> None:
    """Throttling-aware scheduler, one request at a time: across slots, the larger
    share of what is left of the quota goes first (also before the quota scope exists)."""
    scopes_of: dict[str, dict[str, float | None]] = {
        "small": {"small-calls": None, "budget": SMALL},
        "big": {"big-calls": None, "budget": BIG},
    }
    settings = {
        **BASE,
        "CONCURRENT_REQUESTS": 1,
        "SCHEDULER": "slotkit.scheduler.ThrottlingAwareScheduler",
        "SCHEDULER_PRIORITY_QUEUE": "slotkit.pqueue.ThrottlingAwarePriorityQueue",
        "THROTTLING_SCOPES": {"budget": {"concurrency": 8, "quota": 100.0}},
    }
    result = await run_crawl(ListSpider, settings, urls=alternating(mock_site, scopes_of))
    result.assert_no_unhandled_errors()
    assert_big_ones_first(mock_site)
