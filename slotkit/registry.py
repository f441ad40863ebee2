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

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request
    from twisted.internet.interfaces import IDelayedCall, IReactorTime

    from slotkit.gate import Waiter, WaiterKey
    from slotkit.interfaces import IThrottlingScopeManager

__all__ = ["Scope", "ScopeRegistry"]

logger = logging.getLogger("slotkit")

#: How many idle candidates one creation may evict; bounds the work per request.
EVICTION_SCAN = 8

#: What ``Scope.requests`` and ``Scope.in_flight`` hold while empty. An idle
#: scope keeps no set of its own: two empty sets would cost 432 bytes a scope,
#: about half of an idle scope. The price is a set made and dropped per busy
#: period (measured: 7% more instructions per request through the gate alone).
NO_REQUESTS: frozenset[Any] = frozenset()

#: Shared rather than written as ``-math.inf`` in ``__init__``, which would
#: allocate a new float for every scope.
NEVER = -math.inf


class Scope:
    """One live throttling scope: a manager plus the gate's bookkeeping."""

    __slots__ = (
        "backoff_logged",
        "capped_logged",
        "id",
        "in_flight",
        "keeps_sets",
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
        self.waiters: list[tuple[WaiterKey, Waiter]] = []
        #: Waiters in the heap that are not cancelled (cancelled ones are dropped lazily).
        self.live_waiters = 0
        #: The one pending wake-up of this scope, if any.
        self.timer: IDelayedCall | None = None
        #: Requests of this scope waiting at the gate or in flight (``Slot.active``).
        #: Read-only for everyone: the gate changes it through the methods below.
        self.requests: AbstractSet[Request] = NO_REQUESTS
        #: Requests of this scope in flight (``Slot.transferring``), same rules.
        self.in_flight: AbstractSet[Request] = NO_REQUESTS
        #: The two sets were handed out and stay this scope's own (:meth:`keep_sets`).
        self.keeps_sets = False
        #: When the current backoff step (or hold) began; responses to requests
        #: dispatched earlier do not advance the backoff again.
        self.step_started_at = NEVER
        #: When a request last asked for this scope (set by the registry).
        self.last_used = NEVER
        #: Whether "hint capped" was logged in the current backoff episode.
        self.capped_logged = False
        #: Whether its first backoff step was logged (once per live scope).
        self.backoff_logged = False
        #: A request of this scope hit the re-send bound (see :mod:`slotkit.resend`).
        self.stalled = False
        #: Its ``Downloader.slots`` view, made on first use (see :mod:`slotkit.slots`).
        self.view: Any = None

    def is_busy(self) -> bool:
        """True while the gate holds anything of this scope."""
        return bool(self.requests) or self.live_waiters > 0

    # The two request sets: the shared empty frozenset while empty, a set of
    # the scope's own while not. The set is dropped again once it empties, so
    # an idle scope costs nothing for them, however busy it once was; unless
    # someone may hold it (``Slot.active``), see :meth:`keep_sets`.

    def add_request(self, request: Request) -> None:
        """*request* now waits at the gate for this scope (or is in flight)."""
        requests = self.requests
        if requests is NO_REQUESTS:
            self.requests = {request}
        else:
            requests.add(request)  # type: ignore[attr-defined]  # not the sentinel: our own set

    def add_in_flight(self, request: Request) -> None:
        """*request* (already in :attr:`requests`) was dispatched."""
        in_flight = self.in_flight
        if in_flight is NO_REQUESTS:
            self.in_flight = {request}
        else:
            in_flight.add(request)  # type: ignore[attr-defined]

    def discard_request(self, request: Request) -> None:
        """*request* left the gate without being dispatched (cancelled)."""
        requests = self.requests
        if requests:
            requests.discard(request)  # type: ignore[attr-defined]
            if not requests and not self.keeps_sets:
                self.requests = NO_REQUESTS

    def discard_done(self, request: Request) -> None:
        """*request* finished: it leaves both sets."""
        requests = self.requests
        if requests:
            requests.discard(request)  # type: ignore[attr-defined]
            if not requests and not self.keeps_sets:
                self.requests = NO_REQUESTS
        in_flight = self.in_flight
        if in_flight:
            in_flight.discard(request)  # type: ignore[attr-defined]
            if not in_flight and not self.keeps_sets:
                self.in_flight = NO_REQUESTS

    def keep_sets(self) -> None:
        """Give the scope sets of its own for good: a caller is about to hold one.

        ``Slot.active`` is a live set in Scrapy (len() follows the downloader
        after the caller took it), so once it was handed out, it must not be
        swapped for the sentinel when it empties.
        """
        self.keeps_sets = True
        if self.requests is NO_REQUESTS:
            self.requests = set()
        if self.in_flight is NO_REQUESTS:
            self.in_flight = set()

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
        #: Scopes whose manager raised in is_idle() (logged once each).
        self._idle_failed: set[str] = set()
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
        live = self._scopes
        scopes = []
        created = False
        for scope_id in scope_ids:
            scope = live.get(scope_id)
            if scope is None:
                scope = live[scope_id] = self._factory(scope_id)
                created = True
            else:
                live.move_to_end(scope_id)
            scope.last_used = now
            scopes.append(scope)
        if created:
            self._evict(now, protected=len(scopes))
        return scopes

    def peek(self, scope_id: str) -> Scope | None:
        """Return the live scope *scope_id* without creating or touching it."""
        return self._scopes.get(scope_id)

    def _evict(self, now: float, protected: int) -> None:
        """Drop scopes from the old end: over the limit any idle one, else the long-idle ones.

        The *protected* youngest scopes (the ones just asked for) are never
        candidates. At most :data:`EVICTION_SCAN` candidates are examined;
        busy ones are moved to the young end, since their activity makes them
        recent anyway. This runs once per created scope, so in a broad crawl
        once per request: the cheap tests (busy, age) come before the
        manager is asked.
        """
        live = self._scopes
        budget = len(live) - protected
        if budget > EVICTION_SCAN:
            budget = EVICTION_SCAN
        limit = self.limit
        # Over the limit: the oldest goes if idle at all, else to the young end.
        # Once under it, nothing in this pass brings the count back over.
        while budget > 0 and 0 < limit < len(live):
            budget -= 1
            scope_id, scope = live.popitem(last=False)
            if (
                not scope.requests
                and not scope.live_waiters
                and now - scope.last_used >= 0.0
                and self._is_idle(scope, now, 0.0)
            ):
                self._dropped(scope)
            else:
                live[scope_id] = scope
        max_idle = self.max_idle
        if not max_idle:
            return
        while budget > 0:
            budget -= 1
            scope_id, scope = next(iter(live.items()))
            busy = bool(scope.requests) or scope.live_waiters > 0
            if now - scope.last_used < max_idle:
                if not busy:
                    return  # the oldest idle scope is not old enough: none younger is
                live.move_to_end(scope_id)
            elif not busy and self._is_idle(scope, now, max_idle):
                del live[scope_id]
                self._dropped(scope)
            else:
                # Unused long enough but still held or backing off: keep it
                # without letting it stop the scan of the scopes behind it.
                live.move_to_end(scope_id)

    def _is_idle(self, scope: Scope, now: float, max_idle: float) -> bool:
        """The manager's ``is_idle``; one that raises keeps its scope (logged once).

        Raising out of eviction failed an unrelated request (the one whose
        new scope started the pass) and lost the scope, a hold included,
        without stopping its timer.
        """
        try:
            return bool(scope.manager.is_idle(now, max_idle))
        except Exception:
            if scope.id not in self._idle_failed:
                self._idle_failed.add(scope.id)
                logger.exception(
                    "slotkit: the scope manager of %r raised in is_idle(); the scope is kept",
                    scope.id,
                )
            return False

    def _dropped(self, scope: Scope) -> None:
        """*scope* left the registry: stop its timer and tell the owner."""
        self.evicted += 1
        timer = scope.timer
        if timer is not None and timer.active():
            timer.cancel()
        if self._on_evict is not None:
            self._on_evict(scope)

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
