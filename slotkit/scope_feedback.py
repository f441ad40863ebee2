"""What the server says to one scope: backoff, its recovery, and the server's counts.

A base of :class:`~slotkit.scope.ThrottlingScopeManager`, and the scope's side
of :mod:`slotkit.feedback`: a trigger or a hold (``record_backoff``), the
recovery a quiet window after it (with rampup's window steps, settled at the
same moments), and the counts a server reports (quota corrections, the budget
until its reset). The state machine that dispatches is there, what responses
do to it here; both take ``now`` as an argument, never a clock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from slotkit.policy import next_backoff, recover
from slotkit.rampup import window_holds_more
from slotkit.server_budget import ServerBudget

if TYPE_CHECKING:
    from slotkit.backoff import BackoffRules
    from slotkit.quota import Quota
    from slotkit.rampup import Rampup

__all__ = ["ScopeFeedback", "quiet_window_end"]


def quiet_window_end(now: float, next_allowed: float, window: float) -> float:
    """When a scope triggered at *now* recovers one step, if nothing triggers it again.

    Normally a full *window* after the trigger. But a window in which the
    scope may not send at all (its backoff gap or a hold runs past it) is not
    quiet, only idle: counting it, a delay longer than the window stepped back
    down before its next request went, so with the defaults (window 60 s,
    ``max_delay`` 300 s) a dead site was asked every 60 s and the cap was never
    reached (a probe: gaps 1, 2, ... 32, 60, 60, 60). The countdown then starts
    when the scope may send again.
    """
    if next_allowed <= now + window:
        return now + window
    return next_allowed + window


class ScopeFeedback:
    """Backoff, recovery and server counts of the default scope manager."""

    if TYPE_CHECKING:
        # The attributes are ThrottlingScopeManager's, in its own __slots__.
        __slots__: tuple[str, ...]
        active: int
        concurrency: int
        min_concurrency: int
        max_concurrency: int
        delay: float
        hold_until: float
        last_sent: float | None
        backoff: BackoffRules
        backoff_delay: float | None
        recovers_at: float
        last_trigger: float | None
        triggers: int
        steps: int
        recoveries: int
        rampup: Rampup | None
        quota: Quota | None
        server_budget: ServerBudget | None
        _factor: float

        @property
        def current_delay(self) -> float: ...

        @property
        def next_allowed(self) -> float: ...

        def _draw_factor(self) -> float: ...

        def _clamp_factor(self) -> None: ...

    else:
        __slots__ = ()  # a base without __slots__ would give every scope a __dict__

    # What a response tells the scope (see slotkit.feedback)

    def record_backoff(self, delay: float | None = None, now: float = 0.0) -> None:
        self._record_backoff(delay, now, may_step=True)

    def record_stale_hint(self, delay: float, now: float) -> None:
        """A hint answering a request sent before the scope's current step or
        hold: it holds (and counts) like any, but takes no step, whatever
        rampup's target says: its burst was answered already. An optional
        hook, not in the interface (see :meth:`slotkit.feedback.Feedback`)."""
        self._record_backoff(delay, now, may_step=False)

    def _record_backoff(self, delay: float | None, now: float, *, may_step: bool) -> None:
        self._settle(now)
        self.triggers += 1
        self.last_trigger = now
        if self.rampup is not None:
            self.rampup.record_trigger()
        held = now < self.hold_until  # by an earlier hint: the same burst
        if delay is not None and delay > 0:
            self.hold_until = max(self.hold_until, now + delay)
        if self._takes_step(delay, held=held, may_step=may_step):
            self._step(now)
        if self.backoff_delay is not None and self.backoff.window > 0:
            self.recovers_at = quiet_window_end(now, self.next_allowed, self.backoff.window)

    def _takes_step(self, delay: float | None, *, held: bool, may_step: bool) -> bool:
        """Whether a trigger (with the server's *delay*, if it gave one) backs off a step."""
        rampup = self.rampup
        if delay is not None:
            # A hint holds the scope and takes no step (the specification),
            # except beyond a rampup scope's target: there the hints say that
            # rampup's own probing went too far, and a hold alone would let the
            # same rate run into the limit again right after it (18% of a
            # server's limit measured, 1.8 hinted 429s per window for a target
            # of 1). One step per burst: its other answers come while the
            # scope is held, or answer requests sent before the hold began.
            return not held and may_step and rampup is not None and not rampup.within_target()
        # Rampup aims at its target of triggers per window: that many is the
        # price of probing, so the rate holds (the window will not step up
        # either). Only triggers beyond the target back the scope off.
        return not (
            rampup is not None
            and rampup.within_target()
            and window_holds_more(self.current_delay, rampup.config.target[1], rampup.config.window)
        )

    def _step(self, now: float) -> None:
        """One backoff step."""
        if self.rampup is not None and self.concurrency > self.min_concurrency:
            # Rampup raised the concurrency after the delay: a step beyond its
            # target takes that back first, one at a time. A site that limits
            # concurrent requests answers every extra one at once, and only
            # the delay would never stop that (min_concurrency is the floor).
            self.concurrency -= 1
            self.steps += 1
            return
        config = self.backoff
        self.backoff_delay = next_backoff(
            self.current_delay, config.delay_factor, config.min_delay, config.max_delay
        )
        self.steps += 1
        # The gap already running is redrawn with the backoff jitter, so
        # requests that backed off together do not come back in lockstep.
        self._factor = self._draw_factor()
        # ... and it runs from the trigger: counted from the failed
        # request's dispatch, a timeout longer than the backoff delay
        # left nothing of it (a probe saw a 0.25 s timeout retried
        # 0.15 s after it failed, with a backoff delay of 0.4 s).
        if self.last_sent is not None and now > self.last_sent:
            self.last_sent = now

    def reconcile_quota(
        self, consumed: float | None = None, remaining: float | None = None, now: float = 0.0
    ) -> None:
        """Correct the quota count with what the server reports (see :meth:`Quota.reconcile`)."""
        if self.quota is not None:
            self.quota.reconcile(now, consumed, remaining)

    def record_quota_reset(self, reset: float, now: float) -> None:
        """The server's quota count resets *reset* seconds after *now*.

        Said just before a :meth:`reconcile_quota` with the same report (an
        optional hook, not in the interface): an uncapped figure, unlike the
        hold the same reset puts on the scope, which ``max_delay`` caps.
        """
        if self.quota is not None:
            self.quota.reset_at = now + reset

    def record_server_budget(
        self,
        remaining: float,
        reset: float,
        sent_at: float,
        now: float,
        limit: float | None = None,
    ) -> bool:
        """A response to the request sent at *sent_at* says the server takes
        *remaining* more requests in the *reset* seconds after *now* (and
        *limit* per window after that, if it said).

        An optional hook (not part of the interface): until then the scope
        sends only what is left (see :mod:`slotkit.server_budget`). Returns
        whether the answer was taken (not one about a window that has ended).
        """
        if self.server_budget is None:
            self.server_budget = ServerBudget()
        return self.server_budget.learn(remaining, reset, sent_at, now, self.active, limit)

    # Backoff bookkeeping

    @property
    def _next_change(self) -> float:
        """When recovery or rampup may next change the rate on their own."""
        rampup_end = math.inf if self.rampup is None else self.rampup.window_end
        return min(self.recovers_at, rampup_end)

    def _settle(self, now: float) -> None:
        """Apply the recovery and rampup steps due by *now*."""
        if self.backoff_delay is not None:  # checked here: most scopes never back off
            self._recover(now)
        if self.rampup is not None and now >= self.rampup.window_end:
            step = self.rampup.settle(
                now,
                self.delay,
                self.concurrency,
                self.max_concurrency,
                self.backoff_delay is not None,
            )
            self.delay, self.concurrency = step.delay, step.concurrency

    def _recover(self, now: float) -> None:
        """Apply the recovery steps due by *now* (one per quiet window)."""
        config = self.backoff
        while self.backoff_delay is not None and now >= self.recovers_at:
            self.backoff_delay = recover(
                self.backoff_delay, config.delay_factor, config.min_delay, self.delay
            )
            self.recoveries += 1
            self.recovers_at = (
                math.inf if self.backoff_delay is None else self.recovers_at + config.window
            )
        if self.backoff_delay is None:  # just recovered (only called while backing off)
            # The gap running now was drawn with the backoff jitter (±10 % by
            # default); on the configured delay it would end early, below a
            # robots.txt Crawl-delay or a DOWNLOAD_DELAY without jitter.
            self._clamp_factor()
