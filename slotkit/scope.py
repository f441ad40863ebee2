"""The default scope manager: one scope's throttling state, kept pure.

Time never comes from a clock here: every method that depends on it takes
``now``. That keeps the state machine deterministic under test and lets the
gate decide when to ask again. Two bases hold the rest of it: what the
server's answers do to a scope (backoff, recovery, quota and budget reports)
in :mod:`slotkit.scope_feedback`, what a paused crawl keeps of it in
:mod:`slotkit.scope_state`.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from zope.interface import implementer

from slotkit.backoff import BackoffRules, backoff_from_dict
from slotkit.interfaces import IThrottlingScopeManager
from slotkit.policy import Uniform, jitter_factor
from slotkit.quota import Quota
from slotkit.rampup import Rampup, RampupConfig, rampup_from_dict
from slotkit.scope_feedback import ScopeFeedback
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
#: expression ``-math.inf`` makes a new float each time, and ``BackoffRules``
#: is frozen, so one default instance serves every scope.
NEVER = -math.inf
#: Seconds past its delay a scope waits for its first request to end before
#: sending the next one anyway: opening a connection (DNS, TCP, TLS) takes far
#: less, and a first request that hangs must not hold the scope until its
#: DOWNLOAD_TIMEOUT.
OPENING_ALLOWANCE = 1.0
DEFAULT_BACKOFF = BackoffRules()


@implementer(IThrottlingScopeManager)
class ThrottlingScopeManager(ScopeFeedback, SavedScopeState):
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
        backoff: BackoffRules | None = None,
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
        if rampup is not None and rampup.window <= 0:
            rampup = None  # BACKOFF_WINDOW = 0: no windows, so no rampup (the configured rate)
        self.rampup = None if rampup is None else Rampup(rampup)
        if rampup is not None:
            # Rampup probes upwards: start at the floor, climb while the site allows.
            self.concurrency = floor
            # ... never faster than its min_delay: a delay below it (DOWNLOAD_DELAY's
            # 0) would leave the rate unbounded however high the concurrency climbs.
            if delay < rampup.min_delay:
                delay = rampup.min_delay
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

    def set_base_delay(self, delay: float) -> None:
        self.delay = max(0.0, float(delay))

    def set_jitter(self, jitter: Jitter) -> None:
        """Use *jitter* from now on; the running gap's factor moves into its range."""
        self.jitter = jitter
        self._clamp_factor()

    def _clamp_factor(self) -> None:
        """Move the running gap's factor into the range of this scope's own jitter."""
        low, high = self.jitter
        self._factor = min(max(self._factor, 1.0 + low), max(0.0, 1.0 + high))

    def set_concurrency(self, concurrency: int) -> None:
        limit = max(self.min_concurrency, int(concurrency))
        if self.rampup is not None:
            # The new limit is the ceiling rampup climbs to, not where it is
            # now: jumping there would skip the probing (robots.txt's 1 too).
            self.max_concurrency = limit
            self.concurrency = min(self.concurrency, limit)
            return
        self.concurrency = limit
        self.max_concurrency = max(self.max_concurrency, limit)

    def set_rampup_min_delay(self, min_delay: float) -> None:
        """Let rampup go no faster than one request per *min_delay* seconds from now.

        For a robots.txt ``Crawl-delay`` learnt while the scope runs (an
        optional hook, not in the interface): the site's floor joins the
        user's own. A scope without rampup has nothing to change.
        """
        rampup = self.rampup
        if rampup is None:
            return
        if min_delay > rampup.config.min_delay:
            rampup.config = replace(rampup.config, min_delay=min_delay)
        # Also when the user's own floor is the higher: set_base_delay (the
        # Crawl-delay's) may just have taken the delay below it.
        self.delay = max(self.delay, rampup.config.min_delay)

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

    # Jitter

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
        gap_end = -math.inf if self.last_sent is None else self.last_sent + self.running_gap
        return max(gap_end, self.hold_until)

    @property
    def running_gap(self) -> float:
        """The gap after the last dispatch: the delay in force times its jitter factor.

        In backoff, the backoff jitter may draw a factor below what this
        scope's own jitter allows (±10 % by default): a backoff delay just
        above the configured one would then make a gap shorter than the
        configured delay ever gives, below a robots.txt Crawl-delay.
        """
        gap = self.current_delay * self._factor
        if self.backoff_delay is not None:
            gap = max(gap, self.delay * max(0.0, 1.0 + self.jitter[0]))
        return gap

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
