"""Quota bookkeeping for one scope: at most ``quota`` units in any ``window``.

The window slides, and a unit is counted from its request's dispatch until
``window`` seconds after that request *finished* (its response came back or
it failed). A server counts a request when it arrives, which is somewhere
between those two moments; counting the unit until a window after the later
one means no interval of ``window`` seconds at the server ever holds more
than ``quota`` units, whatever windows the server counts in (fixed, aligned
to the first request, or sliding) and however long the first request took
to connect. The price is the response time, once per window: over a long
crawl the quota is spent at ``quota`` per ``window + latency``.

A request larger than the whole quota is let through alone (when nothing
else is counted), instead of waiting forever. What the server reports can
only tighten the count (see ``ThrottlingScopeManager.reconcile_quota``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slotkit.registry import Scope

__all__ = ["Quota", "quota_head_start"]

#: Float slack when comparing unit sums.
EPSILON = 1e-9


def _expiry(entry: tuple[float, float]) -> float:
    return entry[0]


class Quota:
    """A sliding-window quota, fed ``now`` by its scope manager."""

    __slots__ = ("limit", "window", "reset_at", "_entries", "_in_flight", "_used")

    def __init__(self, limit: float, window: float) -> None:
        self.limit = limit
        self.window = window
        #: ``(expires_at, amount)`` in expiry order: units whose request finished.
        self._entries: deque[tuple[float, float]] = deque()
        #: ``(sent_at, amount)`` of requests still in flight, in dispatch order;
        #: their units expire only once the request finished.
        self._in_flight: list[tuple[float, float]] = []
        self._used = 0.0
        #: When the server's count resets, as the report being applied says (one use).
        self.reset_at: float | None = None

    def used(self, now: float) -> float:
        """Units counted in the window ending at *now* (in flight included)."""
        self._expire(now)
        return max(0.0, self._used)

    def remaining(self, now: float) -> float:
        """Units that still fit in the window ending at *now*."""
        return max(0.0, self.limit - self.used(now))

    def wait(self, now: float, amount: float) -> float:
        """Seconds until *amount* more units fit.

        ``0.0``: now. ``math.inf``: not before a request in flight ends.
        """
        self._expire(now)
        if self._used <= 0.0:
            return 0.0  # an empty window admits anything, even an oversized request
        excess = self._used + amount - self.limit
        if excess <= EPSILON:
            return 0.0
        freed = 0.0
        for expires_at, entry in self._entries:
            freed += entry
            # With slack: the running total and the entries' sum differ by
            # rounding (13.0 against 12.999999999999998 in a probe), and an
            # exact test let an oversized request go while units were counted.
            if freed >= excess - EPSILON or self._used - freed <= EPSILON:
                return max(0.0, expires_at - now)
        if self._in_flight:
            return math.inf  # what is left to free is in flight: known once it ends
        # Only rounding is left: everything counted is free once the last entry expires.
        return max(0.0, self._entries[-1][0] - now) if self._entries else 0.0

    def start(self, now: float, amount: float) -> None:
        """A request spending *amount* units was dispatched at *now*."""
        self._in_flight.append((now, amount))
        self._used += amount

    def finish(self, now: float, sent_at: float | None = None, amount: float | None = None) -> None:
        """A request dispatched at *sent_at* ended at *now*: its units expire a window later.

        Without *sent_at* (a caller that cannot tell which request ended) the
        oldest request in flight is taken.
        """
        in_flight = self._in_flight
        if not in_flight:
            return
        index = 0
        if sent_at is not None:
            index = next(
                (
                    i
                    for i, (started, spent) in enumerate(in_flight)
                    if started == sent_at and (amount is None or spent == amount)
                ),
                0,
            )
        _, spent = in_flight.pop(index)
        self._used -= spent
        self.spend(now, spent)

    def spend(self, now: float, amount: float, expires_in: float | None = None) -> None:
        """Count *amount* units (negative: a refund, see _refund) for one window from *now*."""
        expires_at = now + (self.window if expires_in is None else expires_in)
        entries = self._entries
        if entries and expires_at < entries[-1][0]:
            # Shorter-lived units (a server's reset) go in expiry order: pushed
            # back to the last expiry, a 2 s reset would hold for a window.
            index = bisect.bisect_right(entries, expires_at, key=_expiry)
            entries.insert(index, (expires_at, amount))
        else:
            entries.append((expires_at, amount))
        self._used += amount

    def reconcile(self, now: float, consumed: float | None, remaining: float | None) -> None:
        """Correct the count with what the server reports.

        *remaining* only ever tightens the local count: the local sliding
        window already counts every request sent, including those still in
        flight that the server's figure does not include yet, so resetting to
        the server's figure would let each window overspend by the requests
        in flight (measured: 23 per window against a limit of 20 at
        concurrency 4). *consumed* adds units, or gives back up to those
        counted.

        Units the server counts beyond the local ones stay counted one
        window, except when the server says its quota is spent and when it
        resets (:attr:`reset_at`, set just before): they expire then, instead
        of holding a 60 s window for a 2 s reset.
        """
        reset_at, self.reset_at = self.reset_at, None
        if remaining is not None:
            deficit = (self.limit - remaining) - self.used(now)
            if deficit > 0:
                expires_in = None
                if remaining <= 0 and reset_at is not None and reset_at > now:
                    expires_in = min(self.window, reset_at - now)
                self.spend(now, deficit, expires_in)
        elif consumed and consumed > 0:
            self.spend(now, consumed)
        elif consumed:
            self._refund(now, -consumed)

    def _refund(self, now: float, amount: float) -> None:
        """Give back up to *amount* counted units, never taking the count below zero.

        First those of requests in flight (the response being reconciled is
        usually one of them), as a negative entry: it expires a window from
        now, before their units do (a window after they end). The rest off
        the counted entries, newest first, past the units earlier negative
        entries already cancel, so it expires with them. A negative entry
        that outlived the units it cancelled took the count below zero, and
        a window below zero admits any amount: a burst (a review).
        """
        self._expire(now)
        amount = min(amount, max(0.0, self._used))
        entries = self._entries
        cancelled = -sum(units for _, units in entries if units < 0)
        in_flight = sum(units for _, units in self._in_flight)
        first = min(amount, max(0.0, in_flight - cancelled))
        if first > 0:
            self.spend(now, -first)
            amount -= first
            cancelled += first
        # The newest counted units stand for those of requests that were in
        # flight when a negative entry was made: they end last.
        keep = max(0.0, cancelled - in_flight)
        index = len(entries) - 1
        while amount > 0 and index >= 0:
            expires_at, units = entries[index]
            index -= 1
            if units <= 0:
                continue
            kept = min(units, keep)
            keep -= kept
            taken = min(units - kept, amount)
            if taken > 0:
                entries[index + 1] = (expires_at, units - taken)
                self._used -= taken
                amount -= taken

    def snapshot(self, now: float) -> tuple[float, float]:
        """Units counted at *now*, and when the last of them expires (for ``JOBDIR``).

        A request still in flight counts as ending now. One figure for all
        the units errs on the safe side: a resumed crawl gets them back
        together, when the last would have expired.
        """
        self._expire(now)
        until = self._entries[-1][0] if self._entries else now
        if self._in_flight:
            until = max(until, now + self.window)
        return max(0.0, self._used), until

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries and entries[0][0] <= now:
            self._used -= entries.popleft()[1]
        if not entries and not self._in_flight:
            self._used = 0.0  # drop float drift once the window is empty


def quota_head_start(scopes: Sequence[Scope], amounts: Sequence[float | None]) -> float:
    """How many seconds earlier than its arrival a waiter counts, for the quota it spends.

    The spec asks that, all else equal, the request spending the larger
    portion of a quota goes first. The gate gives it a head start of
    ``amount / quota * window``: the time its units take to come back at the
    quota's own rate. A bounded head start, not a strict preference, so a
    stream of big spenders cannot keep a small request waiting for ever.
    Only scopes counted by slotkit's own manager (a :class:`Quota`) count.
    """
    head_start = 0.0
    for scope, amount in zip(scopes, amounts, strict=True):
        quota = getattr(scope.manager, "quota", None)
        if isinstance(quota, Quota) and quota.limit > 0:
            spent = 1.0 if amount is None else amount
            head_start = max(head_start, spent / quota.limit * quota.window)
    return head_start
