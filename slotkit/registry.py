"""Scope ids to live scopes, created on demand and forgotten when idle.

A :class:`Scope` pairs a scope manager (the policy state) with what the gate
needs at run time: its waiters, its single timer and the requests it holds.
The registry keeps them in least-recently-used order so that both eviction
rules are cheap: ``THROTTLING_SCOPE_LIMIT`` drops the oldest idle scopes,
``THROTTLING_SCOPE_MAX_IDLE`` drops scopes idle for too long. Both are
checked when a scope is created, never on a timer, and neither ever drops a
scope that has requests in flight or waiting, or a delay or hold running.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request
    from twisted.internet.interfaces import IDelayedCall, IReactorTime

    from slotkit.gate import Waiter
    from slotkit.interfaces import IThrottlingScopeManager

__all__ = ["Scope", "ScopeRegistry"]

#: How many idle candidates one creation may evict; bounds the work per request.
EVICTION_SCAN = 8


class Scope:
    """One live throttling scope: a manager plus the gate's bookkeeping."""

    __slots__ = (
        "capped_logged",
        "id",
        "in_flight",
        "kind",
        "last_used",
        "live_waiters",
        "manager",
        "requests",
        "stalled",
        "step_started_at",
        "timer",
        "view",
        "waiters",
    )

    def __init__(
        self, scope_id: str, manager: IThrottlingScopeManager, kind: str = "custom"
    ) -> None:
        self.id = scope_id
        self.manager = manager
        self.kind = kind
        #: Heap of ``(sort key, waiter)`` parked on this scope (see :mod:`slotkit.gate`).
        self.waiters: list[tuple[tuple[int, int], Waiter]] = []
        #: Waiters in the heap that are not cancelled (cancelled ones are dropped lazily).
        self.live_waiters = 0
        #: The one pending wake-up of this scope, if any.
        self.timer: IDelayedCall | None = None
        #: Requests of this scope waiting at the gate or in flight (``Slot.active``).
        self.requests: set[Request] = set()
        #: Requests of this scope in flight (``Slot.transferring``).
        self.in_flight: set[Request] = set()
        #: When the current backoff step (or hold) began; responses to requests
        #: dispatched earlier do not advance the backoff again.
        self.step_started_at = -math.inf
        #: When a request last asked for this scope (set by the registry).
        self.last_used = -math.inf
        #: Whether "hint capped" was logged in the current backoff episode.
        self.capped_logged = False
        #: A request of this scope hit the re-send bound (see :mod:`slotkit.resend`).
        self.stalled = False
        #: Its ``Downloader.slots`` view, made on first use (see :mod:`slotkit.slots`).
        self.view: Any = None

    def is_busy(self) -> bool:
        """True while the gate holds anything of this scope."""
        return bool(self.requests) or self.live_waiters > 0

    def __repr__(self) -> str:
        manager = self.manager
        concurrency = getattr(manager, "concurrency", "?")
        delay = getattr(manager, "delay", None)
        delay_text = f"{delay:.2f}s" if isinstance(delay, (int, float)) else "?"
        wakes = ""
        if self.timer is not None and self.timer.active():
            wakes = f" wakes_at={self.timer.getTime():.3f}"
        return (
            f"<Scope {self.id!r} active={len(self.in_flight)}/{concurrency} "
            f"delay={delay_text} waiting={len(self.requests) - len(self.in_flight)}{wakes}>"
        )


class ScopeRegistry:
    """Live scopes by id, with LRU and idle-time eviction."""

    def __init__(
        self,
        factory: Callable[[str], Scope],
        clock: IReactorTime,
        limit: int = 100_000,
        max_idle: float = 3600.0,
        on_evict: Callable[[Scope], Any] | None = None,
    ) -> None:
        self._factory = factory
        self._clock = clock
        self.limit = limit
        self.max_idle = max_idle
        self._on_evict = on_evict
        self._scopes: OrderedDict[str, Scope] = OrderedDict()
        self.evicted = 0

    def get(self, scope_id: str) -> Scope:
        """Return the live scope *scope_id*, creating it (and evicting others) if needed."""
        return self.scopes_for((scope_id,))[0]

    def scopes_for(self, scope_ids: Iterable[str]) -> list[Scope]:
        """The live scopes of one request, created as needed, marked as just used.

        Eviction runs after all of them exist, and never picks one of them:
        a scope created for this request must not be dropped for being idle
        before the request has even reached the gate.
        """
        now = self._clock.seconds()
        scopes = []
        created = False
        for scope_id in scope_ids:
            scope = self._scopes.get(scope_id)
            if scope is None:
                scope = self._factory(scope_id)
                self._scopes[scope_id] = scope
                created = True
            else:
                self._scopes.move_to_end(scope_id)
            scope.last_used = now
            scopes.append(scope)
        if created:
            self._evict(now, protected=len(scopes))
        return scopes

    def peek(self, scope_id: str) -> Scope | None:
        """Return the live scope *scope_id* without creating or touching it."""
        return self._scopes.get(scope_id)

    def _evictable(self, scope: Scope, now: float, max_idle: float) -> bool:
        return (
            not scope.is_busy()
            and now - scope.last_used >= max_idle
            and scope.manager.is_idle(now, max_idle)
        )

    def _evict(self, now: float, protected: int) -> None:
        """Drop scopes from the old end: over the limit any idle one, else the long-idle ones.

        The *protected* youngest scopes (the ones just asked for) are never
        candidates. At most :data:`EVICTION_SCAN` candidates are examined;
        busy ones are moved to the young end, since their activity makes them
        recent anyway.
        """
        for _ in range(min(EVICTION_SCAN, len(self._scopes) - protected)):
            over_limit = 0 < self.limit < len(self._scopes)
            if not over_limit and not self.max_idle:
                return
            scope_id, scope = next(iter(self._scopes.items()))
            if self._evictable(scope, now, 0.0 if over_limit else self.max_idle):
                del self._scopes[scope_id]
                self.evicted += 1
                if scope.timer is not None and scope.timer.active():
                    scope.timer.cancel()
                if self._on_evict is not None:
                    self._on_evict(scope)
            elif over_limit or scope.is_busy() or now - scope.last_used >= self.max_idle:
                # Busy, or unused long enough but still held or backing off: keep it
                # without letting it stop the scan of the scopes behind it.
                self._scopes.move_to_end(scope_id)
            else:
                return  # the oldest idle scope is not old enough: none younger is

    @property
    def live(self) -> Mapping[str, Scope]:
        """The live scopes by id, read-only by convention (the slots view reads it directly)."""
        return self._scopes

    def __contains__(self, scope_id: object) -> bool:
        return scope_id in self._scopes

    def __iter__(self) -> Iterator[str]:
        return iter(self._scopes)

    def __len__(self) -> int:
        return len(self._scopes)

    def values(self) -> Iterator[Scope]:
        """Every live scope, oldest first."""
        return iter(list(self._scopes.values()))
