"""A warning when slowed-down sites fill the downloader (head-of-line blocking).

With Scrapy's own scheduler the engine stops taking requests once
``CONCURRENT_REQUESTS`` of them are in the downloader, whether they are being
transferred or waiting for their scopes. When a site answers 429s or 503s,
its requests wait out the backoff (or the server's ``Retry-After``) there, and
a queue that holds mostly that site's requests can fill every place: requests
for healthy sites then cannot reach the downloader until the slow site's go.
A probe measured it: healthy sites' first pages 12 s late behind one site
answering 429, against 0.8 s with slotkit's throttling-aware scheduler, which
keeps such requests in the scheduler instead.

:class:`CrowdingWatch` notices this from the downloader's side, at most once
a second and only while the downloader is full, and says once per crawl what
is happening and what fixes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING

from slotkit.status import scope_state

if TYPE_CHECKING:
    from scrapy import Request
    from twisted.internet.interfaces import IDelayedCall, IReactorTime

    from slotkit.registry import Scope

logger = logging.getLogger("slotkit")

__all__ = ["CrowdingWatch"]

#: Seconds between two looks while the downloader stays full.
CHECK_EVERY = 1.0
#: Seconds from a re-send's start to the look it asks for: the rest of a burst
#: of rate-limited answers arrives in that time.
SETTLE = 0.2
#: The least backoff delay (seconds) that counts as slowing a rampup scope down.
SLOWED_DELAY = 0.5
#: The share of the places that must be held by slowed-down scopes' waiting requests.
CROWDED_SHARE = 0.5


class CrowdingWatch:
    """Warns once when requests of slowed-down scopes hold most downloader places."""

    def __init__(
        self,
        clock: IReactorTime,
        places: int,
        active: Collection[Request],
        scopes_of: Callable[[Request], Iterable[Scope]],
        resending: Collection[Request],
    ) -> None:
        self._clock = clock
        self._places = places
        self._active = active
        self._scopes_of = scopes_of
        self._resending = resending
        self._next_look = 0.0
        self._look_call: IDelayedCall | None = None
        self._stopped = False
        self.warned = False

    def soon(self) -> None:
        """Look shortly: a request starts waiting for a re-send.

        The engine asks whether the downloader is full only when something
        leaves it, and a re-sent request does not leave: without this, a
        crowded downloader could go unseen for the engine's whole 5 s beat.
        """
        if self.warned or self._stopped:
            return
        if self._look_call is not None and self._look_call.active():
            return
        self._look_call = self._clock.callLater(SETTLE, self._look)

    def stop(self) -> None:
        """Cancel a pending look and look no more (the downloader closes).

        A request in flight at close may still be answered 429 and ask for a
        look (a review found the timer left behind); that is turned away.
        """
        self._stopped = True
        if self._look_call is not None and self._look_call.active():
            self._look_call.cancel()
        self._look_call = None

    def _look(self) -> None:
        self._look_call = None
        self._next_look = 0.0
        if len(self._active) >= self._places:
            self.check()

    def check(self) -> None:
        """Look at the full downloader's requests (nothing when it is too soon)."""
        if self.warned or self._stopped:
            return
        now = self._clock.seconds()
        if now < self._next_look:
            return
        self._next_look = now + CHECK_EVERY
        crowded = 0
        slowest: dict[str, float] = {}
        for request in list(self._active):
            scopes = list(self._scopes_of(request))
            if any(request in scope.in_flight for scope in scopes):
                continue  # being transferred: that place is well used
            slowed = [scope for scope in scopes if _slowed(scope, now)]
            if not slowed and request not in self._resending:
                continue
            crowded += 1
            for scope in slowed:
                state = scope_state(scope, now)
                slowest[scope.id] = max(state.hold_remaining, state.current_delay)
        if crowded < max(1, self._places * CROWDED_SHARE):
            return
        self.warned = True
        named = sorted(slowest.items(), key=lambda item: -item[1])[:3]
        which = ", ".join(f"{scope} ({wait:.1f} s)" for scope, wait in named) or "re-sends"
        logger.warning(
            "slotkit: %d of the %d CONCURRENT_REQUESTS places are held by requests waiting "
            "for scopes that are held or backing off (%s); requests for other sites cannot "
            "reach the downloader until those go (in a crawl of one site this costs nothing). "
            "To keep such requests in the scheduler instead, set "
            "SCHEDULER = 'slotkit.ThrottlingAwareScheduler' and SCHEDULER_PRIORITY_QUEUE = "
            "'slotkit.ThrottlingAwarePriorityQueue', or ADDONS = {'slotkit.Addon': 0} "
            "(docs/scheduling.rst). Logged once.",
            crowded,
            self._places,
            which,
        )


def _slowed(scope: Scope, now: float) -> bool:
    """Whether *scope* is slowed down now: a hold, or a backoff delay above the
    scope's own (for a rampup scope, of :data:`SLOWED_DELAY` or more: its small
    steps around the rate it found are its normal pace, not a slowdown)."""
    manager = scope.manager
    hold_until = getattr(manager, "hold_until", None)
    if isinstance(hold_until, (int, float)) and hold_until > now:
        return True
    backoff_delay = getattr(manager, "backoff_delay", None)
    if not isinstance(backoff_delay, (int, float)):
        return False
    delay = getattr(manager, "delay", 0.0)
    least = SLOWED_DELAY if getattr(manager, "rampup", None) is not None else 0.0
    return backoff_delay >= least and backoff_delay > (
        delay if isinstance(delay, (int, float)) else 0.0
    )
