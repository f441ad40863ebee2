"""Quota bookkeeping for one scope: at most ``quota`` units in any ``window``.

The window slides: every dispatch is remembered until ``window`` seconds
after it happened, so no interval of ``window`` seconds ever holds more than
``quota`` units. That guarantee holds whatever fixed windows the server
counts in, which a window started at our first request cannot promise; over
a long crawl the quota is still spent in full.

A request larger than the whole quota is let through alone (when nothing
else is counted), instead of waiting forever. What the server reports can
only tighten the count (see ``ThrottlingScopeManager.reconcile_quota``).
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["Quota"]


class Quota:
    """A sliding-window quota, fed ``now`` by its scope manager."""

    __slots__ = ("limit", "window", "_entries", "_used")

    def __init__(self, limit: float, window: float) -> None:
        self.limit = limit
        self.window = window
        #: ``(expires_at, amount)`` in expiry order.
        self._entries: deque[tuple[float, float]] = deque()
        self._used = 0.0

    def used(self, now: float) -> float:
        """Units counted in the window ending at *now*."""
        self._expire(now)
        return max(0.0, self._used)

    def wait(self, now: float, amount: float) -> float:
        """Seconds until *amount* more units fit (0.0: now)."""
        self._expire(now)
        if self._used <= 0.0:
            return 0.0  # an empty window admits anything, even an oversized request
        excess = self._used + amount - self.limit
        if excess <= 1e-9:
            return 0.0
        freed = 0.0
        for expires_at, entry in self._entries:
            freed += entry
            if freed >= excess - 1e-9 or self._used - freed <= 0.0:
                return max(0.0, expires_at - now)
        return max(0.0, self._entries[-1][0] - now) if self._entries else 0.0

    def spend(self, now: float, amount: float, expires_in: float | None = None) -> None:
        """Count *amount* units (negative gives units back) for one window."""
        expires_at = now + (self.window if expires_in is None else expires_in)
        if self._entries and expires_at < self._entries[-1][0]:
            expires_at = self._entries[-1][0]  # keep expiry order; errs on the safe side
        self._entries.append((expires_at, amount))
        self._used += amount

    def reset_to(self, now: float, used: float, expires_in: float | None = None) -> None:
        """Forget the local count: the server says *used* units are spent in its window."""
        self._entries.clear()
        self._used = 0.0
        if used > 0:
            self.spend(now, used, expires_in)

    def remaining(self, now: float) -> float:
        return max(0.0, self.limit - self.used(now))

    def next_expiry(self) -> float:
        return self._entries[0][0] if self._entries else math.inf

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries and entries[0][0] <= now:
            self._used -= entries.popleft()[1]
        if not entries:
            self._used = 0.0  # drop float drift once the window is empty
