"""The shared throttle: one script call per request, local fallback when the store is down.

How one request passes (after the local gate admitted it):

1. :meth:`SharedThrottle.reserve` runs ``acquire`` for all of its scopes in
   one call. The store answers with a relative wait and, if it could, a
   *reservation*: the request's place in every scope's schedule and a
   concurrency lease, taken atomically.
2. The request waits that long on the crawl's clock, then goes. A ``hold``
   published meanwhile for one of its scopes (another worker saw a 429)
   cancels the reservation: the lease is given back and step 1 is redone.
   A ``full`` answer waits for a ``free`` message (or the lease expiry); a
   ``wait`` answer (quota, or beyond the horizon) waits and asks again.
3. :meth:`SharedThrottle.release` gives the leases back once the download
   ended.

Store down: a failed call sends its request through the local fallback gate
(the :attr:`SharedScopeManager.fallback` managers at 1/N of the shared
limits), so nothing is lost and nothing goes unthrottled. After
``failures`` failures in a row, or any failure when the last success is
older than ``fallback_after``, every request takes the fallback until a
heartbeat succeeds again; then the holds this worker knows are written
back, orphaned leases released, and the shared path resumes.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred, DeferredLock
from twisted.internet.defer import TimeoutError as DeferredTimeoutError

from slotkit.gate import Gate, GateClosedError, Waiter
from slotkit.registry import Scope
from slotkit.shared.manager import SharedScopeManager
from slotkit.shared.twin import fmt

if TYPE_CHECKING:
    from scrapy import Request
    from twisted.internet.interfaces import IDelayedCall, IReactorTime

    from slotkit.shared.client import Backend

logger = logging.getLogger("slotkit")

__all__ = ["SharedThrottle", "ThrottleOptions"]

SHARED = "shared"
FALLBACK = "fallback"


@dataclass(frozen=True)
class ThrottleOptions:
    """Tunables of the shared throttle (seconds unless said otherwise)."""

    namespace: str = "slotkit"
    #: How long one store call may take before it counts as a failure.
    timeout: float = 0.25
    #: Failures in a row that switch every request to the local fallback.
    failures: int = 3
    #: Any failure this long after the last success also switches.
    fallback_after: float = 0.5
    #: Heartbeat period in shared mode, and probe period while falling back.
    beat: float = 1.0
    probe: float = 0.5
    #: A worker not heard of for this long no longer counts in N.
    worker_ttl: float = 5.0
    #: A lease not given back (a worker died) frees its slot after this long.
    lease_ttl: float = 190.0
    #: Never reserve further ahead than this; ask again instead.
    horizon: float = 30.0
    #: Minimum lifetime of a scope's keys after their last use.
    key_ttl: float = 600.0
    #: Longest wait for a ``free`` message before asking again when a scope is full.
    full_poll: float = 1.0
    #: A reservation used later than this (a reply or a timer delayed by a busy
    #: reactor) is given back and asked for again: going late would crowd the
    #: next worker's slot.
    late: float = 0.02


@dataclass(eq=False)
class Pass:
    """What a request holds in the shared layer between reserve and release."""

    scope_ids: list[str]
    managers: list[SharedScopeManager]
    amounts: list[float | None]
    lease: str | None = None
    fallback_ticket: Waiter | None = None
    sent_at: float = 0.0


@dataclass(eq=False)
class _Sleep:
    """A wait on the crawl's clock that an event can end early."""

    deferred: Deferred[str]
    scopes: frozenset[str]
    kinds: frozenset[str]
    call: IDelayedCall | None = None
    events: list[str] = field(default_factory=list)


class SharedThrottle:
    """Drives the store for one crawler: reservations, releases, backoff, fallback."""

    def __init__(
        self,
        backend: Backend,
        clock: IReactorTime,
        worker_id: str,
        options: ThrottleOptions | None = None,
        on_mode: Callable[[str], Any] | None = None,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.worker_id = worker_id
        self.options = options or ThrottleOptions()
        ns = self.options.namespace
        #: Every key shares this hash tag, so a Redis Cluster keeps them on one node.
        self.prefix = f"{{{ns}}}:"
        self.workers_key = self.prefix + "w"
        self.channel = self.prefix + "ev"
        self.mode = SHARED
        self.workers = 1
        self._on_mode = on_mode
        self._leases = itertools.count()
        self._failures = 0
        self._last_success = clock.seconds()
        self._managers: dict[str, SharedScopeManager] = {}
        self._fallback_gate = Gate(clock)
        self._fallback_scopes: dict[str, Scope] = {}
        self._sleeps: set[_Sleep] = set()
        #: One reservation at a time per scope and worker: the next request of
        #: the scope asks the store only once the previous one has gone. Keeps
        #: reservations (and the leases they hold) at most N deep per scope.
        self._turns: dict[str, DeferredLock] = {}
        self._orphans: list[tuple[list[str], list[str], str]] = []
        self._beat_call: IDelayedCall | None = None
        self._beat_in_flight = False
        self._closed = False
        self._stopping = False
        #: Counters for stats and the benchmark.
        self.calls = 0
        self.acquires = 0
        self.fallback_requests = 0
        self.fallbacks = 0
        self.resyncs = 0
        self.fell_back_at: float | None = None
        #: Round-trip seconds of each acquire call (bounded).
        self.latencies: list[float] = []

    # Life cycle

    def start(self) -> None:
        """Subscribe to the store's events and start the heartbeat."""
        self.backend.subscribe(self.channel, self._event)
        self._schedule_beat(0.0)

    def stop_waiting(self, reason: str = "the downloader closed") -> None:
        """Fail every request still waiting for the store or the fallback (spider closing)."""
        self._stopping = True
        for sleep in list(self._sleeps):
            self._end_sleep(sleep, None)
        self._fallback_gate.close(list(self._fallback_scopes.values()), reason)

    def close(self) -> None:
        """Stop the heartbeat, fail what still waits, leave the worker set."""
        if self._closed:
            return
        self.stop_waiting()
        self._closed = True
        if self._beat_call is not None and self._beat_call.active():
            self._beat_call.cancel()
        if self.mode == SHARED:
            self._call([self.workers_key], self._argv("leave")).addErrback(lambda _: None)
        closing = self.backend.close()
        if isinstance(closing, Deferred):
            closing.addErrback(lambda _: None)

    def register(self, manager: SharedScopeManager) -> None:
        """Know *manager* (to scale it and write its holds back after an outage)."""
        if manager.scope_id is not None:
            self._managers[manager.scope_id] = manager
            manager.scale(self.workers if self.mode == FALLBACK else 1)

    # Store calls

    def _argv(self, op: str, *rest: str) -> list[str]:
        return [op, "", self.worker_id, fmt(self.options.worker_ttl), *rest]

    def _keys(self, scope_ids: Sequence[str]) -> list[str]:
        keys = [self.workers_key]
        for scope_id in scope_ids:
            keys += [f"{self.prefix}s:{scope_id}", f"{self.prefix}l:{scope_id}"]
        return keys

    def _call(self, keys: list[str], argv: list[str]) -> Deferred[list[str]]:
        self.calls += 1
        d = self.backend.run(keys, argv)
        d.addTimeout(self.options.timeout, self.clock)
        d.addCallbacks(self._succeeded, self._failed)
        return d

    def _succeeded(self, reply: list[str]) -> list[str]:
        self._failures = 0
        self._last_success = self.clock.seconds()
        if len(reply) > 1:
            self.workers = max(1, int(reply[1]))
        return reply

    def _failed(self, failure: Any) -> Any:
        self._failures += 1
        now = self.clock.seconds()
        if self.mode == SHARED and (
            self._failures >= self.options.failures
            or now - self._last_success >= self.options.fallback_after
        ):
            self._enter_fallback(now, failure)
        elif self.mode == SHARED and not self._beat_in_flight:
            # Probe at once: a second failure soon after decides the fallback.
            self._schedule_beat(0.0)
        return failure

    # Modes

    def _enter_fallback(self, now: float, failure: Any) -> None:
        self.mode = FALLBACK
        self.fallbacks += 1
        self.fell_back_at = now
        logger.warning(
            "slotkit: the shared throttling store failed (%s); throttling locally at 1/%d "
            "of the shared limits until it answers again",
            failure.getErrorMessage() if hasattr(failure, "getErrorMessage") else failure,
            self.workers,
        )
        for manager in self._managers.values():
            manager.scale(self.workers)
        # Requests waiting on the store move to the fallback now.
        for sleep in list(self._sleeps):
            self._end_sleep(sleep, "fallback")
        if self._on_mode is not None:
            self._on_mode(FALLBACK)
        self._schedule_beat(self.options.probe)

    def _resync(self) -> None:
        """The store answered again: write back known holds, free orphans, go shared."""
        now = self.clock.seconds()
        holds = [
            (scope_id, manager)
            for scope_id, manager in self._managers.items()
            if manager.fallback.hold_until > now
        ]
        for scope_id, manager in holds:
            self._send_backoff([scope_id], [manager], manager.fallback.hold_until - now, 0.0)
        for keys, concs, lease in self._orphans:
            self._call(keys, self._argv("release", lease, str(len(concs)), *concs)).addErrback(
                lambda _: None
            )
        self._orphans.clear()
        self.mode = SHARED
        self.resyncs += 1
        for manager in self._managers.values():
            manager.scale(1)
        self.backend.subscribe(self.channel, self._event)
        logger.info("slotkit: the shared throttling store is back; throttling is shared again")
        if self._on_mode is not None:
            self._on_mode(SHARED)

    def _schedule_beat(self, delay: float) -> None:
        if self._closed:
            return
        if self._beat_call is not None and self._beat_call.active():
            self._beat_call.cancel()
        self._beat_call = self.clock.callLater(delay, self._beat)

    def _beat(self) -> None:
        self._beat_call = None
        self._beat_in_flight = True
        d = self._call([self.workers_key], self._argv("beat"))

        def ok(_: object) -> None:
            self._beat_in_flight = False
            if self.mode == FALLBACK:
                self._resync()
            else:
                self.backend.subscribe(self.channel, self._event)
            self._schedule_beat(self.options.beat)

        def failed(_: object) -> None:
            self._beat_in_flight = False
            self._schedule_beat(self.options.probe)

        d.addCallbacks(ok, failed)

    # Events published by the script

    def _event(self, message: str) -> None:
        kind, _, scope_id = message.partition("\t")
        for sleep in list(self._sleeps):
            if kind in sleep.kinds and scope_id in sleep.scopes:
                self._end_sleep(sleep, kind)

    def _sleep(self, seconds: float, scopes: Sequence[str], kinds: Sequence[str]) -> _Sleep:
        sleep = _Sleep(Deferred(), frozenset(scopes), frozenset(kinds))
        # A cancelled request (its crawl closing) stops waiting and forgets the timer.
        sleep.deferred = Deferred(lambda _: self._forget_sleep(sleep))
        if math.isfinite(seconds):
            sleep.call = self.clock.callLater(max(0.0, seconds), self._end_sleep, sleep, "timer")
        self._sleeps.add(sleep)
        return sleep

    def _forget_sleep(self, sleep: _Sleep) -> None:
        self._sleeps.discard(sleep)
        if sleep.call is not None and sleep.call.active():
            sleep.call.cancel()

    def _end_sleep(self, sleep: _Sleep, outcome: str | None) -> None:
        if sleep not in self._sleeps:
            return
        self._sleeps.discard(sleep)
        if sleep.call is not None and sleep.call.active():
            sleep.call.cancel()
        if sleep.deferred.called:
            return
        if outcome is None:
            sleep.deferred.errback(GateClosedError("the downloader closed during a shared wait"))
        else:
            sleep.deferred.callback(outcome)

    # The path of one request

    async def reserve(
        self, request: Request, scopes: Sequence[Scope], amounts: Sequence[float | None]
    ) -> Pass:
        """Wait until the shared store (or, when it is down, the fallback) admits *request*."""
        managers = [scope.manager for scope in scopes]
        shared = [m for m in managers if isinstance(m, SharedScopeManager)]
        ids = [m.scope_id or "" for m in shared]
        amounts_of = [a for m, a in zip(managers, amounts, strict=True) if m in shared]
        ticket = Pass(ids, shared, amounts_of)
        if not shared:
            return ticket
        if self.mode == FALLBACK:
            return await self._reserve_locally(request, ticket)
        locks = [self._turns.setdefault(scope_id, DeferredLock()) for scope_id in sorted(set(ids))]
        taken: list[DeferredLock] = []
        try:
            for lock in locks:  # always in the same order: no deadlock between requests
                await maybe_deferred_to_future(lock.acquire())
                taken.append(lock)
            return await self._reserve(request, ticket, ids, shared, amounts_of)
        finally:
            for lock in reversed(taken):
                lock.release()

    async def _reserve(
        self,
        request: Request,
        ticket: Pass,
        ids: list[str],
        shared: list[SharedScopeManager],
        amounts_of: list[float | None],
    ) -> Pass:
        keys = self._keys(ids)
        while True:
            if self._closed or self._stopping:
                raise GateClosedError("the downloader closed")
            if self.mode == FALLBACK:
                return await self._reserve_locally(request, ticket)
            lease = f"{self.worker_id}:{next(self._leases)}"
            argv = self._argv(
                "acquire",
                lease,
                fmt(self.options.lease_ttl),
                fmt(self.options.horizon),
                fmt(self.options.key_ttl),
                str(len(shared)),
            )
            for manager, amount in zip(shared, amounts_of, strict=True):
                argv += self._scope_args(manager, amount)
            started = self.clock.seconds()
            self.acquires += 1
            try:
                reply = await maybe_deferred_to_future(self._call(keys, argv))
            except (GateClosedError, DeferredTimeoutError, Exception) as exc:
                if isinstance(exc, GateClosedError):
                    raise
                # The script may still have run (a frozen store that thawed):
                # give that lease back once the store answers again.
                self._orphans.append((keys, [str(m.concurrency) for m in shared], lease))
                return await self._reserve_locally(request, ticket)
            now = self.clock.seconds()
            if len(self.latencies) < 200_000:
                self.latencies.append(now - started)
            status, wait = reply[0], float(reply[2])
            late = now - started > self.options.late
            for manager, hold in zip(shared, reply[3:], strict=False):
                if float(hold) > 0:
                    manager.note_hold(now + float(hold))
            if status == "ok":
                if wait > 0:
                    due = now + wait
                    sleep = self._sleep(wait, ids, ("hold",))
                    outcome = await maybe_deferred_to_future(sleep.deferred)
                    late = late or self.clock.seconds() - due > self.options.late
                    if outcome != "timer" or (late and self.mode == SHARED):
                        # A hold arrived (or the store went down) while waiting,
                        # or the timer fired late: give the reservation back, ask again.
                        self._release_lease(ticket, lease)
                        continue
                ticket.lease = lease
                self._dispatched(ticket)
                return ticket
            kinds = ("free", "hold") if status == "full" else ("hold",)
            wait = min(wait, self.options.full_poll) if status == "full" else wait
            await maybe_deferred_to_future(self._sleep(wait, ids, kinds).deferred)

    def _scope_args(self, manager: SharedScopeManager, amount: float | None) -> list[str]:
        backoff = manager.backoff
        return [
            fmt(1.0 if amount is None else amount),
            fmt(manager.interval()),
            str(manager.concurrency),
            fmt(manager.quota if manager.quota is not None else -1.0),
            fmt(manager.window),
            fmt(manager.crawl_delay),
            fmt(backoff.delay_factor),
            fmt(backoff.min_delay),
            fmt(backoff.max_delay),
            fmt(backoff.window),
            "0",
        ]

    def _fallback_scope(self, manager: SharedScopeManager) -> Scope:
        scope_id = manager.scope_id or ""
        scope = self._fallback_scopes.get(scope_id)
        if scope is None or scope.manager is not manager.fallback:
            scope = Scope(scope_id, manager.fallback)
            self._fallback_scopes[scope_id] = scope
        return scope

    async def _reserve_locally(self, request: Request, ticket: Pass) -> Pass:
        self.fallback_requests += 1
        scopes = [self._fallback_scope(m) for m in ticket.managers]
        waiter = self._fallback_gate.try_acquire(request, scopes, ticket.amounts)
        if waiter is None:
            waiter = await maybe_deferred_to_future(
                self._fallback_gate.acquire(request, scopes, ticket.amounts, request.priority)
            )
        ticket.fallback_ticket = waiter
        ticket.sent_at = self.clock.seconds()
        return ticket

    def _dispatched(self, ticket: Pass) -> None:
        now = self.clock.seconds()
        ticket.sent_at = now
        for manager, amount in zip(ticket.managers, ticket.amounts, strict=True):
            manager.fallback.record_sent(now, amount)

    def _release_lease(self, ticket: Pass, lease: str) -> None:
        if self.mode != SHARED:
            self._orphans.append(
                (self._keys(ticket.scope_ids), [str(m.concurrency) for m in ticket.managers], lease)
            )
            return
        concs = [str(m.concurrency) for m in ticket.managers]
        self._call(
            self._keys(ticket.scope_ids), self._argv("release", lease, str(len(concs)), *concs)
        ).addErrback(lambda _: None)

    def release(self, ticket: Pass) -> None:
        """Give back what *ticket* holds (exactly once)."""
        if ticket.fallback_ticket is not None:
            waiter, ticket.fallback_ticket = ticket.fallback_ticket, None
            self._fallback_gate.release(waiter)
            return
        if ticket.lease is None:
            return
        lease, ticket.lease = ticket.lease, None
        now = self.clock.seconds()
        for manager in ticket.managers:
            manager.fallback.record_done(now)
            scope = self._fallback_scopes.get(manager.scope_id or "")
            if scope is not None:
                self._fallback_gate.poke(scope)
        self._release_lease(ticket, lease)

    # Feedback

    def backoff(self, manager: SharedScopeManager, delay: float | None, now: float) -> None:
        """Share a hold (*delay* seconds) or a backoff step (``None``) of *manager*'s scope."""
        if manager.scope_id is None or self.mode != SHARED:
            return  # the fallback manager already has it; written back on resync
        from slotkit.shared.downloader import current_pass

        ticket = current_pass.get()
        age = now - ticket.sent_at if ticket is not None else 0.0
        hold = -1.0 if delay is None else max(0.0, delay)
        self._send_backoff([manager.scope_id], [manager], hold, age)

    def _send_backoff(
        self, ids: list[str], managers: list[SharedScopeManager], hold: float, age: float
    ) -> None:
        argv = self._argv("backoff", fmt(self.options.key_ttl), str(len(ids)))
        for manager in managers:
            config = manager.backoff
            argv += [
                fmt(hold),
                fmt(max(0.0, age)),
                fmt(manager.delay),
                fmt(manager.crawl_delay),
                fmt(config.delay_factor),
                fmt(config.min_delay),
                fmt(config.max_delay),
                fmt(config.window),
            ]
        self._call(self._keys(ids), argv).addErrback(lambda _: None)

    def reconcile_quota(
        self, manager: SharedScopeManager, consumed: float | None, remaining: float | None
    ) -> None:
        """Share the server's quota figures for *manager*'s scope."""
        if manager.scope_id is None or manager.quota is None or self.mode != SHARED:
            return
        argv = self._argv(
            "quota",
            fmt(self.options.key_ttl),
            "1",
            fmt(consumed or 0.0),
            fmt(-1.0 if remaining is None else remaining),
            fmt(manager.quota),
            fmt(manager.window),
        )
        self._call(self._keys([manager.scope_id]), argv).addErrback(lambda _: None)
