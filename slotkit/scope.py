"""The default scope manager: one scope's throttling state, kept pure.

Time never comes from a clock here: every method that depends on it takes
``now``. That keeps the state machine deterministic under test and lets the
gate decide when to ask again.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

from zope.interface import implementer

from slotkit.backoff import BackoffConfig
from slotkit.interfaces import IThrottlingScopeManager
from slotkit.policy import Uniform, jitter_factor, next_backoff, recover
from slotkit.validation import NO_JITTER, Jitter, parse_jitter

if TYPE_CHECKING:
    from collections.abc import Mapping

    from typing_extensions import Self

__all__ = ["ThrottlingScopeManager"]


@implementer(IThrottlingScopeManager)
class ThrottlingScopeManager:
    """Concurrency, delay (with jitter) and hard holds for one scope.

    * **Concurrency**: at most ``concurrency`` requests in flight.
    * **Delay**: at least ``delay * (1 + uniform(low, high))`` seconds between
      two dispatches. The factor is drawn once per dispatch, so the answer of
      :meth:`can_send` does not change between two calls.
    * **Hold**: ``record_backoff(delay=...)`` forbids dispatches until a
      deadline that later calls can extend but never shorten.
    * **Backoff**: ``record_backoff()`` without a delay multiplies the current
      delay by ``delay_factor`` (at least ``min_delay``, at most
      ``max_delay``); during backoff the gap uses the backoff jitter. Each
      quiet ``window`` after the last trigger drops it one factor step, until
      the configured delay is back. Both kinds of trigger restart the
      countdown. Recovery is computed from ``now`` when asked, so it needs no
      timer; :meth:`can_send` never answers a wait that ends after the next
      recovery, so the gate re-asks then.
    """

    def __init__(
        self,
        concurrency: int,
        delay: float = 0.0,
        jitter: Jitter = NO_JITTER,
        min_concurrency: int = 1,
        rng: Uniform | None = None,
        backoff: BackoffConfig | None = None,
    ) -> None:
        self.min_concurrency = max(1, min_concurrency)
        self.concurrency = max(self.min_concurrency, concurrency)
        self.delay = delay
        self.jitter = jitter
        self.active = 0
        #: When the last request was dispatched (``None`` before the first).
        self.last_sent: float | None = None
        self.last_done: float | None = None
        self.hold_until = -math.inf
        self._rng: Uniform = rng if rng is not None else random.Random()
        self._factor = 1.0  # jitter factor drawn at the last dispatch
        self.backoff = backoff if backoff is not None else BackoffConfig()
        #: The backoff delay, or ``None`` when the scope is not backing off.
        self.backoff_delay: float | None = None
        #: When the backoff next drops one step (if no new trigger comes).
        self.recovers_at = math.inf
        self.last_trigger: float | None = None
        self.triggers = 0
        self.steps = 0
        self.recoveries = 0

    @classmethod
    def from_crawler(cls, crawler: Any, config: Mapping[str, Any]) -> Self:
        """Build the manager from a scope config dict (see :class:`~slotkit.settings.ScopeConfig`)."""
        return cls(
            concurrency=int(config.get("concurrency", 1)),
            delay=float(config.get("delay", 0.0)),
            jitter=parse_jitter("jitter", config.get("jitter", 0.0)),
            min_concurrency=int(config.get("min_concurrency", 1)),
            backoff=_backoff_from_dict(config.get("backoff")),
        )

    # IThrottlingScopeManager

    def can_send(self, now: float, amount: float | None = None) -> float:
        self._settle(now)
        if self.active >= self.concurrency:
            return math.inf
        wait = self.next_allowed - now
        if wait <= 0:
            return 0.0
        if wait > self.recovers_at - now and now >= self.hold_until:
            # A recovery step before then may shorten the gap: ask again at it.
            return max(self.recovers_at - now, 0.0)
        return wait

    def record_sent(self, now: float, amount: float | None = None) -> None:
        self._settle(now)
        self.active += 1
        self.last_sent = now
        self._factor = self._draw_factor()

    def record_done(self, now: float) -> None:
        self.active = max(0, self.active - 1)
        self.last_done = now

    def record_backoff(self, delay: float | None = None, now: float = 0.0) -> None:
        self._settle(now)
        self.triggers += 1
        self.last_trigger = now
        if delay is not None:
            if delay > 0:
                self.hold_until = max(self.hold_until, now + delay)
        else:
            config = self.backoff
            self.backoff_delay = next_backoff(
                self.current_delay, config.delay_factor, config.min_delay, config.max_delay
            )
            self.steps += 1
            # The gap already running is redrawn with the backoff jitter, so
            # requests that backed off together do not come back in lockstep.
            self._factor = self._draw_factor()
        if self.backoff_delay is not None and self.backoff.window > 0:
            self.recovers_at = now + self.backoff.window

    def reconcile_quota(
        self, consumed: float | None = None, remaining: float | None = None, now: float = 0.0
    ) -> None:
        """No quota in this release; kept so custom callers can rely on the method."""

    def set_base_delay(self, delay: float) -> None:
        self.delay = max(0.0, float(delay))

    def set_concurrency(self, concurrency: int) -> None:
        self.concurrency = max(self.min_concurrency, int(concurrency))

    def is_idle(self, now: float, max_idle: float) -> bool:
        self._settle(now)
        if self.active or self.backoff_delay is not None or now < self.next_allowed:
            return False
        last = max(self.last_sent or -math.inf, self.last_done or -math.inf)
        return now - last >= max_idle

    # Backoff bookkeeping

    def _settle(self, now: float) -> None:
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

    def _draw_factor(self) -> float:
        jitter = self.backoff.jitter if self.backoff_delay is not None else self.jitter
        return jitter_factor(jitter, self._rng)

    # Derived state

    @property
    def current_delay(self) -> float:
        """The delay in force: the configured one, or the backoff delay if larger."""
        if self.backoff_delay is None:
            return self.delay
        return max(self.delay, self.backoff_delay)

    @property
    def next_allowed(self) -> float:
        """The earliest time the next dispatch may happen (delay, backoff and hold)."""
        gap_end = (
            -math.inf if self.last_sent is None else self.last_sent + self.current_delay * self._factor
        )
        return max(gap_end, self.hold_until)

    def sample_delay(self) -> float:
        """A delay drawn with this scope's jitter (what ``Slot.download_delay()`` returns)."""
        return self.current_delay * self._draw_factor()

    def __repr__(self) -> str:
        backoff = "" if self.backoff_delay is None else f" backoff={self.backoff_delay:.2f}s"
        hold = "" if self.hold_until == -math.inf else f" hold_until={self.hold_until:.2f}"
        return (
            f"<{type(self).__name__} active={self.active}/{self.concurrency} "
            f"delay={self.delay:.2f}s{backoff}{hold}>"
        )


def _backoff_from_dict(raw: Any) -> BackoffConfig | None:
    """Rebuild a :class:`BackoffConfig` from the dict a scope config carries."""
    if not raw:
        return None
    from slotkit.backoff import scope_backoff

    overrides = {key: value for key, value in raw.items() if key != "window"}
    config = scope_backoff(BackoffConfig(), "backoff", overrides)
    if "window" in raw:
        from dataclasses import replace

        config = replace(config, window=float(raw["window"]))
    return config
