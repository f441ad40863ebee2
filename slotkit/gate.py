"""The gate: a request passes when every one of its scopes allows it.

Waiting is a Deferred, like :class:`twisted.internet.defer.DeferredSemaphore`;
nothing polls and nothing sleeps.

How a waiter moves:

1. On :meth:`Gate.acquire`, if no scope of the request has anyone waiting and
   every scope's manager answers ``can_send() == 0``, it is dispatched at once.
2. Otherwise the waiter is *parked* on the first scope that stops it, in a
   heap ordered by request priority, then arrival (FIFO among equals). A
   request that spends part of a quota counts as arrived a little earlier
   (:func:`~slotkit.quota.quota_head_start`): all else equal, the bigger
   spender goes first, as the spec asks, but only by a bounded margin.
3. A scope is *pumped* when its timer fires or its state changes (a request
   of it finished, its delay or concurrency changed, it was held). Pumping
   looks at the head waiter: if this scope still says wait, the scope arms
   its one timer (finite waits) or waits for the next state change
   (``math.inf``) and stops. If another scope of the waiter says wait, the
   waiter moves to that scope's heap, keeping its place in the order. If all
   allow, it is dispatched: ``record_sent`` on every scope, then its
   Deferred fires.

Each scope owns at most one pending ``IDelayedCall``. Deferreds fire only
after the scope's bookkeeping is consistent, and re-entrant pumps (a
callback that finishes a download synchronously) are queued, not nested.

A scope manager may be the user's: when one of its methods raises, the
request it was asked about ends with that error (its Deferred fails, what
it took is given back) and the gate goes on with the others, so a plugin's
bug never leaves a request unanswered or a slot taken for good.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import IgnoreRequest
from twisted.internet.defer import Deferred

from slotkit.quota import quota_head_start
from slotkit.waiter import Waiter, WaiterKey

if TYPE_CHECKING:
    from scrapy import Request
    from twisted.internet.interfaces import IReactorTime

    from slotkit.registry import Scope

__all__ = ["Gate", "GateClosedError", "Waiter", "WaiterKey"]

logger = logging.getLogger(__name__)


class GateClosedError(IgnoreRequest):
    """The downloader closed while a request still waited for its scopes.

    An :class:`~scrapy.exceptions.IgnoreRequest`: errbacks still see it (with
    the reason), but Scrapy does not log an "Error downloading" line for each
    request a closing spider leaves unsent; the downloader logs one summary.
    """


class Gate:
    """Admits requests through several scopes at once."""

    def __init__(
        self,
        clock: IReactorTime,
        on_dispatch: Callable[[Waiter, float], Any] | None = None,
    ) -> None:
        self._clock = clock
        self._seq = itertools.count()
        self._pending: deque[Scope] = deque()
        self._queued: set[str] = set()
        self._draining = False
        self._closed = False
        self._close_reason = "the downloader closed"
        self._on_dispatch = on_dispatch
        #: Waiters not yet dispatched (parked or held by a per-request delay).
        self.waiting: set[Waiter] = set()

    @property
    def clock(self) -> IReactorTime:
        """The time source the gate decides on."""
        return self._clock

    # Entering

    def try_acquire(
        self,
        request: Request,
        scopes: Sequence[Scope],
        amounts: Sequence[float | None],
    ) -> Waiter | None:
        """Dispatch at once if nothing stands in the way; else return ``None``.

        The fast path of every unthrottled request: no Deferred, no heap.
        """
        if self._closed:
            return None
        now = self._clock.seconds()
        for scope, amount in zip(scopes, amounts, strict=True):
            if scope.live_waiters or scope.manager.can_send(now, amount) > 0:
                return None
        waiter = Waiter(request, scopes, amounts, (0, now, next(self._seq)))
        for scope in scopes:
            scope.add_request(request)
        self._dispatch(waiter, now)
        return waiter

    def acquire(
        self,
        request: Request,
        scopes: Sequence[Scope],
        amounts: Sequence[float | None],
        priority: int = 0,
        delay: float = 0.0,
        arrived: float | None = None,
    ) -> Deferred[Waiter]:
        """Return a Deferred that fires with a ticket once every scope allows *request*.

        *delay* (the ``throttling_delay`` meta) holds the request that long
        before it starts competing for its scopes. *arrived* keeps the place
        of a request that waited before (one re-sent after a rate limit):
        behind every newcomer it took the 429s for all of them. Cancelling
        the Deferred withdraws the request from every scope.
        """
        now = self._clock.seconds()
        arrival = (now if arrived is None else arrived) - quota_head_start(scopes, amounts)
        waiter = Waiter(request, scopes, amounts, (-priority, arrival, next(self._seq)))
        waiter.deferred = Deferred(lambda _: self._cancel(waiter))
        if self._closed:
            waiter.deferred.errback(
                GateClosedError(
                    f"{self._close_reason} before {request} reached its throttling "
                    f"scopes {[s.id for s in scopes]}; it was not sent"
                )
            )
            return waiter.deferred
        waiter.enqueued_at = now
        self.waiting.add(waiter)
        for scope in scopes:
            scope.add_request(request)
        if delay > 0:
            waiter.delay_call = self._clock.callLater(delay, self._enter, waiter)
        else:
            self._enter(waiter)
        return waiter.deferred

    def _enter(self, waiter: Waiter) -> None:
        waiter.delay_call = None
        if not waiter.scopes:
            self._dispatch(waiter, self._clock.seconds())
            self._fire(waiter)
            return
        now = self._clock.seconds()
        target = waiter.scopes[0]
        try:
            for scope, amount in zip(waiter.scopes, waiter.amounts, strict=True):
                if scope.live_waiters or scope.manager.can_send(now, amount) > 0:
                    target = scope
                    break
        except Exception as exc:
            self._fail(waiter, exc)
            return
        self._park(waiter, target)
        self.poke(target)

    # Leaving

    def started(self, ticket: Waiter) -> None:
        """The ticket's transfer begins now: let scope managers that care re-stamp it."""
        now = self._clock.seconds()
        for scope in ticket.scopes:
            started = getattr(scope.manager, "record_started", None)
            if started is not None:
                started(now)

    def release(self, ticket: Waiter) -> None:
        """Give back what a dispatched request held; wake the scopes it freed.

        Releasing a ticket twice is a no-op, so a slot is never freed twice.
        """
        if ticket.released:
            return
        ticket.released = True
        now = self._clock.seconds()
        request = ticket.request
        for scope, amount in zip(ticket.scopes, ticket.amounts, strict=True):
            scope.discard_done(request)
            manager = scope.manager
            ending = getattr(manager, "record_ending", None)
            if ending is not None:  # slotkit's own managers: which request ended matters
                _tell_end(scope, request, ending, ticket.sent_at, amount)
            # On its own: it gives the concurrency place back, which an error
            # in record_ending must not skip (the place would stay taken).
            _tell_end(scope, request, manager.record_done, now)
        for scope in ticket.scopes:
            if scope.waiters:  # nobody parked here: nothing a poke could admit
                self.poke(scope)

    def _cancel(self, waiter: Waiter) -> None:
        if waiter.dispatched or waiter.cancelled:
            return
        waiter.cancelled = True
        self.waiting.discard(waiter)
        if waiter.delay_call is not None and waiter.delay_call.active():
            waiter.delay_call.cancel()
        for scope in waiter.scopes:
            scope.discard_request(waiter.request)
        parked = waiter.parked_on
        if parked is not None:
            parked.live_waiters -= 1
            waiter.parked_on = None
            # The next waiter may have been stuck only behind this one.
            self.poke(parked)

    # Waking

    def poke(self, scope: Scope) -> None:
        """Ask *scope* to admit what it can; safe to call from any callback."""
        if self._closed or scope.id in self._queued:
            return
        self._queued.add(scope.id)
        self._pending.append(scope)
        if self._draining:
            return
        self._draining = True
        try:
            while self._pending:
                next_scope = self._pending.popleft()
                self._queued.discard(next_scope.id)
                for waiter, error in self._pump(next_scope):
                    if error is None:
                        self._fire(waiter)
                    else:
                        self._fail(waiter, error)
        finally:
            self._draining = False

    def _pump(self, scope: Scope) -> list[tuple[Waiter, Exception | None]]:
        """Dispatch the head waiters of *scope* that may go; return them to fire.

        A waiter whose scope manager raised comes back with the error, to fail
        once the pump is done (as the others fire then).
        """
        ready: list[tuple[Waiter, Exception | None]] = []
        heap = scope.waiters
        now = self._clock.seconds()
        while heap:
            waiter = heap[0][1]
            if waiter.cancelled or waiter.parked_on is not scope:
                heapq.heappop(heap)
                continue
            index = waiter.scopes.index(scope)
            try:
                wait = scope.manager.can_send(now, waiter.amounts[index])
                if wait > 0:
                    self._arm(scope, wait)
                    break
                heapq.heappop(heap)
                scope.live_waiters -= 1
                waiter.parked_on = None
                blocker, blocker_wait = self._first_blocker(waiter, now, skip=scope)
                if blocker is None:
                    self._dispatch(waiter, now)
            except Exception as exc:
                if not waiter.dispatched:
                    self._cancel(waiter)  # unparks it too, if the raise came first
                ready.append((waiter, exc))
                continue
            if blocker is not None:
                self._park(waiter, blocker)
                if blocker_wait > 0:
                    self._arm(blocker, blocker_wait)
                else:
                    self.poke(blocker)  # free, but an earlier waiter goes first
                continue
            ready.append((waiter, None))
        return ready

    def _first_blocker(self, waiter: Waiter, now: float, skip: Scope) -> tuple[Scope | None, float]:
        """The first other scope that stops *waiter*, and how long it says to wait.

        A scope stops it when its manager says wait, or when an earlier waiter
        (by sort key: priority, then arrival) is still parked on it: otherwise
        a waiter freed by its own scope would take a shared scope's slot from
        an older waiter parked there (FIFO across scopes).
        """
        for scope, amount in zip(waiter.scopes, waiter.amounts, strict=True):
            if scope is skip:
                continue
            wait = scope.manager.can_send(now, amount)
            if wait > 0:
                return scope, wait
            if self._has_earlier_waiter(scope, waiter.key):
                return scope, 0.0
        return None, 0.0

    @staticmethod
    def _has_earlier_waiter(scope: Scope, key: WaiterKey) -> bool:
        """Whether a live waiter that sorts before *key* is parked on *scope*."""
        heap = scope.waiters
        while heap:
            head = heap[0][1]
            if head.cancelled or head.parked_on is not scope:
                heapq.heappop(heap)  # stale entry, dropped lazily as in _pump
                continue
            return head.key < key
        return False

    def _park(self, waiter: Waiter, scope: Scope) -> None:
        waiter.parked_on = scope
        scope.live_waiters += 1
        heapq.heappush(scope.waiters, (waiter.key, waiter))

    def _arm(self, scope: Scope, wait: float) -> None:
        """Make sure *scope* wakes within *wait* seconds (one timer per scope)."""
        if math.isinf(wait):
            return  # only a state change can free it; that pokes the scope
        due = self._clock.seconds() + wait
        timer = scope.timer
        if timer is not None and timer.active():
            if timer.getTime() <= due:
                return
            timer.cancel()
        scope.timer = self._clock.callLater(wait, self._wake, scope)

    def _wake(self, scope: Scope) -> None:
        scope.timer = None
        self.poke(scope)

    def _dispatch(self, waiter: Waiter, now: float) -> None:
        waiter.dispatched = True
        waiter.sent_at = waiter.left_at = now
        self.waiting.discard(waiter)
        request = waiter.request
        for told, (scope, amount) in enumerate(zip(waiter.scopes, waiter.amounts, strict=True)):
            try:
                scope.manager.record_sent(now, amount)
            except Exception:
                self._undo_dispatch(waiter, told)
                raise
            scope.add_in_flight(request)
        if self._on_dispatch is not None:
            self._on_dispatch(waiter, now)

    def _undo_dispatch(self, waiter: Waiter, told: int) -> None:
        """``record_sent`` raised on scope number *told*: the request will not go.

        The scopes already told it went hear that it ended; the others forget it.
        """
        for scope in waiter.scopes[told:]:
            scope.discard_request(waiter.request)
        sent = Waiter(waiter.request, waiter.scopes[:told], waiter.amounts[:told], waiter.key)
        sent.sent_at = waiter.sent_at
        waiter.released = True
        self.release(sent)

    def _fail(self, waiter: Waiter, error: Exception) -> None:
        """A scope manager raised on *waiter*'s behalf: it ends with that error."""
        deferred = waiter.deferred
        if not waiter.dispatched:
            self._cancel(waiter)
        if deferred is not None and not deferred.called:
            deferred.errback(error)

    def _fire(self, waiter: Waiter) -> None:
        deferred = waiter.deferred
        if deferred is None:
            return
        if deferred.called:
            # Cancelled after its dispatch was recorded but before it fired (by a
            # callback of a waiter dispatched in the same batch): give back what
            # it took instead of firing an already-failed Deferred.
            self.release(waiter)
            return
        deferred.callback(waiter)

    # Closing

    def close(self, scopes: Sequence[Scope], reason: str = "the downloader closed") -> None:
        """Fail every waiter and cancel every timer; the gate admits nothing after this."""
        self._closed = True
        self._close_reason = reason
        for scope in scopes:
            if scope.timer is not None and scope.timer.active():
                scope.timer.cancel()
            scope.timer = None
        for waiter in list(self.waiting):
            deferred = waiter.deferred
            self._cancel(waiter)
            if deferred is not None and not deferred.called:
                deferred.errback(
                    GateClosedError(
                        f"{reason} while {waiter.request} waited for its throttling "
                        f"scopes {[s.id for s in waiter.scopes]}; it was not sent"
                    )
                )
        self._pending.clear()
        self._queued.clear()


def _tell_end(scope: Scope, request: Request, method: Callable[..., Any], *args: Any) -> None:
    """Tell *scope*'s manager that *request* ended; an error is logged, not raised.

    The request's outcome is already decided: it stands, and the other
    scopes still hear that the request ended.
    """
    try:
        method(*args)
    except Exception:
        logger.exception(
            "slotkit: the scope manager of %r raised on the end of %s", scope.id, request
        )
