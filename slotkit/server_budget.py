"""What a server says is left of its request count until its reset.

A response with ``RateLimit-Remaining: 3`` and a reset in 10 s says: three
more requests until then. Requests sent after that response's request left
are not in the server's figure yet, so they come off it. Until the reset,
a scope sends only what is left; after it, the budget is unknown again
until a response states a new one. Without this, a scope whose concurrency
exceeds what the server has left sent the rest into 429s, once per server
window (a probe: 29 of 149 requests at concurrency 8), and a quota shared
with another client was counted by slotkit's own sliding window only.

Each request counts as one: the headers count requests, whatever amount
the request spends in a configured quota.

Resets come in whole seconds, so an answer only bounds the moment the
server's window ends: by its arrival plus the reset at the latest. The
latest bound of a window's answers is when it has surely ended; the
earliest is when it may have. From the earliest, a scope that has spent
its budget sends one request to ask (a probe): an answer that shows
requests left starts the next window at once. Without this, an API
allowing 10 requests per 1 s window with 0.2 s answers got 6 requests per
second. A probe sent too early takes no further one until the latest bound.
No bound is carried from one window to the next: many servers begin a
window with its first request, not on the clock.

A probe's answer starts the next window, but not its end: a sliding
window's reset is when its next entry expires (12 ms, in a probe), and
its whole limit is not back then; the latest bound stands. Probes ask only
a server that stated its limit (see :meth:`ServerBudget._may_ask`).
"""

from __future__ import annotations

import bisect
import contextlib
import math

__all__ = ["ServerBudget"]

#: Dispatches remembered to tell how many left after a given one: about the
#: requests a scope can have in flight. An answer to a request older than the
#: oldest one remembered counts every remembered one as later (safe side).
HISTORY = 128
#: Resets this close together are taken for the same server window (the
#: headers give whole seconds).
SAME_WINDOW = 1.0


class ServerBudget:
    """Requests a scope may still send before the server's count resets.

    Created when a scope's first budget is learnt (most scopes never get
    one), so its dispatch history starts then. When the server also stated
    its limit, a reset starts a new budget of that limit for as long as the
    window it last announced (a fresh window), so the scope does not send a
    burst of its whole concurrency into a window it knows the size of.
    """

    __slots__ = (
        "basis",
        "early",
        "left",
        "limit",
        "span",
        "until",
        "_flying",
        "_asked",
        "_opened_at",
        "_probe_at",
        "_sent",
    )

    def __init__(self) -> None:
        #: Requests the server will still take before :attr:`until`.
        self.left = math.inf
        #: When the server's count resets (the budget is unknown from then on).
        self.until = -math.inf
        #: The earliest moment the server's count may reset (a probe may go).
        self.early = -math.inf
        #: The server's limit per window, if it said (the budget after a reset).
        self.limit: float | None = None
        #: The longest reset announced for the current window: about its length.
        self.span = 0.0
        #: When the request whose answer set the current window was sent.
        self.basis = -math.inf
        #: Recent dispatch times, oldest first.
        self._sent: list[float] = []
        #: Dispatch times of the requests still in flight.
        self._flying: list[float] = []
        #: When the request asking whether the window ended left (``None``: none out).
        self._probe_at: float | None = None
        #: When the current window began, if a reset or a probe began it:
        #: answers to requests sent before then are about the window before.
        self._opened_at = -math.inf
        #: Whether a probe of this window came too early (no other one then).
        self._asked = False

    def record_sent(self, now: float) -> None:
        """A request of the scope left at *now*."""
        self._flying.append(now)
        sent = self._sent
        sent.append(now)
        if len(sent) > 2 * HISTORY:
            del sent[:-HISTORY]
        self._roll(now)
        if now < self.until:
            if self.left < 1 and self._may_ask(now):
                self._probe_at = now
            self.left -= 1

    def record_ended(self, sent_at: float) -> None:
        """The request of the scope dispatched at *sent_at* ended."""
        with contextlib.suppress(ValueError):  # not found: sent before this budget existed
            self._flying.remove(sent_at)

    def learn(
        self,
        remaining: float,
        reset: float,
        sent_at: float,
        now: float,
        active: int,
        limit: float | None = None,
    ) -> bool:
        """A response to a request sent at *sent_at* says *remaining* are left for *reset* s.

        *active* counts the scope's requests in flight, this one included:
        until the history covers *sent_at*, all the others count as sent
        after it (on the safe side). Returns whether the answer was taken
        (``False``: it was about a window that has ended, or names none).
        """
        if not (math.isfinite(remaining) and math.isfinite(reset)) or reset <= 0:
            return False  # no window to budget (a reset of 0 is already over)
        sent = self._sent
        if sent and sent[0] <= sent_at:
            since = len(sent) - bisect.bisect_right(sent, sent_at)
            # Requests that left in the same reactor turn share its time. One
            # already answered was counted before this one (its answer said
            # more was left) or after (its own answer was the tighter figure):
            # only those still in flight may be missing from this figure.
            since += max(0, self._flying.count(sent_at) - 1)
        else:
            since = len(sent) + max(0, active - 1)
        left = remaining - max(0, since)
        until = now + reset
        # A limit below one request (X-RateLimit-Limit: 0.5) would open every
        # new window with less than a request to spend: the site would stop.
        self.limit = limit if limit is not None and limit >= 1 else self.limit
        self._roll(now)
        if sent_at == self._probe_at and now < self.until:
            # The probe's answer.
            self._probe_at = None
            if left >= 1:
                # Some left after a spent budget: the server's window ended.
                # (Its end one window on is no bound for the next one's: a
                # window may begin with its first request, as this probe's.)
                # Its latest bound stands: a sliding window's short reset (the
                # next entry to expire) must not roll a whole limit in early.
                latest = max(until, self.until)
                self._start(left, latest, max(self.span, reset), sent_at, early=until)
                self._opened_at = sent_at
                return True
            # Too early: no other probe in this window, whose end it bounds anew.
            self._tighten(left, until)
            self.early = self.until
            self._asked = True
            return True
        if sent_at < self._opened_at and now < self.until:
            # About the window before the one a reset or a probe began (a probe
            # answered after the reset, too): its end says nothing of this
            # one's, and its reset is no window length, but its count is a
            # safe side (a sliding window refills only part: a probe's
            # rolled-in limit sent 12 of 60 requests into 429s without it; a
            # review saw 227 429s where such an answer replaced the window).
            self._tighten(left, until)
            return True
        if now < self.until and abs(until - self.until) <= SAME_WINDOW:
            # The same window: the tighter figure wins (responses come back
            # out of order, and resets are given in whole seconds).
            self._tighten(left, until)
            # (After a probe that came too early, only the latest bound.)
            self.early = self.until if self._asked else min(self.early, until)
            self.span = max(self.span, reset)
            self.basis = max(self.basis, sent_at)
            return True
        if now >= self.until or sent_at > self.basis:
            # Another window, told by an answer to a request sent after the
            # one that set the current window (a penalty's long reset ended,
            # or the server counts afresh): it replaces the current one.
            self._start(left, until, reset, sent_at)
            return True
        return False  # a late answer from a window that has ended since

    def wait(self, now: float) -> float:
        """Seconds until the scope may send one more request (``0.0``: now)."""
        self._roll(now)
        if now >= self.until or self.left >= 1:
            return 0.0
        if self._may_ask(max(now, self.early)):
            return max(0.0, self.early - now)  # then one request may ask
        return self.until - now

    def _may_ask(self, now: float) -> bool:
        """Whether a request may go at *now* to ask if the window has ended.

        Only of a server that stated its limit: without one, the budget is
        unknown past the latest bound, and the requests asking meanwhile
        are in a sliding window's log then (a probe: 8 of 120 answered 429).
        """
        return (
            self.limit is not None
            and self._probe_at is None
            and self.early <= now
            and self.early < self.until
        )

    def _tighten(self, left: float, until: float) -> None:
        """Another answer about the current window: the fewer left, the later end."""
        self.left = min(self.left, left)
        self.until = max(self.until, until)

    def _start(
        self, left: float, until: float, span: float, sent_at: float, early: float | None = None
    ) -> None:
        """A new window, as an answer told it (*early*: its earliest end, if not *until*)."""
        self.left, self.until, self.span, self.basis = left, until, span, sent_at
        self.early = until if early is None else early
        self._probe_at = None
        self._opened_at = -math.inf
        self._asked = False

    def _roll(self, now: float) -> None:
        """Past the reset, a server that stated its limit starts a fresh window."""
        if now < self.until or self.limit is None or self.span <= 0:
            return
        if not math.isfinite(self.until):
            return
        # Windows missed entirely (no request for a while) are skipped.
        missed = math.floor((now - self.until) / self.span)
        self._opened_at = self.until + missed * self.span
        self._asked = False
        self.until += (missed + 1) * self.span
        self.early = math.inf  # until an answer bounds this window's end
        # A probe still out was sent since the earliest end: it may count here.
        self.left = self.limit - (self._probe_at is not None)
        self._probe_at = None
