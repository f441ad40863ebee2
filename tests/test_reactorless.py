"""slotkit in Scrapy's reactorless mode (TWISTED_REACTOR_ENABLED = False)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_delay_holds_without_a_reactor() -> None:
    """Without a Twisted reactor the downloader runs on the asyncio loop and keeps delays."""
    completed = subprocess.run(
        [sys.executable, "-m", "tests.reactorless_crawl"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["responses"] == 6
    assert not result["reactor_imported"]
    for gaps in result["gaps"].values():
        assert len(gaps) == 2
        assert min(gaps) >= 0.2
