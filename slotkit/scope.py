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

from slotkit.backoff import BackoffConfig, backoff_from_dict
from slotkit.interfaces import IThrottlingScopeManager
from slotkit.policy import Uniform, jitter_factor, next_backoff, recover
from slotkit.quota import Quota
from slotkit.rampup import Rampup, RampupConfig, rampup_from_dict
from slotkit.scope_state import SavedScopeState
from slotkit.server_budget import ServerBudget
from slotkit.validation import NO_JITTER, Jitter, parse_jitter

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

__all__ = ["ThrottlingScopeManager"]

#: One generator for every scope: a Random() of its own would cost each scope
#: about 2.5 KB of state, more than the rest of the scope together.
SHARED_RNG = random.Random()

#: Module constants so that a new manager allocates nothing for them: the
#: expression ``-math.inf`` makes a new float each time, and ``BackoffConfig``
#: is frozen, so one default instance serves every scope.
NEVER = -math.inf
#: Seconds past its delay a scope waits for its first request to end before
#: sending the next one anyway: opening a connection (DNS, TCP, TLS) takes far
#: less, and a first request that hangs must not hold the scope until its
#: DOWNLOAD_TIMEOUT.
OPENING_ALLOWANCE = 1.0
DEFAULT_BACKOFF = BackoffConfig()


@implementer(IThrottlingScopeManager)
class ThrottlingScopeManager(SavedScopeState):
    """Concurrency, delay (with jitter) and hard holds for one scope.

    * **Concurrency**: at most ``concurrency`` requests in flight.
    * **Delay**: at least ``delay * (1 + uniform(low, high))`` seconds between
      two dispatches. The factor is drawn once per dispatch, so the answer of
      :meth:`~slotkit.interfaces.IThrottlingScopeManager.can_send` does not
      change between two calls.
    * **Hold**: ``record_backoff(delay=...)`` forbids dispatches until a
      deadline that later calls can extend but never shorten.
    * **Backoff**: ``record_backoff()`` without a delay multiplies the current
      delay by ``delay_factor`` (at least ``min_delay``, at most
      ``max_delay``); during backoff the gap uses the backoff jitter. Each
      quiet ``window`` after the last trigger drops it one factor step, until
      the configured delay is back. Both kinds of trigger restart the
      countdown. Recovery is computed from ``now`` when asked, so it needs no
      timer; :meth:`~slotkit.interfaces.IThrottlingScopeManager.can_send`
      never answers a wait that ends after the next recovery, so the gate
      re-asks then.
    """

    # A crawl may keep 100,000 of these: slots keep each one small.
    __slots__ = (
        "_ending",
        "_factor",
        "_opened",
        "_opening",
        "_resumed",
        "_rng",
        "active",
        "backoff",
        "backoff_delay",
        "concurrency",
        "delay",
        "hold_until",
        "jitter",
        "last_done",
        "last_sent",
        "last_trigger",
        "max_concurrency",
        "min_concurrency",
        "quota",
        "rampup",
        "recoveries",
        "recovers_at",
        "server_budget",
        "steps",
        "triggers",
    )

    def __init__(
        self,
        concurrency: int,
        delay: float = 0.0,
        jitter: Jitter = NO_JITTER,
        min_concurrency: int = 1,
        rng: Uniform | None = None,
        backoff: BackoffConfig | None = None,
        quota: float | None = None,
        window: float = 60.0,
        rampup: RampupConfig | None = None,
        *,
        opened: bool = False,
    ) -> None:
        # A broad crawl builds one manager per request (scope created, another
        # evicted), so this stays plain stores: no max(), no new objects.
        floor = min_concurrency if min_concurrency > 1 else 1
        self.min_concurrency = floor
        #: The ceiling rampup may raise concurrency to (the configured concurrency).
        self.max_concurrency = ceiling = concurrency if concurrency > floor else floor
        self.concurrency = ceiling
        self.quota = None if quota is None else Quota(quota, window)
        #: What the server said is left until its reset (see record_server_budget).
        self.server_budget: ServerBudget | None = None
        self.rampup = None if rampup is None else Rampup(rampup)
        if rampup is not None:
            # Rampup probes upwards: start at the floor, climb while the site allows.
            self.concurrency = floor
        self.delay = delay
        self.jitter = jitter
        self.active = 0
        #: Where the running gap starts (``None`` before the first dispatch):
        #: the last dispatch, or later (the first request's end, a backoff step).
        self.last_sent: float | None = None
        self.last_done: float | None = None
        self.hold_until = NEVER
        self._rng: Uniform = SHARED_RNG if rng is None else rng
        self._factor = 1.0  # jitter factor drawn at the last dispatch
        #: The scope's first request is in flight (see record_done).
        self._opening = False
        #: The scope's connections were open before this manager took over
        #: (the shared mode's fallback): its first request is no first one.
        self._opened = opened
        #: A saved gap was taken over (import_state): the next request is a first one.
        self._resumed = False
        #: Which request the next record_done is for (see record_ending).
        self._ending: tuple[float, float | None] | None = None
        self.backoff = DEFAULT_BACKOFF if backoff is None else backoff
        #: The backoff delay, or ``None`` when the scope is not backing off.
        self.backoff_delay: float | None = None
        #: When the backoff next drops one step (if no new trigger comes).
        self.recovers_at = math.inf
        self.last_trigger: float | None = None
        self.triggers = 0
        self.steps = 0
        self.recoveries = 0

    @classmethod
    def from_crawler(cls, crawler: Crawler, config: Any) -> Self:
        """Build the manager from a scope config dict (:meth:`ScopeConfig.as_dict`)."""
        return cls(
            concurrency=int(config.get("concurrency", 1)),
            delay=float(config.get("delay", 0.0)),
            jitter=parse_jitter("jitter", config.get("jitter", 0.0)),
            min_concurrency=int(config.get("min_concurrency", 1)),
            backoff=backoff_from_dict(config.get("backoff")),
            quota=config.get("quota"),
            window=float(config.get("window", 60.0)),
            rampup=rampup_from_dict(config.get("rampup")),
        )

    # IThrottlingScopeManager

    def can_send(self, now: float, amount: float | None = None) -> float:
        self._settle(now)
        if self.active >= self.concurrency:
            rampup = self.rampup
            if rampup is not None and self.concurrency < self.max_concurrency:
                # A rampup step at the window's end may raise the concurrency.
                return rampup.window_end - now  # > 0: _settle closed every ended window
            return math.inf
        next_allowed = self.next_allowed
        # The gap after a scope's first request runs from its end (see
        # record_done): counted from its send, a response slower than the
        # delay let the second request reach the server a few milliseconds
        # short of the delay after the first (probe: 4-7 ms). A first request
        # that hangs holds the scope only so long: by then its connection is
        # long open. Until the gap from its send has run, that gap is the
        # answer: a queue that remembers waits (ThrottlingAwarePriorityQueue)
        # asks again when it ends, and the first request has usually ended.
        if (
            self._opening
            and self.active
            and self.current_delay > 0
            and next_allowed <= now < next_allowed + OPENING_ALLOWANCE
        ):
            return next_allowed + OPENING_ALLOWANCE - now  # record_done pokes sooner
        wait = next_allowed - now
        if self.quota is not None:
            wait = max(wait, self.quota.wait(now, 1.0 if amount is None else amount))
        if self.server_budget is not None:
            wait = max(wait, self.server_budget.wait(now))
        if wait <= 0:
            return 0.0
        if now >= self.hold_until:
            # A recovery or rampup step before then may shorten the wait: ask again at it.
            wait = min(wait, max(self._next_change - now, 0.0))
        return wait

    def record_sent(self, now: float, amount: float | None = None) -> None:
        self._settle(now)
        self.active += 1
        if (self.last_sent is None and not self._opened) or self._resumed:
            self._opening = True
            self._resumed = False
        self.last_sent = now
        self._factor = self._draw_factor()
        if self.quota is not None:
            self.quota.start(now, 1.0 if amount is None else amount)
        if self.server_budget is not None:
            self.server_budget.record_sent(now)
        if self.rampup is not None:
            self.rampup.record_sent(now)

    def quota_available(self, now: float) -> float | None:
        """Quota units still free at *now*; ``None`` when the scope counts no quota.

        Read by :class:`~slotkit.pqueue.ThrottlingAwarePriorityQueue` to prefer,
        all else equal, the request that uses the larger share of what is left.
        """
        return None if self.quota is None else self.quota.remaining(now)

    def record_started(self, now: float) -> None:
        """The last dispatched request's transfer really began at *now*.

        Between the gate's decision and the download handler there is an
        event-loop hop of a fraction of a millisecond. Counting the gap from
        the later of the two keeps every gap seen by the handler (and the
        server) at least the delay. Moving the stamp later only ever delays
        the next dispatch.
        """
        if self.last_sent is not None and now > self.last_sent:
            self.last_sent = now

    def record_ending(self, sent_at: float, amount: float | None) -> None:
        """The next :meth:`record_done` is for the request dispatched at *sent_at*.

        The gate says so just before ``record_done`` (which the interface
        gives only ``now``): a quota unit stays counted until a window after
        its own request ended (see :mod:`slotkit.quota`), and requests end
        out of order. A subclass overriding ``record_done`` still gets it.
        """
        self._ending = (sent_at, amount)
        if self.server_budget is not None:
            self.server_budget.record_ended(sent_at)

    def record_done(self, now: float) -> None:
        ending, self._ending = self._ending, None
        self.active = max(0, self.active - 1)
        self.last_done = now
        if self._opening:
            # The scope's first request also resolved the host and opened the
            # connection, so it reached the server late; the next one, on that
            # open connection, would arrive less than the delay after it. So
            # the gap after a first request runs from its end (once a scope).
            self._opening = False
            if self.last_sent is not None and now > self.last_sent:
                self.last_sent = now
        if self.quota is not None:
            sent_at, amount = ending if ending is not None else (None, None)
            self.quota.finish(now, sent_at, 1.0 if amount is None else amount)

    def record_backoff(self, delay: float | None = None, now: float = 0.0) -> None:
        self._settle(now)
        self.triggers += 1
        self.last_trigger = now
        if self.rampup is not None:
            self.rampup.record_trigger()
        if delay is not None:
            if delay > 0:
                self.hold_until = max(self.hold_until, now + delay)
        elif self.rampup is not None and self.rampup.within_target():
            # Rampup aims at its target of triggers per window: that many is
            # the price of probing, so the rate holds (the window will not step
            # up either). Only triggers beyond the target back the scope off.
            pass
        elif self.rampup is not None and self.concurrency > self.min_concurrency:
            # Rampup raised the concurrency after the delay: a step beyond its
            # target takes that back first, one at a time. A site that limits
            # concurrent requests answers every extra one at once, and only
            # the delay would never stop that (min_concurrency is the floor).
            self.concurrency -= 1
            self.steps += 1
        else:
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
        if self.backoff_delay is not None and self.backoff.window > 0:
            self.recovers_at = now + self.backoff.window

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

    def set_base_delay(self, delay: float) -> None:
        self.delay = max(0.0, float(delay))

    def set_jitter(self, jitter: Jitter) -> None:
        """Use *jitter* from now on; the running gap's factor moves into its range."""
        self.jitter = jitter
        low, high = jitter
        self._factor = min(max(self._factor, 1.0 + low), max(0.0, 1.0 + high))

    def set_concurrency(self, concurrency: int) -> None:
        self.concurrency = max(self.min_concurrency, int(concurrency))
        self.max_concurrency = max(self.max_concurrency, self.concurrency)

    def is_idle(self, now: float, max_idle: float) -> bool:
        # Asked of the oldest scope at every scope creation: the common answer
        # (a plain idle scope) takes no property and no max().
        if self.backoff_delay is not None or self.rampup is not None:
            self._settle(now)  # nothing else to settle
        if self.active or self.backoff_delay is not None or now < self.hold_until:
            return False
        last_sent = self.last_sent
        if last_sent is not None and now < last_sent + self.delay * self._factor:
            return False  # the gap after the last dispatch still runs
        if self.quota is not None and self.quota.used(now) > 0:
            return False  # forgetting spent quota would let the next window overspend
        if self.server_budget is not None and now < self.server_budget.until:
            return False  # nor may a budget the server announced be forgotten before its reset
        last = self.last_done or NEVER
        if last_sent and last_sent > last:
            last = last_sent
        return now - last >= max_idle

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
            -math.inf
            if self.last_sent is None
            else self.last_sent + self.current_delay * self._factor
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
