"""The store side of the shared throttle: calls, piggy-backed releases, events.

:class:`StoreLink` is the base of :class:`~slotkit.shared.throttle.SharedThrottle`;
it owns everything about talking to the store and nothing about requests:

* every call carries the leases waiting to be given back (see
  :meth:`StoreLink._give_back`), so a busy crawl needs about one call per
  request;
* the heartbeat only calls the store when nothing else did for a while
  (its :class:`~slotkit.shared.heartbeat.Heartbeat`);
* failures switch to the local fallback, a successful heartbeat re-syncs
  (its :class:`~slotkit.shared.modes.ModeSwitch`);
* a failed call never ends in a ``BaseException`` (see
  :func:`slotkit.shared.client._as_store_error`).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredLock, succeed

from slotkit.shared.client import StoreDownError, _as_store_error
from slotkit.shared.fallback import LocalFallback
from slotkit.shared.heartbeat import Heartbeat
from slotkit.shared.manager import SharedScopeManager
from slotkit.shared.modes import FALLBACK, SHARED, ModeSwitch
from slotkit.shared.options import ThrottleOptions
from slotkit.shared.twin import fmt
from slotkit.shared.waits import Sleeps

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall, IReactorTime
    from twisted.python.failure import Failure

    from slotkit.shared.client import Backend
    from slotkit.shared.options import Pass

__all__ = ["FALLBACK", "SHARED", "StoreLink"]

#: A lease to give back: (lease id, its lease-set key, the scope's concurrency).
Release = tuple[str, str, str]


class StoreLink:
    """The store side of the shared throttle: calls, releases, heartbeat, modes, events."""

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
        #: Every key shares this hash tag, so a Redis Cluster keeps them on one node.
        self.prefix = f"{{{self.options.namespace}}}:"
        self.workers_key = self.prefix + "w"
        self.resync_key = self.prefix + "r"
        self.channel = self.prefix + "ev"
        #: SHARED or FALLBACK; :attr:`switch` changes it.
        self.mode = SHARED
        self.workers = 1
        #: How many live workers' ids sort before this one's (see SharedScopeManager.scale).
        self.rank = 0
        self._leases = itertools.count()
        self._failures = 0
        self._last_success = clock.seconds()
        #: Keeps this worker alive in the store; probes the store while it is away.
        self.heartbeat = Heartbeat(self)
        self._managers: dict[str, SharedScopeManager] = {}
        self.local = LocalFallback(clock)
        self.sleeps = Sleeps(clock)
        #: One reservation at a time per scope and worker: the next request of
        #: the scope asks the store only once the previous one has gone. Keeps
        #: reservations (and the leases they hold) at most N deep per scope.
        self._turns: dict[str, DeferredLock] = {}
        #: Leases waiting to ride on the next call (or to be sent after an outage).
        self._releases: list[Release] = []
        self._flush_call: IDelayedCall | None = None
        #: Events counted, and the count at each scope's last ``free``: a free
        #: arriving before a ``full`` reply is processed must not be missed.
        self.event_count = 0
        self.last_hold_event_at: float | None = None
        self.freed: dict[str, int] = {}
        #: Acquires on their way to the store, per scope (a "free" naming
        #: this worker meanwhile is for one of them).
        self.asking: Counter[str] = Counter()
        #: What the store made of this worker's backoff triggers, by outcome.
        self.backoff_outcomes: Counter[str] = Counter()
        #: When a worker last found each scope full ("need"): its releases
        #: then go at once, since workers queue for the scope.
        self._needed_at: dict[str, float] = {}
        #: Falls back when calls fail, and goes back to the store (re-sync).
        self.switch = ModeSwitch(self, on_mode)
        self._closed = False
        self._closing: Deferred[None] | None = None
        self._stopping = False
        self._stop_reason = "the downloader closed"
        #: Counters for stats and the benchmark.
        self.calls = 0
        self.acquires = 0
        self.reasks = 0
        self.late = 0
        self.fallback_requests = 0
        self.fallbacks = 0
        self.resyncs = 0
        self.fell_back_at: float | None = None
        self.resynced_at: float | None = None

    @property
    def latencies(self) -> list[float]:
        """Seconds from sending each script call to reading its reply (the backend's count)."""
        stats = getattr(self.backend, "stats", None)
        return list(stats.round_trips) if stats is not None else []

    # Life cycle

    def start(self) -> None:
        """Load the script, subscribe to the store's events and start the heartbeat."""
        prepared = self.backend.prepare()
        if isinstance(prepared, Deferred):
            prepared.addErrback(lambda _: None)
        self.backend.subscribe(self.channel, self._event)
        self.heartbeat.schedule(0.0)

    def stop_waiting(self, reason: str = "the downloader closed") -> None:
        """Fail every request still waiting for the store or the fallback (spider closing)."""
        self._stopping = True
        self._stop_reason = reason
        self.sleeps.end_all(None)
        self.local.close(reason)

    def close(self) -> Deferred[None]:
        """Stop the heartbeat, fail what still waits, give leases back, leave, disconnect.

        The Deferred fires once the backend is closed; every step is bounded
        by the call timeout, so it fires promptly whatever the store does.
        """
        if self._closing is not None:
            return self._closing
        self.stop_waiting()
        self._closed = True
        for call in (self.heartbeat.next_beat, self._flush_call, self.switch.resync_call):
            if call is not None and call.active():
                call.cancel()
        leaving: Deferred[Any] = succeed(None)
        if self.mode == SHARED or self.switch.store_back:
            # Back from a fallback the store answers again and holds leases of
            # this worker's (adopted) requests: they ride on the leave call.
            leaving = self._call([self.workers_key], "leave", [])
            leaving.addErrback(lambda _: None)

        def disconnect(_: object) -> Deferred[None] | None:
            closed = self.backend.close()
            if isinstance(closed, Deferred):
                return closed.addErrback(lambda _: None)
            return None

        self._closing = leaving.addBoth(disconnect)
        return self._closing

    def register(self, manager: SharedScopeManager) -> None:
        """Know *manager* (to scale it and write its holds back after an outage)."""
        if manager.scope_id is not None:
            self._managers[manager.scope_id] = manager
            manager.scale(self.workers, self.rank)

    # Store calls

    def _keys(self, scope_ids: Sequence[str]) -> list[str]:
        keys = [self.workers_key]
        for scope_id in scope_ids:
            keys += [f"{self.prefix}s:{scope_id}", f"{self.prefix}l:{scope_id}"]
        return keys

    def _call(self, keys: list[str], op: str, args: list[str]) -> Deferred[list[str]]:
        """Run *op*; every lease waiting to be given back rides along."""
        self.calls += 1
        riding, self._releases = self._releases, []
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        keys = list(keys)
        heartbeat = self.heartbeat.rides_on(op)
        ttl = fmt(self.options.worker_ttl) if heartbeat else ""
        head = [op, "", self.worker_id, ttl, str(len(riding))]
        for lease, lease_key, concurrency in riding:
            if lease_key not in keys:
                # The scope's state hash just before its lease set: the script
                # finds the queue of workers waiting for the scope there.
                state_key = self.prefix + "s:" + lease_key[len(self.prefix) + 2 :]
                keys += [state_key, lease_key]
            head += [lease, str(keys.index(lease_key) + 1), concurrency]
        d = self.backend.run(keys, head + args)
        d.addTimeout(self.options.timeout, self.clock)

        def failed(failure: Failure) -> Failure:
            # The releases may not have happened: they ride on a later call
            # (giving a lease back twice is harmless); nor the heartbeat.
            self._releases[:0] = riding
            if heartbeat:
                self.heartbeat.sent_at = -math.inf
            return self._failed(failure)

        d.addCallbacks(self._succeeded, failed)
        return d

    def _succeeded(self, reply: list[str]) -> list[str]:
        self._failures = 0
        self._last_success = self.clock.seconds()
        if len(reply) > 1 and reply[1]:
            # A call carrying the heartbeat (the others answer '' here).
            self.heartbeat.alive_at = self._last_success
        if len(reply) > 1 and reply[1] and self.mode == SHARED:
            # Not while falling back: a restarted store first counts only the
            # workers that found it back, and the fallback's shares must hold
            # until every worker goes back to it together.
            count, _, rank = reply[1].partition(":")
            workers, place = max(1, int(count)), int(rank or 0)
            if (workers, place) != (self.workers, self.rank):
                # A worker came or went: a call failing from now on sends its
                # request to the fallback at this worker's new share.
                self.workers, self.rank = workers, place
                for manager in self._managers.values():
                    manager.scale(workers, place)
        if self.mode == SHARED and not self._closed:
            if self.local.waits:
                # One failed call sent them to the fallback, but the store answers.
                self.local.reroute()
            # A dropped event connection (the server closed it) is opened again
            # by the first call that proves the store up, not a heartbeat later:
            # meanwhile a hold reaches this worker only with its next reply.
            # A no-op while the subscription runs.
            self.backend.subscribe(self.channel, self._event)
        return reply

    def _failed(self, failure: Failure) -> Failure:
        value = failure.value
        if not isinstance(value, Exception):
            # Never let a BaseException (a cancelled asyncio task) out: see
            # client._as_store_error.
            failure = type(failure)(_as_store_error(value or StoreDownError("no error")))
        self._failures += 1
        now = self.clock.seconds()
        if self.mode == SHARED and (
            self._failures >= self.options.failures
            or now - self._last_success >= self.options.fallback_after
        ):
            self.switch.enter_fallback(now, failure)
        elif self.mode == SHARED and not self.heartbeat.in_flight and not self._closed:
            # Probe at once: a second failure soon after decides the fallback.
            self.heartbeat.schedule(0.0)
        return failure

    def _give_back(self, ticket: Pass, lease: str, now: bool) -> None:
        """Queue *lease* for release; send it at once if *now*, else let it ride."""
        for scope_id, manager in zip(ticket.scope_ids, ticket.managers, strict=True):
            self._releases.append((lease, f"{self.prefix}l:{scope_id}", str(manager.concurrency)))
        if self.mode != SHARED or self._closed:
            return  # sent after the re-sync, or with the leave call
        # A release lingering for a call to ride on would keep a slot from
        # the workers queued for it: only the first of them is woken, and
        # its ask (which finds room) sends no "need" to hurry this one.
        recent = self.clock.seconds() - self.options.full_poll
        if now or any(self._needed_at.get(i, -math.inf) > recent for i in ticket.scope_ids):
            self._flush()
        elif self._flush_call is None:
            self._flush_call = self.clock.callLater(self.options.release_linger, self._flush)

    def _hand_on(self, scope_id: str) -> None:
        """Wake the next worker queued for *scope_id*: this one was named but does not wait.

        (Its request was admitted another way, is waiting for a quota or a
        hold, or the crawl is closing.) Releases waiting to ride go along.
        """
        if self._closed or (self.mode != SHARED and not self.switch.store_back):
            return  # (falling back but the store answers: its queues are live)
        self._call(self._keys([scope_id]), "release", ["1", "2"]).addErrback(lambda _: None)

    def _flush(self) -> None:
        self._flush_call = None
        if self._releases and self.mode == SHARED and not self._closed:
            self._call([self.workers_key], "release", []).addErrback(lambda _: None)

    # Events published by the script

    def _event(self, message: str) -> None:
        kind, _, rest = message.partition("\t")
        scope_id, _, extra = rest.partition("\t")
        self.event_count += 1
        if kind == "hold":
            now = self.clock.seconds()
            self.last_hold_event_at = now
            manager = self._managers.get(scope_id)
            if manager is not None and extra:
                # Known locally too: a request that falls back keeps to it.
                manager.note_hold(now + float(extra))
        if kind == "free":
            if extra and extra != self.worker_id:
                return  # the slot goes to the worker that waited longest for it
            self.freed[scope_id] = self.event_count
            if (
                extra
                and not self.asking.get(scope_id)
                and not self.sleeps.listening("free", scope_id)
            ):
                self._hand_on(scope_id)  # nothing here waits for it any more
                return
        if kind == "need":
            # Another worker found the scope full: give back what we keep for it.
            self._needed_at[scope_id] = self.clock.seconds()
            wanted = f"{self.prefix}l:{scope_id}"
            if any(key == wanted for _, key, _ in self._releases):
                self._flush()
            return
        self.sleeps.event(kind, scope_id)

    def _send_backoff(
        self, ids: list[str], managers: list[SharedScopeManager], hold: float, age: float
    ) -> None:
        args = [fmt(self.options.key_ttl), str(len(ids))]
        for manager in managers:
            args += manager.backoff_args(hold, age)
        d = self._call(self._keys(ids), "backoff", args)
        d.addCallback(self._count_backoff_outcomes)
        d.addErrback(lambda _: None)

    def _count_backoff_outcomes(self, reply: list[str]) -> None:
        # Per scope: "step", "dup" (part of the burst a step answered), "ramp"
        # (within rampup's target) or "held" (a hold); then the backoff delay.
        self.backoff_outcomes.update(reply[2::2])
