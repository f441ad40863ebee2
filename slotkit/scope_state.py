"""What a paused crawl (``JOBDIR``) keeps of a scope, and how it takes it back.

A base of :class:`~slotkit.scope.ThrottlingScopeManager`: the live state
machine is there, the saving and restoring of it here (stored by
:mod:`slotkit.persistence`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from slotkit.server_budget import ServerBudget

if TYPE_CHECKING:
    from slotkit.backoff import BackoffRules
    from slotkit.quota import Quota

__all__ = ["SavedScopeState"]


class SavedScopeState:
    """``export_state`` / ``import_state`` of the default scope manager."""

    if TYPE_CHECKING:
        # The attributes are ThrottlingScopeManager's, in its own __slots__.
        __slots__: tuple[str, ...]
        hold_until: float
        last_sent: float | None
        backoff_delay: float | None
        recovers_at: float
        quota: Quota | None
        server_budget: ServerBudget | None
        backoff: BackoffRules
        _factor: float
        _resumed: bool

        @property
        def current_delay(self) -> float: ...

        @property
        def running_gap(self) -> float: ...

        def _settle(self, now: float) -> None: ...

    else:
        __slots__ = ()  # a base without __slots__ would give every scope a __dict__

    def export_state(self, now: float) -> dict[str, float] | None:
        """What a resumed crawl must remember of this scope, or ``None`` if nothing."""
        self._settle(now)
        state: dict[str, float] = {}
        if self.hold_until > now:
            state["hold_until"] = self.hold_until
        # A gap still running after the last dispatch (a delay, a Crawl-delay)
        # must run on in the resumed crawl: its start is kept, so the resumed
        # crawl's own delay for the scope (the user may have changed it) ends it.
        last_sent = self.last_sent
        if last_sent is not None and last_sent + self.running_gap > now:
            state["last_sent"] = last_sent
        if self.backoff_delay is not None:
            state["backoff_delay"] = self.backoff_delay
            state["recovers_at"] = self.recovers_at
        if self.quota is not None:
            used, until = self.quota.snapshot(now)
            if used > 0 and until > now:
                state["quota_used"], state["quota_until"] = used, until
        budget = self.server_budget
        if budget is not None and budget.until > now:
            state["budget_left"], state["budget_until"] = budget.left, budget.until
        return state or None

    def import_state(self, state: dict[str, float], now: float) -> None:
        """Take over a state saved by :meth:`export_state`."""
        self.hold_until = max(self.hold_until, state.get("hold_until", -math.inf))
        if "last_sent" in state and (self.last_sent is None or state["last_sent"] > self.last_sent):
            self.last_sent = state["last_sent"]
            # The resumed crawl's first request opens a new connection: the gap
            # after it runs from its end, as after any scope's first request.
            self._resumed = True
        until = state.get("quota_until", -math.inf)
        if self.quota is not None and until > now and state.get("quota_used", 0.0) > 0:
            self.quota.spend(now, state["quota_used"], expires_in=until - now)
        if state.get("budget_until", -math.inf) > now and "budget_left" in state:
            # What the server said is left until its reset (requests in flight
            # at the pause counted as sent): a resumed crawl must not burst.
            self.server_budget = budget = ServerBudget()
            budget.left, budget.until = state["budget_left"], state["budget_until"]
            budget.early = budget.until
        if "backoff_delay" in state:
            self.backoff_delay = state["backoff_delay"]
            self.recovers_at = state.get("recovers_at", now + self.backoff.window)
            self._settle(now)
