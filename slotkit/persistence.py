"""Politeness that survives a pause: scope state in ``JOBDIR``.

When a crawl with ``JOBDIR`` stops, every scope still holding something a
site asked for (a backoff level, a hard deadline from ``Retry-After`` or
``delay_scope``) and every robots.txt Crawl-delay is written to
``JOBDIR/slotkit-scopes.json``. A resumed crawl reads it back, so it does not
hammer a site that was backing off when the crawl stopped.

Managers export deadlines as times of the crawl's clock, which is epoch
seconds under a Twisted reactor but the event loop's monotonic clock in
Scrapy's reactorless mode (reset at each boot). So the file also keeps that
clock's reading and the wall-clock time of the save, and loading moves
every deadline onto the resumed crawl's clock, less the time spent paused.
A state key names a time when it ends in ``_at`` or ``_until`` or starts
with ``last_``; other values (a backoff delay, a count) are kept as they are.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from twisted.internet.interfaces import IReactorTime

logger = logging.getLogger("slotkit")

__all__ = ["ScopeStateStore"]

FILENAME = "slotkit-scopes.json"
VERSION = 2
#: Version 1 files hold times of the saving crawl's clock, taken as they are.
READABLE = (1, 2)


def is_time_key(key: str) -> bool:
    """Whether a saved state value under *key* is a time of the crawl's clock."""
    return key.endswith(("_at", "_until")) or key.startswith("last_")


class ScopeStateStore:
    """Reads and writes the saved scope states of one job directory."""

    def __init__(
        self,
        jobdir: str,
        clock: IReactorTime | None = None,
        wall: Callable[[], float] = time.time,  # noqa: TID251 - measures a pause between runs, never waits
    ) -> None:
        self.path = os.path.join(jobdir, FILENAME)
        #: The crawl's clock; without one, times are saved and loaded unchanged.
        self.clock = clock
        #: Wall-clock time, only to measure how long the crawl was paused.
        self.wall = wall

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
        if not isinstance(data, dict) or data.get("version") not in READABLE:
            return {}, {}
        shift = self._shift(data.get("saved_at"))
        scopes = {
            str(key): {
                str(k): float(v) + shift if is_time_key(str(k)) else float(v)
                for k, v in value.items()
            }
            for key, value in (data.get("scopes") or {}).items()
            if isinstance(value, dict)
        }
        delays = {str(key): float(value) for key, value in (data.get("crawl_delays") or {}).items()}
        return scopes, delays

    def save(self, scopes: dict[str, dict[str, float]], crawl_delays: dict[str, float]) -> None:
        """Write the states atomically (a crash mid-write leaves the old file)."""
        data: dict[str, Any] = {"version": VERSION, "scopes": scopes, "crawl_delays": crawl_delays}
        if self.clock is not None:
            data["saved_at"] = {"clock": self.clock.seconds(), "wall": self.wall()}
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as file:
                json.dump(data, file)
            os.replace(tmp, self.path)
        except OSError:
            logger.warning("slotkit: could not save scope states to %s", self.path, exc_info=True)

    def _shift(self, saved_at: object) -> float:
        """What to add to a saved time to put it on this crawl's clock."""
        if self.clock is None or not isinstance(saved_at, dict):
            return 0.0
        try:
            clock, wall = float(saved_at["clock"]), float(saved_at["wall"])
        except (KeyError, TypeError, ValueError):
            return 0.0
        if not (math.isfinite(clock) and math.isfinite(wall)):
            return 0.0
        # A wall clock set back while paused must not stretch the deadlines.
        paused = max(0.0, self.wall() - wall)
        return self.clock.seconds() - paused - clock
