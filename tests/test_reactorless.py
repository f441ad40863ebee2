"""slotkit in Scrapy's reactorless mode (TWISTED_REACTOR_ENABLED = False)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from tests.reactorless_crawl import DELAY

ROOT = Path(__file__).resolve().parent.parent


def reactorless_crawl(*args: str) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-m", "tests.reactorless_crawl", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return cast(dict[str, Any], json.loads(completed.stdout.strip().splitlines()[-1]))


@pytest.mark.integration
def test_delay_holds_without_a_reactor() -> None:
    """Without a Twisted reactor the downloader runs on the asyncio loop and keeps delays."""
    result = reactorless_crawl()
    assert result["responses"] == 6
    assert not result["reactor_imported"]
    for gaps in result["gaps"].values():
        assert len(gaps) == 2
        # The gaps are on the loop's time; the gate decides on epoch readings
        # (loop time plus an offset), which round differently (~1e-7 s).
        assert min(gaps) >= DELAY - 1e-3


@pytest.mark.integration
def test_per_ip_concurrency_holds_without_a_reactor() -> None:
    """Two names on one address, CONCURRENT_REQUESTS_PER_IP = 1: one request at a time.

    A probe saw 5 in flight: reactorless downloads never fill Scrapy's DNS
    cache, so the IP scope of a host name was never known. slotkit asks the
    event loop for the address itself.
    """
    result = reactorless_crawl("--per-ip")
    assert result["responses"] == 6
    assert not result["reactor_imported"]
    assert result["peak_in_flight"] == 1
