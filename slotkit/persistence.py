"""Politeness that survives a pause: scope state in ``JOBDIR``.

When a crawl with ``JOBDIR`` stops, every scope still holding something a
site asked for (a backoff level, a hard deadline from ``Retry-After`` or
``delay_scope``) and every robots.txt Crawl-delay is written to
``JOBDIR/slotkit-scopes.json``. A resumed crawl reads it back, so it does not
hammer a site that was backing off when the crawl stopped. Deadlines are
stored as absolute times of the crawl clock (epoch seconds under a Twisted
reactor), so the time spent paused counts.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

logger = logging.getLogger("slotkit")

__all__ = ["ScopeStateStore"]

FILENAME = "slotkit-scopes.json"
VERSION = 1


class ScopeStateStore:
    """Reads and writes the saved scope states of one job directory."""

    def __init__(self, jobdir: str) -> None:
        self.path = os.path.join(jobdir, FILENAME)

    def load(self) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
        """Saved ``(scope states, crawl delays)``; empty if nothing usable was saved."""
        try:
            with open(self.path, encoding="utf-8") as file:
                data = json.load(file)
        except FileNotFoundError:
            return {}, {}
        except (OSError, ValueError):
            logger.warning("slotkit: ignoring unreadable %s", self.path, exc_info=True)
            return {}, {}
        if not isinstance(data, dict) or data.get("version") != VERSION:
            return {}, {}
        scopes = {
            str(key): {str(k): float(v) for k, v in value.items()}
            for key, value in (data.get("scopes") or {}).items()
            if isinstance(value, dict)
        }
        delays = {str(key): float(value) for key, value in (data.get("crawl_delays") or {}).items()}
        return scopes, delays

    def save(self, scopes: dict[str, dict[str, float]], crawl_delays: dict[str, float]) -> None:
        """Write the states atomically (a crash mid-write leaves the old file)."""
        data: dict[str, Any] = {"version": VERSION, "scopes": scopes, "crawl_delays": crawl_delays}
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as file:
                json.dump(data, file)
            os.replace(tmp, self.path)
        except OSError:
            logger.warning("slotkit: could not save scope states to %s", self.path, exc_info=True)
