"""The ``throttling/...`` stats and the warnings about waiting requests."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger("slotkit")

__all__ = ["ThrottlingStats"]

PREFIX = "throttling/"


class ThrottlingStats:
    """Counts what the gate did, into Scrapy's stats collector."""

    def __init__(self, stats: StatsCollector | None, warn_threshold: int) -> None:
        self._stats = stats
        self._warn_threshold = warn_threshold
        self._warned = False
        self.peak_waiting = 0

    def inc(self, name: str, count: float = 1) -> None:
        if self._stats is not None:
            self._stats.inc_value(PREFIX + name, count)  # type: ignore[arg-type]  # floats sum fine

    def set(self, name: str, value: float) -> None:
        if self._stats is not None:
            self._stats.set_value(PREFIX + name, value)

    def max(self, name: str, value: float) -> None:
        if self._stats is not None:
            self._stats.max_value(PREFIX + name, value)

    def waited(self, seconds: float) -> None:
        """A request was held back *seconds* before dispatch."""
        self.inc("requests_delayed")
        self.inc("wait_time_total", seconds)
        self.max("wait_time_max", seconds)

    def waiting(self, count: int) -> None:
        """*count* requests are now waiting at the gate."""
        if count > self.peak_waiting:
            self.peak_waiting = count
            self.set("waiting_peak", count)
        if self._warn_threshold and count >= self._warn_threshold and not self._warned:
            self._warned = True
            logger.warning(
                "%d requests are waiting for their throttling scopes "
                "(DELAYED_REQUESTS_WARN_THRESHOLD=%d). Requests that wait at the "
                "downloader hold CONCURRENT_REQUESTS slots; check THROTTLING_SCOPES or "
                "use a throttling-aware scheduler.",
                count,
                self._warn_threshold,
            )
