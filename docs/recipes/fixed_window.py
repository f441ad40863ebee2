"""A scope manager that only counts a quota per fixed window (no delay, no backoff).

A scope whose config has no ``quota`` is not limited by it at all.
"""

from __future__ import annotations

import math
from typing import Any

from zope.interface import implementer

from slotkit.interfaces import IThrottlingScopeManager


@implementer(IThrottlingScopeManager)
class FixedWindowScopeManager:
    """Lets ``quota`` units through per window; the window opens with its first request."""

    def __init__(self, quota: float | None, window: float = 60.0) -> None:
        self.quota = math.inf if quota is None else quota
        self.window = window
        self.window_ends = -math.inf
        self.spent = 0.0
        self.in_flight = 0

    @classmethod
    def from_crawler(cls, crawler: Any, config: dict[str, Any]) -> FixedWindowScopeManager:
        return cls(config.get("quota"), config.get("window", 60.0))

    def _roll(self, now: float) -> None:
        if now >= self.window_ends:
            self.window_ends, self.spent = -math.inf, 0.0

    def can_send(self, now: float, amount: float | None) -> float:
        self._roll(now)
        if self.spent and self.spent + (amount or 1.0) > self.quota:
            return self.window_ends - now
        return 0.0

    def record_sent(self, now: float, amount: float | None) -> None:
        self._roll(now)
        if self.window_ends == -math.inf:
            self.window_ends = now + self.window
        self.spent += amount or 1.0
        self.in_flight += 1

    def record_done(self, now: float) -> None:
        self.in_flight = max(0, self.in_flight - 1)

    def record_backoff(self, delay: float | None, now: float) -> None:
        """This manager ignores backoff: the quota is the only limit."""

    def reconcile_quota(self, consumed: float | None, remaining: float | None, now: float) -> None:
        if self.quota == math.inf:
            return  # no quota: nothing to correct
        if remaining is not None:
            self.spent = max(0.0, self.quota - remaining)
        elif consumed is not None:
            self.spent = max(0.0, self.spent + consumed)

    def set_base_delay(self, delay: float) -> None:
        """No delay to set."""

    def set_concurrency(self, concurrency: int) -> None:
        """No concurrency limit to set."""

    def is_idle(self, now: float, max_idle: float) -> bool:
        self._roll(now)
        return self.in_flight == 0 and self.spent == 0.0
