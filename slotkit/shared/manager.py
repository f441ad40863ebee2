"""The scope manager of a scope throttled through the shared store.

In shared mode the store decides delay, backoff, holds and quota for every
worker at once, so the local answer of :meth:`SharedScopeManager.can_send`
only bounds what this worker has in progress (the scope's concurrency) and
honours the holds it knows of. Everything else happens after the local gate,
in :meth:`slotkit.shared.throttle.SharedThrottle.reserve`, in one script call
for all the scopes of a request.

Each manager also keeps a :attr:`fallback`: the default
:class:`~slotkit.scope.ThrottlingScopeManager`, fed every dispatch of this
worker, that takes over at 1/N of the shared limits while the store is down.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from zope.interface import implementer

from slotkit.backoff import backoff_from_dict
from slotkit.interfaces import IThrottlingScopeManager
from slotkit.policy import Uniform, jitter_factor
from slotkit.rampup import rampup_from_dict
from slotkit.scope import SHARED_RNG, ThrottlingScopeManager
from slotkit.shared.twin import fmt
from slotkit.validation import NO_JITTER, Jitter, parse_jitter

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from slotkit.shared.throttle import SharedThrottle

__all__ = ["SharedScopeManager"]


@implementer(IThrottlingScopeManager)
class SharedScopeManager:
    """Local bookkeeping of one shared scope, plus its store-down fallback."""

    def __init__(
        self,
        config: dict[str, Any],
        throttle: SharedThrottle | None = None,
        rng: Uniform | None = None,
    ) -> None:
        self.throttle = throttle
        #: The scope id, known once the downloader has built the scope (:meth:`bind`).
        self.scope_id: str | None = None
        self.concurrency = max(1, int(config.get("concurrency", 1)))
        self.delay = max(0.0, float(config.get("delay", 0.0)))
        raw_jitter = config.get("jitter")
        self.jitter = parse_jitter("jitter", raw_jitter) if raw_jitter else NO_JITTER
        quota = config.get("quota")
        self.quota: float | None = None if quota is None else float(quota)
        self.window = float(config.get("window", 60.0))
        backoff = backoff_from_dict(config.get("backoff"))
        self.backoff = backoff if backoff is not None else ThrottlingScopeManager(1).backoff
        #: Rampup, shared: the store keeps its delay and concurrency for every worker.
        self.rampup = rampup_from_dict(config.get("rampup"))
        self.min_concurrency = min(self.concurrency, max(1, int(config.get("min_concurrency", 1))))
        #: robots.txt Crawl-delay this worker knows for the scope (0: none).
        self.crawl_delay = 0.0
        self._rng: Uniform = rng if rng is not None else SHARED_RNG
        self.active = 0
        self.hold_until = -math.inf
        self.last_sent: float | None = None
        self.last_done: float | None = None
        #: The local state machine that admits requests while the store is down.
        self.fallback = ThrottlingScopeManager(
            concurrency=self.concurrency,
            delay=self.delay,
            jitter=self.jitter,
            backoff=self.backoff,
            quota=self.quota,
            window=self.window,
            opened=True,  # it takes over mid-crawl, on open connections
        )
        self._workers = 1
        self._rank = 0
        #: Quota units the fallback spent that the store has not been told of,
        #: and those told since this fallback began (told again to a store
        #: that restarted meanwhile).
        self.untold_units = 0.0
        self.told_units = 0.0
        #: Seconds until the server's quota count resets, as the report being
        #: applied says (see record_quota_reset; one use).
        self._quota_reset: float | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler, config: Any) -> SharedScopeManager:
        """Build the manager for *crawler*'s shared throttle (set up by the downloader)."""
        return cls(dict(config), getattr(crawler, "slotkit_shared", None))

    def bind(self, scope_id: str) -> None:
        """Learn the id of the scope this manager throttles (its store keys)."""
        self.scope_id = scope_id

    # What the script is told about this scope

    def interval(self) -> float:
        """The gap to reserve after this worker's next dispatch (delay with jitter)."""
        return self.delay * jitter_factor(self.jitter, self._rng)

    def script_args(self, amount: float | None) -> tuple[list[str], float]:
        """This scope's arguments of one ``acquire`` (see ``script.lua``), and its interval."""
        backoff = self.backoff
        factor = jitter_factor(self.jitter, self._rng)
        args = [
            fmt(1.0 if amount is None else amount),
            fmt(self.delay),
            str(self.concurrency),
            fmt(self.quota if self.quota is not None else -1.0),
            fmt(self.window),
            fmt(self.crawl_delay),
            fmt(backoff.delay_factor),
            fmt(backoff.min_delay),
            fmt(backoff.max_delay),
            fmt(backoff.window),
            fmt(factor),
            *self.rampup_args(),
        ]
        return args, max(self.delay * factor, self.crawl_delay)

    def rampup_args(self) -> list[str]:
        """The six rampup arguments ``acquire`` and ``backoff`` both take (see ``script.lua``)."""
        rampup = self.rampup
        if rampup is None or rampup.window <= 0:
            return ["0", "1", fmt(1.0), fmt(0.0), fmt(0.0), str(self.concurrency)]
        return [
            "1",
            str(rampup.steps_up_below),
            fmt(rampup.delay_factor),
            fmt(rampup.min_delay),
            fmt(rampup.window),
            str(self.min_concurrency),
        ]

    def backoff_args(self, hold: float, age: float) -> list[str]:
        """This scope's arguments of one ``backoff`` (see ``script.lua``)."""
        config = self.backoff
        rampup = self.rampup
        return [
            fmt(hold),
            fmt(max(0.0, age)),
            fmt(self.delay),
            fmt(self.crawl_delay),
            fmt(config.delay_factor),
            fmt(config.min_delay),
            fmt(config.max_delay),
            fmt(config.window),
            *self.rampup_args(),
            str(self.concurrency),
            str(rampup.target[1] if rampup is not None else -1),
        ]

    def scale(self, workers: int, rank: int = 0) -> None:
        """Make the fallback admit 1/*workers* of the shared limits.

        The concurrency is split exactly: with 5 slots and 2 workers, the
        worker of *rank* 0 (the first by id) gets 3 and the other 2. With
        fewer slots than workers the last ones get none, and their requests
        wait for the store: one slot each would put more in flight than the
        scope allows.
        """
        workers = max(1, workers)
        self._workers, self._rank = workers, rank
        fallback = self.fallback
        fallback.delay = max(self.delay, self.crawl_delay) * workers
        share, extra = divmod(self.concurrency, workers)
        fallback.concurrency = share + (1 if rank % workers < extra else 0)
        fallback.min_concurrency = min(fallback.min_concurrency, fallback.concurrency)
        if fallback.quota is not None and self.quota is not None:
            fallback.quota.limit = self.quota / workers

    def note_hold(self, until: float) -> None:
        """Remember a hold another worker set, so the fallback keeps honouring it."""
        if until > self.fallback.hold_until:
            self.fallback.hold_until = until

    # IThrottlingScopeManager

    def can_send(self, now: float, amount: float | None = None) -> float:
        if self.active >= self.concurrency:
            return math.inf
        if now < self.hold_until:
            return self.hold_until - now
        return 0.0

    def record_sent(self, now: float, amount: float | None = None) -> None:
        self.active += 1
        self.last_sent = now

    def record_done(self, now: float) -> None:
        self.active = max(0, self.active - 1)
        self.last_done = now

    def record_backoff(self, delay: float | None = None, now: float = 0.0) -> None:
        if delay is not None and delay > 0:
            self.hold_until = max(self.hold_until, now + delay)
        self.fallback.record_backoff(delay, now)
        if self.throttle is not None and self.scope_id is not None:
            self.throttle.backoff(self, delay, now)

    def reconcile_quota(
        self, consumed: float | None = None, remaining: float | None = None, now: float = 0.0
    ) -> None:
        reset, self._quota_reset = self._quota_reset, None
        self.fallback.reconcile_quota(consumed, remaining, now)
        if self.quota is None or self.throttle is None or self.scope_id is None:
            return
        if remaining is not None and remaining <= 0 and reset is not None and reset < self.window:
            # A spent quota that resets within a window: the shared hold the
            # reset put on the scope (just before) stops every worker until
            # the server counts afresh; stored as spent, the count would keep
            # the store's aligned window shut long after that. A reset a
            # window or more away outlasts any aligned window: stored.
            return
        self.throttle.reconcile_quota(self, consumed, remaining)

    def record_quota_reset(self, reset: float, now: float) -> None:
        """The server's quota count resets *reset* seconds after *now* (see the scope manager)."""
        self._quota_reset = reset
        self.fallback.record_quota_reset(reset, now)

    def set_base_delay(self, delay: float) -> None:
        self.delay = max(0.0, float(delay))
        self.scale(self._workers, self._rank)

    def set_concurrency(self, concurrency: int) -> None:
        self.concurrency = max(1, int(concurrency))
        self.scale(self._workers, self._rank)

    def set_jitter(self, jitter: Jitter) -> None:
        """Draw this worker's intervals with *jitter* from now on (fallback too)."""
        self.jitter = jitter
        self.fallback.set_jitter(jitter)

    def is_idle(self, now: float, max_idle: float) -> bool:
        if self.active or now < self.hold_until:
            return False
        return self.fallback.is_idle(now, max_idle)

    @property
    def recoveries(self) -> int:
        return self.fallback.recoveries

    def __repr__(self) -> str:
        hold = "" if self.hold_until == -math.inf else f" hold_until={self.hold_until:.2f}"
        return (
            f"<SharedScopeManager {self.scope_id!r} active={self.active}/{self.concurrency} "
            f"delay={self.delay:.2f}s{hold}>"
        )
