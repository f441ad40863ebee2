"""Shared pytest configuration for slotkit's test suite.

Sections (append new fixtures under the matching heading, keep imports at the top):

1. Hypothesis profiles.
2. Fixtures.
"""

from __future__ import annotations

import os

from hypothesis import settings

# --------------------------------------------------------------------------- 1. Hypothesis profiles
#
# Select one with HYPOTHESIS_PROFILE=<name>. Without it, CI (the CI environment variable is set)
# gets the thorough "ci" profile and a developer's machine the quick "default" one.

# No deadline anywhere: a model example takes 4-41 ms here, and a slower or busy
# machine must not turn that into a failure.
settings.register_profile("default", max_examples=100, deadline=None)
# CI draws the same 1,000 examples every run (derandomize): a change is judged by
# what it changed, and what passes here with CI=1 passes there. "long" explores.
settings.register_profile("ci", max_examples=1000, deadline=None, print_blob=True, derandomize=True)
settings.register_profile("long", max_examples=10_000, deadline=None, print_blob=True)

_CI = os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _CI else "default"))

# --------------------------------------------------------------------------- 2. Fixtures

from collections.abc import AsyncIterator, Iterator  # noqa: E402

import pytest  # noqa: E402
import pytest_twisted  # noqa: E402
from scrapy.resolver import dnscache  # noqa: E402

from tests.server import MockSite  # noqa: E402


@pytest_twisted.async_yield_fixture
async def mock_site() -> AsyncIterator[MockSite]:
    """A running loopback site on 127.0.0.1-4 (one port), stopped after the test."""
    site = MockSite()
    await site.start()
    yield site
    await site.stop()


@pytest.fixture(autouse=True)
def _forget_looked_up_addresses() -> Iterator[None]:
    """Addresses slotkit looked up for IP scopes live in a module cache: one test's
    lookups must not decide the next one's scopes."""
    yield
    from slotkit import dns

    dns._looked_up.clear()


@pytest.fixture(autouse=True)
def _forget_setting_warnings() -> None:
    """Warnings about settings are said once per crawl (a process-wide memory a
    Downloader clears): a test run alone, rerun or reordered hears them too."""
    from slotkit.scope_entries import forget_setting_warnings

    forget_setting_warnings()


@pytest.fixture
def cached_names() -> Iterator[dict[str, str]]:
    """Names put in Scrapy's DNS cache for one test (as its caching resolver would)."""
    names: dict[str, str] = {}
    yield names
    for name in names:
        dnscache.pop(name, None)
