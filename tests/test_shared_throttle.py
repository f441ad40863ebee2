"""The shared throttle on the twin store, time on Clocks: several workers, one store.

Each worker has its own :class:`Clock` (so one can be skewed) and the store
has another; :meth:`Cluster.advance` moves them all. Coroutines run on the
asyncio reactor of pytest-twisted; :func:`settle` only lets zero-delay
callbacks run, so no real time matters.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from slotkit.gate import GateClosedError
from slotkit.registry import Scope
from slotkit.shared.client import TwinBackend
from slotkit.shared.downloader import current_pass
from slotkit.shared.manager import SharedScopeManager
from slotkit.shared.throttle import FALLBACK, SHARED, SharedThrottle, ThrottleOptions
from slotkit.shared.twin import TwinStore

DELAY = 1.0
HOLD = 3.0
TICK = 0.01
#: Long enough for a probe to find the store back and the resync grace to pass.
RESYNC = 1.5


async def settle(turns: int = 20) -> None:
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    for _ in range(turns):
        await deferLater(reactor, 0)


class Worker:
    def __init__(self, name: str, store: TwinStore, skew: float, start: float) -> None:
        self.clock = Clock()
        self.clock.advance(start + skew)
        self.backend = TwinBackend(store)
        self.throttle = SharedThrottle(
            self.backend, self.clock, name, ThrottleOptions(namespace="t", lease_ttl=60.0)
        )
        self.throttle.start()
        self.scopes: dict[str, Scope] = {}
        self.sent: list[tuple[float, str]] = []  # (store time, url)

    def scope(self, scope_id: str, **config) -> Scope:
        scope = self.scopes.get(scope_id)
        if scope is None:
            config = {"concurrency": 1, "delay": DELAY, **config}
            manager = SharedScopeManager(config, self.throttle)
            manager.bind(scope_id)
            self.throttle.register(manager)
            scope = self.scopes[scope_id] = Scope(scope_id, manager)
        return scope


class Cluster:
    """A store and its workers, with one knob for time."""

    START = 1000.0

    def __init__(self, workers: int = 2, skews: tuple[float, ...] = ()) -> None:
        self.clock = Clock()
        self.clock.advance(self.START)
        self.store = TwinStore(self.clock)
        self.workers = [
            Worker(f"w{i}", self.store, skews[i] if i < len(skews) else 0.0, self.START)
            for i in range(workers)
        ]

    def advance(self, seconds: float) -> None:
        for clock in [self.clock, *(w.clock for w in self.workers)]:
            clock.advance(seconds)

    async def run_for(self, seconds: float, step: float = TICK) -> None:
        for _ in range(round(seconds / step)):
            self.advance(step)
            await settle(3)

    def fetch(self, worker: Worker, url: str, scopes: list[Scope], amounts=None):
        """Start the shared reservation of *url*; record when (store time) it went."""
        amounts = amounts or [None] * len(scopes)

        async def go():
            ticket = await worker.throttle.reserve(Request(url), scopes, amounts)
            worker.sent.append((self.clock.seconds(), url))
            return ticket

        return asyncio.ensure_future(go())

    def close(self) -> None:
        for worker in self.workers:
            worker.throttle.close()


async def reserve_now(worker: Worker, url: str, scopes: list[Scope]):
    """Reserve *url* and wait for it (the store answers at once here)."""
    from twisted.internet.defer import Deferred

    future = asyncio.ensure_future(worker.throttle.reserve(Request(url), scopes, [None]))
    return await Deferred.fromFuture(future)


def all_sends(cluster: Cluster) -> list[float]:
    return sorted(t for w in cluster.workers for t, _ in w.sent)


@pytest_twisted.ensureDeferred
async def test_two_workers_share_one_delay():
    """Two workers sending to one scope are spaced by its delay in total, not each."""
    cluster = Cluster(2)
    futures = []
    for i in range(3):
        for w in cluster.workers:
            futures.append(
                cluster.fetch(
                    w, f"http://a/{w.throttle.worker_id}/{i}", [w.scope("a", concurrency=10)]
                )
            )
    await settle()
    await cluster.run_for(6.5)
    sends = all_sends(cluster)
    assert len(sends) == 6
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    assert min(gaps) >= DELAY - 1e-6
    assert sends[-1] - sends[0] == pytest.approx(5 * DELAY, abs=0.05)
    # One acquire per request: the reservation needs no second call.
    assert sum(w.throttle.acquires for w in cluster.workers) == 6
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_shared_concurrency_and_free_message():
    """A shared concurrency of 1 admits one request at a time; a release wakes the other worker."""
    cluster = Cluster(2)
    a, b = cluster.workers
    first = cluster.fetch(a, "http://c/1", [a.scope("c", delay=0.0)])
    await settle()
    second = cluster.fetch(b, "http://c/2", [b.scope("c", delay=0.0)])
    await settle()
    assert first.done()
    assert not second.done()
    a.throttle.release(first.result())
    await settle()
    assert second.done(), "the free message woke the waiting worker at once"
    assert b.throttle.acquires == 2
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_freed_slot_wakes_the_worker_that_waited_longest_only():
    """With concurrency binding, a release does not set every waiting worker asking again."""
    cluster = Cluster(4)
    holder, *waiters = cluster.workers
    first = cluster.fetch(holder, "http://c/0", [holder.scope("c", delay=0.0)])
    await settle()
    pending = {}
    for w in waiters:  # they find the scope full in this order
        pending[w.throttle.worker_id] = cluster.fetch(
            w, f"http://c/{w.throttle.worker_id}", [w.scope("c", delay=0.0)]
        )
        await settle()
    assert not any(f.done() for f in pending.values())
    asks = sum(w.throttle.acquires for w in waiters)
    assert asks == 3
    ticket, order = first.result(), []
    for _ in waiters:
        owner = ticket.lease.split(":")[0] if ticket.lease else holder.throttle.worker_id
        next(w for w in cluster.workers if w.throttle.worker_id == owner).throttle.release(ticket)
        await settle()
        done = [wid for wid, f in pending.items() if f.done() and wid not in order]
        assert len(done) == 1, "one freed slot, one worker admitted"
        order += done
        ticket = pending[done[0]].result()
    assert order == ["w1", "w2", "w3"], "first come, first served"
    # One ask on finding the scope full, one when woken: no worker asked in vain.
    assert sum(w.throttle.acquires for w in waiters) == 6
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_woken_worker_that_cannot_use_the_slot_passes_it_on():
    """Woken for scope a while its request also waits for a full scope b: the next a-waiter goes."""
    cluster = Cluster(4)
    w_a, w_b, both, only_a = cluster.workers
    holding_a = cluster.fetch(w_a, "http://a/0", [w_a.scope("a", delay=0.0)])
    holding_b = cluster.fetch(w_b, "http://b/0", [w_b.scope("b", delay=0.0)])
    await settle()
    blocked = cluster.fetch(
        both, "http://ab/1", [both.scope("a", delay=0.0), both.scope("b", delay=0.0)]
    )
    await settle()
    waiting = cluster.fetch(only_a, "http://a/1", [only_a.scope("a", delay=0.0)])
    await settle()
    w_a.throttle.release(holding_a.result())  # names "both", first in a's queue
    await settle()
    assert not blocked.done(), "b is still full"
    assert waiting.done(), "the slot of a went on to the next waiter at once"
    w_b.throttle.release(holding_b.result())
    only_a.throttle.release(waiting.result())
    await settle()
    assert blocked.done()
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_release_wakes_the_waiter_while_rampup_holds_concurrency_down():
    """Rampup starts a scope of concurrency 4 at 1: its releases must still wake a waiter."""
    cluster = Cluster(2)
    a, b = cluster.workers
    config = {"concurrency": 4, "delay": 0.0, "rampup": {"window": 10.0}}
    first = cluster.fetch(a, "http://r/1", [a.scope("r", **config)])
    await settle()
    second = cluster.fetch(b, "http://r/2", [b.scope("r", **config)])
    await settle()
    assert first.done()
    assert not second.done(), "rampup's concurrency of 1 is taken"
    a.throttle.release(first.result())
    await settle()
    assert second.done(), "woken at once, not a full_poll later"
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_dead_waiter_does_not_keep_a_freed_slot():
    """A worker that queued for a scope and then went silent is passed over."""
    cluster = Cluster(3)
    holder, gone, alive = cluster.workers
    first = cluster.fetch(holder, "http://c/0", [holder.scope("c", delay=0.0)])
    await settle()
    lost = cluster.fetch(gone, "http://c/gone", [gone.scope("c", delay=0.0)])
    await settle()
    gone.throttle.close()  # leaves the store: no longer a live worker
    await settle()
    waiting = cluster.fetch(alive, "http://c/alive", [alive.scope("c", delay=0.0)])
    await settle()
    holder.throttle.release(first.result())
    await settle()
    assert waiting.done(), "the live waiter got the slot at once"
    assert lost.done()  # failed by the close
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_hold_stops_every_worker_and_cancels_reservations():
    """A Retry-After hold from one worker cancels the others' reservations and holds them."""
    cluster = Cluster(2)
    a, b = cluster.workers
    ta = await reserve_now(a, "http://h/0", [a.scope("h", concurrency=5)])
    pending = cluster.fetch(b, "http://h/1", [b.scope("h", concurrency=5)])
    await settle()
    assert not pending.done()  # reserved for DELAY from now
    token = current_pass.set(ta)
    a.scopes["h"].manager.record_backoff(HOLD, a.clock.seconds())
    current_pass.reset(token)
    await settle()
    held_at = cluster.clock.seconds()
    await cluster.run_for(HOLD + 0.5)
    assert pending.done()
    ((went, _),) = b.sent
    assert went >= held_at + HOLD - 1e-6
    # The worker that did not see the 429 still knows the deadline (for a fallback).
    assert b.scopes["h"].manager.fallback.hold_until == pytest.approx(held_at + HOLD)
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_backoff_step_moves_the_other_workers_reservations_out():
    """A reservation granted before another worker's backoff step does not go at the old pace."""
    cluster = Cluster(2)
    a, b = cluster.workers
    ta = await reserve_now(a, "http://s/0", [a.scope("s", concurrency=5)])
    a_went = cluster.clock.seconds()
    pending = cluster.fetch(b, "http://s/1", [b.scope("s", concurrency=5)])
    await settle()
    assert not pending.done()  # reserved for DELAY after a's request
    await cluster.run_for(0.2)
    token = current_pass.set(ta)
    a.scopes["s"].manager.record_backoff(None, a.clock.seconds())  # a 503: one step, 1 s -> 2 s
    current_pass.reset(token)
    await cluster.run_for(3.5)
    assert pending.done()
    ((went, _),) = b.sent
    # The new interval from the trigger (0.2 s after a's request), as in one process.
    assert went >= a_went + 0.2 + 2 * DELAY - 1e-6
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_backoff_steps_are_deduplicated_across_workers():
    """Two workers reporting a 429 for requests sent before the step count one step."""
    cluster = Cluster(2)
    a, b = cluster.workers
    ta = await reserve_now(a, "http://s/0", [a.scope("s", concurrency=5)])
    await cluster.run_for(DELAY)
    tb = await reserve_now(b, "http://s/1", [b.scope("s", concurrency=5)])
    await cluster.run_for(0.2)
    for worker, ticket in ((a, ta), (b, tb)):
        token = current_pass.set(ticket)
        worker.scopes["s"].manager.record_backoff(None, worker.clock.seconds())
        current_pass.reset(token)
        await cluster.run_for(0.01)
    state = cluster.store.hashes["{t}:s:s"]
    assert float(state["bo"]) == 2.0  # one step: max(1, 1 * 2), not 4
    # What the store made of each trigger, for the crawl stats.
    assert a.throttle.backoff_outcomes == {"step": 1}
    assert b.throttle.backoff_outcomes == {"dup": 1}
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_quota_windows_are_aligned_for_all_workers():
    """A quota of 2 per 10 s window is shared; the third request waits for the next window."""
    cluster = Cluster(2)
    a, b = cluster.workers
    spec = {"delay": 0.0, "concurrency": 10, "quota": 2.0, "window": 10.0}
    futures = [
        cluster.fetch(w, f"http://q/{i}", [w.scope("q", **spec)]) for i, w in enumerate([a, b, a])
    ]
    await settle()
    assert [f.done() for f in futures] == [True, True, False]
    await cluster.run_for(10.0, step=0.1)
    assert futures[2].done()
    (late, _) = sorted(a.sent)[-1]
    assert late % 10.0 == pytest.approx(0.0, abs=0.11)  # the start of the store's next window
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_quota_the_server_reports_spent_opens_at_its_reset_for_every_worker():
    """``remaining=0, reset=2`` holds every worker 2 s, not to the end of a 60 s window.

    The feedback applies the reset's hold first, then the server's count; the
    count must not keep the store's window shut after the server counts afresh.
    """
    cluster = Cluster(2)
    a, b = cluster.workers
    spec = {"delay": 0.0, "concurrency": 10, "quota": 100.0, "window": 60.0}
    ta = await reserve_now(a, "http://q/0", [a.scope("q", **spec)])
    token = current_pass.set(ta)
    manager = a.scopes["q"].manager
    manager.record_backoff(2.0, a.clock.seconds())
    manager.record_quota_reset(2.0, a.clock.seconds())
    manager.reconcile_quota(None, 0.0, a.clock.seconds())
    current_pass.reset(token)
    await settle()
    held_at = cluster.clock.seconds()
    pending = cluster.fetch(b, "http://q/1", [b.scope("q", **spec)])
    await cluster.run_for(3.0, step=0.1)
    assert pending.done()
    ((went, _),) = b.sent
    assert held_at + 2.0 - 1e-6 <= went <= held_at + 2.2
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_larger_crawl_delay_wins():
    """A worker that knows a robots.txt Crawl-delay slows every worker to it."""
    cluster = Cluster(2)
    a, b = cluster.workers
    a.scope("r", concurrency=5, delay=0.1).manager.crawl_delay = 2.0
    cluster.fetch(a, "http://r/0", [a.scopes["r"]])
    await settle()
    cluster.fetch(b, "http://r/1", [b.scope("r", concurrency=5, delay=0.1)])
    await settle()
    await cluster.run_for(2.5)
    sends = all_sends(cluster)
    assert sends[1] - sends[0] == pytest.approx(2.0, abs=0.02)
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_clock_skew_does_not_matter():
    """A worker whose clock is 2 s ahead gets the same spacing: replies are relative waits."""
    cluster = Cluster(2, skews=(0.0, 2.0))
    futures = []
    for i in range(3):
        for w in cluster.workers:
            futures.append(
                cluster.fetch(
                    w, f"http://k/{w.throttle.worker_id}/{i}", [w.scope("k", concurrency=10)]
                )
            )
    await settle()
    await cluster.run_for(6.5)
    sends = all_sends(cluster)
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    assert len(sends) == 6
    assert min(gaps) >= DELAY - 1e-6
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_store_down_falls_back_at_one_nth_and_resyncs():
    """A killed store: fallback at once at 1/N of the limits, known holds kept, then re-sync."""
    cluster = Cluster(2)
    a, _ = cluster.workers
    await cluster.run_for(1.1)  # heartbeats: both workers count, N = 2
    assert a.throttle.workers == 2
    t0 = await reserve_now(a, "http://d/0", [a.scope("d", concurrency=4)])
    a.throttle.release(t0)
    token = current_pass.set(t0)
    a.scopes["d"].manager.record_backoff(HOLD, a.clock.seconds())
    current_pass.reset(token)
    held_until = a.clock.seconds() + HOLD
    a.backend.down = True
    down_at = a.clock.seconds()
    futures = [cluster.fetch(a, f"http://d/{i}", [a.scopes["d"]]) for i in range(1, 4)]
    await settle()
    await cluster.run_for(0.6)  # the probes after the first failure decide
    assert a.throttle.mode == FALLBACK
    assert a.throttle.fell_back_at - down_at <= 1.0
    fallback = a.scopes["d"].manager.fallback
    assert fallback.delay == 2 * DELAY  # 1/N with N = 2
    assert fallback.concurrency == 2
    await cluster.run_for(HOLD + 2 * DELAY + 0.5)
    assert len(a.sent) == 2, "the fallback concurrency is 1/N of 4"
    for f in futures[:2]:
        a.throttle.release(f.result())
    await cluster.run_for(2 * DELAY)
    sends = sorted(t for t, _ in a.sent)
    assert len(sends) == 3, "no request lost"
    assert sends[0] >= held_until - 1e-6, "the known hold is honoured without the store"
    assert min(y - x for x, y in itertools.pairwise(sends)) >= 2 * DELAY - 1e-6
    a.throttle.release(futures[2].result())
    a.backend.down = False
    await cluster.run_for(RESYNC)
    assert a.throttle.mode == SHARED
    assert a.throttle.resyncs == 1
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_requests_waiting_in_the_fallback_ask_the_store_once_it_is_back():
    """After the re-sync the fallback keeps 1/N, and what waits in it goes through the store.

    A probe saw 42-48 requests in a second around the re-sync against a
    shared 20/s: the fallback was put back at the full limits while each
    worker still had requests waiting in it, on top of what the store handed out.
    """
    cluster = Cluster(2)
    await cluster.run_for(1.1)  # heartbeats: both workers count, N = 2
    await fall_back(cluster, "r", count=6, concurrency=20)
    await cluster.run_for(0.5)  # a second fallback dispatch each, 2 * DELAY apart
    in_fallback = len(all_sends(cluster))
    assert 2 <= in_fallback < 12
    for w in cluster.workers:
        w.backend.down = False
    await cluster.run_for(RESYNC)
    assert all(w.throttle.mode == SHARED for w in cluster.workers)
    resynced = max(w.throttle.resynced_at or 0.0 for w in cluster.workers)
    for w in cluster.workers:
        assert w.scopes["r"].manager.fallback.delay == 2 * DELAY, "the fallback stays at 1/N"
        assert not w.throttle.local.waits
    await cluster.run_for(12 * DELAY)
    sends = all_sends(cluster)
    assert len(sends) == 12, "no request lost"
    after = [t for t in sends if t > resynced]
    assert len(after) >= 6
    # One schedule for both workers again: one request per DELAY, not two,
    # and the first one a DELAY after the fallback's last (the store was told).
    paced = sends[in_fallback - 1 :]
    assert min(b - a for a, b in itertools.pairwise(paced)) >= DELAY - 1e-6
    cluster.close()


def test_fallback_splits_concurrency_exactly_by_rank():
    """Each worker's fallback share; ranks order the workers by id, so shares add up."""
    manager = SharedScopeManager({"concurrency": 5, "delay": 0.5})
    shares = []
    for rank in range(2):
        manager.scale(2, rank)
        shares.append(manager.fallback.concurrency)
    assert shares == [3, 2]
    manager = SharedScopeManager({"concurrency": 2})
    shares = []
    for rank in range(3):
        manager.scale(3, rank)
        shares.append(manager.fallback.concurrency)
    assert shares == [1, 1, 0], "never one slot each: that would be 3 in flight"
    assert manager.fallback.delay == 0.0
    manager.set_concurrency(6)  # keeps its workers and rank
    assert manager.fallback.concurrency == 2


@pytest_twisted.ensureDeferred
async def test_a_scope_made_before_the_worker_count_is_known_gets_its_share():
    """Review: a scope registered before the first reply kept a fallback at 1/1 of the limits.

    A single failed call in shared mode sends its request to the fallback,
    so its share must follow the live worker count as replies bring it.
    """
    cluster = Cluster(2)
    managers = [w.scope("early", concurrency=4, delay=DELAY).manager for w in cluster.workers]
    await cluster.run_for(1.1)
    assert [m.fallback.concurrency for m in managers] == [2, 2]
    assert [m.fallback.delay for m in managers] == [2 * DELAY, 2 * DELAY]
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_fewer_slots_than_workers_never_fail_open():
    """Concurrency 2 over 3 workers: 2 in flight while the store is down, then the rest.

    A probe saw 4 in flight with 4 workers and a shared concurrency of 2:
    every worker got at least one slot.
    """
    cluster = Cluster(3)
    await cluster.run_for(1.1)
    assert sorted(w.throttle.rank for w in cluster.workers) == [0, 1, 2]
    futures = await fall_back(cluster, "c", count=2, concurrency=2, delay=0.0)
    assert len(all_sends(cluster)) == 2, "the shared concurrency holds in the fallback"
    for w in cluster.workers:
        w.backend.down = False
    await cluster.run_for(RESYNC)
    assert all(w.throttle.mode == SHARED for w in cluster.workers)
    # The store took on the two requests still in flight: the others wait.
    sent = [f for f in futures if f.done()]
    assert len(sent) == 2, "the store counted the fallback's requests in flight"
    for f in sent:
        owner = next(w for w in cluster.workers if f in futures_of(cluster, w, futures))
        owner.throttle.release(f.result())
    await cluster.run_for(1.0)
    assert len([f for f in futures if f.done()]) == 4, "no request lost"
    cluster.close()


def futures_of(cluster: Cluster, worker: Worker, futures: list) -> list:
    """The futures *worker* started (two per worker, in worker order)."""
    index = cluster.workers.index(worker)
    return futures[2 * index : 2 * index + 2]


@pytest_twisted.ensureDeferred
async def test_workers_go_back_to_the_store_together():
    """The first worker to find the store back sets one moment for all of them."""
    cluster = Cluster(2)
    await cluster.run_for(1.1)
    a, b = cluster.workers
    for w in cluster.workers:
        w.backend.down = True
        cluster.fetch(w, f"http://t/{w.throttle.worker_id}", [w.scope("t")])
    await settle()
    await cluster.run_for(1.0)
    assert all(w.throttle.mode == FALLBACK for w in cluster.workers)
    a.backend.down = False
    await cluster.run_for(0.3)
    assert a.throttle.mode == FALLBACK, "a waits for the others"
    b.backend.down = False
    await cluster.run_for(RESYNC)
    assert a.throttle.mode == b.throttle.mode == SHARED
    assert a.throttle.resynced_at == pytest.approx(b.throttle.resynced_at, abs=2 * TICK)
    cluster.close()


async def restart_store_before_the_moment(cluster: Cluster) -> None:
    """Worker a finds the store back and learns a moment; the store then restarts
    empty before it, and both workers find the new one (b never saw the first)."""
    a, b = cluster.workers
    a.backend.down = False
    await cluster.run_for(0.3)
    assert a.throttle.switch.store_back, "a learned a moment and told the store its requests"
    a.backend.down = True
    cluster.store.hashes.clear()
    cluster.store.zsets.clear()
    await cluster.run_for(0.3)
    a.backend.down = b.backend.down = False


@pytest_twisted.ensureDeferred
async def test_a_store_restarted_before_the_moment_makes_a_new_one():
    """Re-test probe: Redis restarted twice in a second; the one worker that had
    learned the moment from the first restart went back at it, alone on a
    store that knew nothing of the others' fallbacks (4 in flight against 2)."""
    cluster = Cluster(2)
    await cluster.run_for(1.1)
    a, b = cluster.workers
    futures = await fall_back(cluster, "t", concurrency=2, delay=0.0)
    sent = [future for future in futures if future.done()]
    await restart_store_before_the_moment(cluster)
    await cluster.run_for(0.6)  # a's old moment passes
    assert a.throttle.mode == FALLBACK, "a waits for a moment the new store knows"
    await cluster.run_for(RESYNC)
    assert a.throttle.mode == b.throttle.mode == SHARED
    assert a.throttle.resynced_at == pytest.approx(b.throttle.resynced_at, abs=3 * TICK)
    # Review: a had told only the dead store of its request in flight.
    assert len(leases(cluster, "t")) == len(sent) == 2, "the new store knows both"
    more = [
        cluster.fetch(w, f"http://t/more/{w.throttle.worker_id}", [w.scope("t")]) for w in (a, b)
    ]
    await cluster.run_for(0.3)
    assert not any(future.done() for future in more), "no slot beyond the concurrency of 2"
    cluster.close()


def leases(cluster: Cluster, scope_id: str) -> set[str]:
    """The leases the store holds for *scope_id*."""
    return set(cluster.store.zsets.get(f"{{t}}:l:{scope_id}", {}))


async def fall_back(cluster: Cluster, scope_id: str, count: int = 1, **config) -> list:
    """Take the store down and start *count* requests per worker, through the fallback."""
    futures = []
    for w in cluster.workers:
        w.backend.down = True
        scope = w.scope(scope_id, **config)
        futures += [
            cluster.fetch(w, f"http://{scope_id}/{w.throttle.worker_id}/{i}", [scope])
            for i in range(count)
        ]
    await settle()
    await cluster.run_for(2.0)
    assert all(w.throttle.mode == FALLBACK for w in cluster.workers)
    return futures


async def lone_worker_in_fallback(scope_id: str, count: int = 1, **config) -> tuple:
    """One worker that knew the store, now falling back with *count* requests started."""
    cluster = Cluster(1)
    await cluster.run_for(1.1)
    futures = await fall_back(cluster, scope_id, count=count, **config)
    return cluster, cluster.workers[0], futures


async def store_back_in_grace(cluster: Cluster) -> None:
    """Bring the store back and run until every worker found it, before the switch."""
    for w in cluster.workers:
        w.backend.down = False
    await cluster.run_for(0.6)
    assert all(
        w.throttle.mode == FALLBACK and w.throttle.switch.store_back for w in cluster.workers
    )


@pytest_twisted.ensureDeferred
async def test_closing_in_the_grace_gives_adopted_leases_back():
    """Review: a worker closing before the switch left its adopted lease for lease_ttl."""
    cluster = Cluster(2)
    await cluster.run_for(1.1)
    a = cluster.workers[0]
    futures = await fall_back(cluster, "s", concurrency=2, delay=0.0)
    await store_back_in_grace(cluster)
    assert len(leases(cluster, "s")) == 2, "both fallback requests were told to the store"
    a.throttle.release(futures[0].result())
    await a.throttle.close()
    await settle()
    assert leases(cluster, "s") == {futures[1].result().lease}
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_an_adopt_that_failed_is_told_again():
    """Review: the store flapped during the grace; the request it missed is told at the switch."""
    cluster, a, (first,) = await lone_worker_in_fallback("x", concurrency=2, delay=0.0)
    a.throttle.release(first.result())
    await store_back_in_grace(cluster)
    a.backend.down = True  # flaps: the adopt of the next request fails
    second = cluster.fetch(a, "http://x/1", [a.scopes["x"]])
    await settle()
    ticket = second.result()
    assert not ticket.adopted
    a.backend.down = False
    await cluster.run_for(3.0)
    assert a.throttle.mode == SHARED
    assert ticket.lease in leases(cluster, "x")
    a.throttle.release(ticket)
    await settle()
    assert leases(cluster, "x") == set()
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_waiter_admitted_in_the_turn_of_the_switch_asks_the_store():
    """Review: granted by the fallback and sent to the store in one turn, it went unannounced."""
    cluster, a, (first, second) = await lone_worker_in_fallback(
        "y", count=2, concurrency=1, delay=0.0
    )
    assert first.done()
    assert not second.done()
    await store_back_in_grace(cluster)
    a.throttle.release(first.result())  # grants the waiter...
    a.throttle.switch.resync()  # ...and the switch comes in the same turn
    await settle()
    ticket = second.result()
    assert ticket.fallback_ticket is None, "it went through the store"
    assert leases(cluster, "y") == {ticket.lease}
    third = cluster.fetch(a, "http://y/2", [a.scopes["y"]])
    await settle()
    await cluster.run_for(0.2)
    assert not third.done(), "the store's only slot is taken"
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_beat_answered_after_close_starts_nothing():
    """Review: a late beat reply adopted leases and armed the switch after close."""
    from twisted.internet.defer import Deferred

    cluster, a, (future,) = await lone_worker_in_fallback("z", concurrency=2, delay=0.0)
    a.backend.down = False
    answer = a.backend.run

    def late(keys, argv):
        d: Deferred = Deferred()
        reply = answer(keys, argv)
        a.clock.callLater(0.05, lambda: reply.chainDeferred(d))
        return d

    a.backend.run = late
    for _ in range(100):
        cluster.advance(0.01)
        await settle(2)
        if a.throttle.heartbeat.in_flight:
            break
    assert a.throttle.heartbeat.in_flight
    a.throttle.close()
    cluster.advance(0.06)
    await settle()
    assert a.throttle.switch.resync_call is None
    assert not future.result().adopted
    assert leases(cluster, "z") == set()
    cluster.close()


@pytest.mark.parametrize("restarted", [False, True])
@pytest_twisted.ensureDeferred
async def test_quota_spent_by_the_fallback_counts_in_the_store(restarted):
    """Probe: the window of the switch back got 41 requests against a quota of 20.

    The fallbacks spend 1/N of the quota each; the store is told, so what
    waited for the store does not get a whole quota on top in that window.
    Review: told to a store that then restarted before the moment, the units
    must be told to the new one too.
    """
    cluster = Cluster(2)
    await cluster.run_for(1.1)  # store time 1001.1: the 10 s window [1000, 1010)
    await fall_back(cluster, "q", count=3, concurrency=10, delay=0.0, quota=4, window=10.0)
    assert len(all_sends(cluster)) == 4, "2 each: half the quota per worker"
    if restarted:
        await restart_store_before_the_moment(cluster)
    else:
        for w in cluster.workers:
            w.backend.down = False
    await cluster.run_for(RESYNC + 0.6)
    assert all(w.throttle.mode == SHARED for w in cluster.workers)
    await cluster.run_for(1009.5 - cluster.clock.seconds())
    assert len(all_sends(cluster)) == 4, "the window's quota was spent by the fallbacks"
    await cluster.run_for(2.0)
    assert len(all_sends(cluster)) == 6, "no request lost"
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_frozen_store_falls_back_within_a_second():
    """A store that stops answering: calls time out and the worker falls back within 1 s."""
    cluster = Cluster(1)
    (a,) = cluster.workers
    await cluster.run_for(0.1)
    a.backend.frozen = True
    frozen_at = a.clock.seconds()
    future = cluster.fetch(a, "http://f/0", [a.scope("f")])
    await settle()
    assert not future.done()
    await cluster.run_for(1.0)
    assert future.done(), "the request went through the local fallback"
    assert a.throttle.mode == FALLBACK
    assert a.throttle.fell_back_at - frozen_at <= 1.0
    a.throttle.release(future.result())
    a.backend.frozen = False
    await cluster.run_for(RESYNC)
    assert a.throttle.mode == SHARED
    # The timed-out acquire's lease is released after the re-sync.
    assert not cluster.store.zsets.get("{t}:l:f")
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_request_cancelled_while_its_reservation_waits_gives_the_lease_back():
    """A fetch cancelled after the store reserved its place (the lease taken, the
    worker sleeping until its time) gives the lease back: it kept the scope's only
    slot from every worker until the lease expired (60 s here)."""
    cluster = Cluster(2)
    a, b = cluster.workers
    first = cluster.fetch(a, "http://c/1", [a.scope("c", concurrency=1, delay=1.0)])
    while not first.done():
        cluster.advance(0.1)
        await settle(20)
    a.throttle.release(first.result())
    await settle()
    second = cluster.fetch(a, "http://c/2", [a.scope("c")])
    await settle()
    assert not second.done()  # reserved for one delay on: sleeping with its lease
    second.cancel()
    await settle()
    third = cluster.fetch(b, "http://c/3", [b.scope("c", concurrency=1, delay=1.0)])
    for _ in range(50):
        cluster.advance(0.1)
        await settle(20)
    assert third.done()
    b.throttle.release(third.result())
    cluster.close()


def answer_acquires(
    worker: Worker, latency: float = 0.0, change: Callable[[Any], Any] | None = None
) -> None:
    """Make *worker*'s store answer *latency* seconds late, acquires passed through *change*."""
    run = worker.backend.run

    def answer(keys: Any, argv: Any) -> Deferred[Any]:
        reply = run(keys, argv)
        if change is not None and argv[0] == "acquire":
            reply.addCallback(change)
        if not latency:
            return reply
        late: Deferred[Any] = Deferred()
        reply.addBoth(lambda r: worker.clock.callLater(latency, late.callback, r))
        return late

    worker.backend.run = answer  # type: ignore[method-assign]


def reserve(worker: Worker, url: str, scope: Scope) -> asyncio.Future[Any]:
    return asyncio.ensure_future(worker.throttle.reserve(Request(url), [scope], [None]))


@pytest_twisted.ensureDeferred
async def test_a_cancel_as_the_scopes_turn_is_handed_over_gives_the_turn_back():
    """Requests of a scope take turns asking the store; one cancelled in the
    very turn it got its turn left the turn taken, and the scope stuck for good."""
    cluster = Cluster(1)
    (worker,) = cluster.workers
    scope = worker.scope("a", concurrency=10, delay=1.0)
    first = reserve(worker, "http://a/1", scope)
    await settle(3)
    assert first.done()
    reserve(worker, "http://a/2", scope)
    victim = reserve(worker, "http://a/3", scope)
    await settle(3)
    turn = worker.throttle._turns["a"]
    turn.waiting[0].addCallback(lambda lock: (victim.cancel(), lock)[1])
    await cluster.run_for(1.1, 0.05)
    assert victim.cancelled()
    assert not turn.locked
    after = reserve(worker, "http://a/4", scope)
    await cluster.run_for(3.0, 0.1)
    assert after.done()
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_cancel_as_the_fallback_admits_gives_the_place_back():
    """The same in the fallback gate: a place admitted in the turn of a cancel was kept."""
    cluster = Cluster(1)
    (worker,) = cluster.workers
    scope = worker.scope("a", concurrency=1, delay=0.0)
    throttle = worker.throttle
    worker.backend.down = True
    throttle.switch.enter_fallback(cluster.clock.seconds(), Failure(ConnectionError("down")))
    first = reserve(worker, "http://a/1", scope)
    await settle(3)
    victim = reserve(worker, "http://a/2", scope)
    await settle(3)
    (waiting,) = list(throttle.local.waits)
    waiting.addCallback(lambda waiter: (victim.cancel(), waiter)[1])
    throttle.release(first.result())
    await cluster.run_for(0.1)
    assert victim.cancelled()
    after = reserve(worker, "http://a/3", scope)
    await cluster.run_for(2.0, 0.1)
    assert after.done()
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_reply_arriving_after_the_close_reserves_nothing():
    """An acquire on its way when the spider closes ends its request: it used to sleep
    out the reply's wait and return a reservation (sent after the close)."""
    cluster = Cluster(1)
    (worker,) = cluster.workers
    scope = worker.scope("a", concurrency=5, delay=10.0)
    first = reserve(worker, "http://a/1", scope)
    await cluster.run_for(0.1)
    assert first.done()
    answer_acquires(worker, latency=0.05)
    second = reserve(worker, "http://a/2", scope)
    await settle(3)
    assert worker.throttle.asking
    worker.throttle.stop_waiting("the spider closed (shutdown)")
    await cluster.run_for(0.2)
    assert second.done()
    assert isinstance(second.exception(), GateClosedError)
    cluster.close()


@pytest.mark.parametrize(
    "mangle",
    [lambda reply: reply[:2], lambda reply: [reply[0], reply[1], "soon", *reply[3:]]],
    ids=["truncated", "not-a-number"],
)
@pytest_twisted.ensureDeferred
async def test_an_odd_acquire_reply_gives_the_lease_back_and_goes_locally(
    mangle: Any, caplog: pytest.LogCaptureFixture
):
    """A reply that is not the script's (a proxy, another script behind the SHA) raised a
    bare IndexError/ValueError out of reserve and left the lease taken in the store."""
    cluster = Cluster(2)
    worker, other = cluster.workers
    scope = worker.scope("a", concurrency=1, delay=0.0)
    run = worker.backend.run
    answer_acquires(worker, change=mangle)
    mine = reserve(worker, "http://a/1", scope)
    await cluster.run_for(0.1)
    assert mine.done()
    assert mine.exception() is None
    assert "which is not what slotkit's script returns" in caplog.text
    worker.backend.run = run  # type: ignore[method-assign]
    worker.throttle.release(mine.result())
    theirs = reserve(other, "http://a/2", other.scope("a", concurrency=1, delay=0.0))
    await cluster.run_for(2.0, 0.1)
    assert theirs.done()  # the store holds no lease of the odd call
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_store_answering_oddly_is_fallen_back_from_not_asked_in_a_loop():
    """Every acquire answered oddly (another script behind the SHA): the worker falls
    back as on failures. Staying shared, each good reply (the lease's release) sent the
    waiting request straight back to ask: 250 acquires a second, replies 2 ms away."""
    cluster = Cluster(1)
    (worker,) = cluster.workers
    scope = worker.scope("a", concurrency=1, delay=0.0)
    answer_acquires(worker, latency=0.002, change=lambda reply: reply[:2])
    first = reserve(worker, "http://a/1", scope)
    await cluster.run_for(0.1, 0.002)
    assert first.done()
    acquires = worker.throttle.acquires
    second = reserve(worker, "http://a/2", scope)
    await cluster.run_for(1.0, 0.002)
    assert worker.throttle.acquires - acquires < 5
    worker.throttle.release(first.result())
    await cluster.run_for(0.2, 0.002)
    assert second.done()
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_close_fails_waiting_requests_and_cancels_timers():
    """Closing the throttle fails what waits for the store and leaves no timer behind."""
    cluster = Cluster(1)
    (a,) = cluster.workers
    first = cluster.fetch(a, "http://z/0", [a.scope("z", concurrency=5)])
    second = cluster.fetch(a, "http://z/1", [a.scopes["z"]])
    await settle()
    assert first.done()
    assert not second.done()
    a.throttle.close()
    await settle()
    assert isinstance(second.exception(), GateClosedError)
    assert a.clock.getDelayedCalls() == []


def test_scope_manager_interface():
    """SharedScopeManager provides IThrottlingScopeManager."""
    from zope.interface.verify import verifyObject

    from slotkit.interfaces import IThrottlingScopeManager

    assert verifyObject(IThrottlingScopeManager, SharedScopeManager({"concurrency": 2}))
    manager = SharedScopeManager({"concurrency": 1})
    assert manager.can_send(0.0) == 0.0
    manager.record_sent(0.0)
    assert manager.can_send(0.0) == math.inf


# Found by a review of the queue of waiting workers (each fails without its fix).


def release_of(cluster: Cluster, ticket) -> None:
    """Release *ticket* from the worker whose lease it is."""
    owner = ticket.lease.split(":")[0]
    next(w for w in cluster.workers if w.throttle.worker_id == owner).throttle.release(ticket)


@pytest_twisted.ensureDeferred
async def test_two_releases_close_together_wake_two_waiters():
    """Two slots freed within one round trip wake two queued waiters, not one."""
    cluster = Cluster(5)
    h1, h2, h3, x, y = cluster.workers
    cfg = {"concurrency": 2, "delay": 0.0}
    a = cluster.fetch(h1, "http://c/a", [h1.scope("c", **cfg)])
    await settle()
    b = cluster.fetch(h2, "http://c/b", [h2.scope("c", **cfg)])  # takes the last slot: urgent
    await settle()
    c = cluster.fetch(h3, "http://c/c", [h3.scope("c", **cfg)])  # queued
    await settle()
    h1.throttle.release(a.result())  # lingers, then frees; h3 is named
    await cluster.run_for(0.5)
    assert c.done()
    assert b.result().urgent
    assert c.result().urgent
    fx = cluster.fetch(x, "http://c/x", [x.scope("c", **cfg)])
    await settle()
    fy = cluster.fetch(y, "http://c/y", [y.scope("c", **cfg)])
    await settle()
    assert not fx.done()
    assert not fy.done()
    # Two downloads end within one round trip (before x's re-ask lands).
    h2.throttle.release(b.result())
    h3.throttle.release(c.result())
    await settle()
    await cluster.run_for(0.1)
    assert fx.done()
    assert fy.done(), "second freed slot left idle until y's full_poll"
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_two_riding_releases_wake_two_waiters():
    """Two releases riding on one call wake two queued waiters."""
    cluster = Cluster(4)
    h, g, x, y = cluster.workers
    cfg = {"concurrency": 3, "delay": 0.0}
    a1 = cluster.fetch(h, "http://c/h1", [h.scope("c", **cfg)])
    await settle()
    a2 = cluster.fetch(h, "http://c/h2", [h.scope("c", **cfg)])
    await settle()
    b = cluster.fetch(g, "http://c/g", [g.scope("c", **cfg)])
    await settle()
    assert a1.done()
    assert a2.done()
    assert b.done()
    assert not a1.result().urgent
    assert not a2.result().urgent
    fx = cluster.fetch(x, "http://c/x", [x.scope("c", **cfg)])
    await settle()
    fy = cluster.fetch(y, "http://c/y", [y.scope("c", **cfg)])
    await settle()
    assert not fx.done()
    assert not fy.done()
    h.throttle.release(a1.result())
    h.throttle.release(a2.result())  # both linger, then ride on one release call
    await cluster.run_for(0.4)  # release_linger is 0.25
    assert fx.done()
    assert fy.done(), "second freed slot left idle until y's full_poll"
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_closing_worker_does_not_swallow_a_freed_slot():
    """A worker named while its crawl closes (no wait listening) hands the slot on."""
    cluster = Cluster(3)
    h, closing, alive = cluster.workers
    cfg = {"concurrency": 1, "delay": 0.0}
    t = cluster.fetch(h, "http://c/h", [h.scope("c", **cfg)])
    await settle()
    lost = cluster.fetch(closing, "http://c/closing", [closing.scope("c", **cfg)])
    await settle()
    waiting = cluster.fetch(alive, "http://c/alive", [alive.scope("c", **cfg)])
    await settle()
    closing.throttle.stop_waiting("the spider closed (finished)")  # _spider_closing
    await settle()
    assert lost.done()
    await cluster.run_for(0.3)  # the closing worker's heartbeat keeps it live
    h.throttle.release(t.result())
    await settle()
    await cluster.run_for(0.05)
    assert waiting.done(), "freed slot named the closing worker; alive waits for full_poll"
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_waiter_told_wait_does_not_keep_its_place():
    """A queued worker told 'wait' (a hold beyond the horizon on its other scope)
    leaves the queue."""
    cluster = Cluster(5)
    h, x, w, y, q = cluster.workers
    c = {"concurrency": 1, "delay": 0.0}
    qc = {"concurrency": 5, "delay": 0.0}
    th = cluster.fetch(h, "http://c/h", [h.scope("c", **c)])
    tq = cluster.fetch(q, "http://q/q", [q.scope("q", **qc)])
    await settle()
    fx = cluster.fetch(x, "http://c/x", [x.scope("c", **c)])
    await settle()
    fw = cluster.fetch(w, "http://cq/w", [w.scope("c", **c), w.scope("q", **qc)])
    await settle()
    assert not fx.done()
    assert not fw.done()
    assert cluster.store.hashes.get("{t}:s:c", {}).get("wq", "w1 w2") == "w1 w2"
    # A 429 with Retry-After 40 s (beyond the 30 s horizon) on q, and h's download ends,
    # in the same moment: w re-asks (woken by the hold) before x (named by the release).
    token = current_pass.set(tq.result())
    q.scopes["q"].manager.record_backoff(40.0, q.clock.seconds())
    current_pass.reset(token)
    h.throttle.release(th.result())
    await settle()
    assert fx.done()
    assert not fw.done()
    fy = cluster.fetch(y, "http://c/y", [y.scope("c", **c)])
    await settle()
    x.throttle.release(fx.result())  # names w, which sleeps 40 s on the hold only
    await settle()
    await cluster.run_for(0.05)
    assert fy.done(), "freed slot named w (told 'wait'); y waits for its full_poll"
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_queue_entry_left_from_before_an_outage_does_not_swallow_a_slot():
    """A queue entry from before an outage (its request went through the fallback)
    hands the slot on."""
    cluster = Cluster(5)
    w0, w1, w2, w3, w4 = cluster.workers
    await cluster.run_for(1.1)  # N = 5
    s = {"concurrency": 3, "delay": 0.0}
    held = [
        cluster.fetch(w, f"http://s/{i}", [w.scope("s", **s)]) for i, w in enumerate((w1, w2, w3))
    ]
    await settle()
    assert all(f.done() for f in held)
    f0 = cluster.fetch(w0, "http://s/w0", [w0.scope("s", **s)])
    await settle()
    f4 = cluster.fetch(w4, "http://s/w4", [w4.scope("s", **s)])
    await settle()
    for w in cluster.workers:
        w.backend.down = True
    await cluster.run_for(1.0)
    assert all(w.throttle.mode == FALLBACK for w in cluster.workers)
    assert f0.done(), "w0 (rank 0) has a fallback slot"
    w0.throttle.release(f0.result())
    for w in cluster.workers:
        w.backend.down = False
    await cluster.run_for(RESYNC + 0.5)
    assert all(w.throttle.mode == SHARED for w in cluster.workers)
    assert not f4.done()
    # let w4 be mid-way between two polls
    w3.throttle.release(held[2].result())  # urgent: goes at once
    await settle()
    await cluster.run_for(0.05)
    assert f4.done(), "freed slot named w0 (not waiting); w4 waits for its full_poll"
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_lingering_release_does_not_hold_a_slot_while_a_worker_waits():
    """A finished request's lease does not linger while workers queue for its scope."""
    cluster = Cluster(5)
    h, g, w1, w2, _ = cluster.workers
    cfg = {"concurrency": 3, "delay": 0.0}
    r1 = cluster.fetch(h, "http://c/h1", [h.scope("c", **cfg)])
    await settle()
    cluster.fetch(h, "http://c/h2", [h.scope("c", **cfg)])
    await settle()
    rg = cluster.fetch(g, "http://c/g", [g.scope("c", **cfg)])
    await settle()
    assert not r1.result().urgent
    assert rg.result().urgent
    f1 = cluster.fetch(w1, "http://c/w1", [w1.scope("c", **cfg)])
    await settle()
    f2 = cluster.fetch(w2, "http://c/w2", [w2.scope("c", **cfg)])
    await settle()
    await cluster.run_for(0.2)
    h.throttle.release(r1.result())  # finished; lingers up to 0.25 s for a call to ride on
    await cluster.run_for(0.02)
    g.throttle.release(rg.result())  # urgent: at once
    await settle()
    await cluster.run_for(0.05)
    assert f1.done()
    assert f2.done(), "w2 waits for h's linger to run out"
    cluster.close()


def test_a_rampup_target_of_zero_tells_the_store_to_step_up_after_clean_windows():
    """The store steps up below its ``rlow`` argument: 1 for a target of 0, as in one process."""
    manager = SharedScopeManager({"rampup": {"backoff_target": [0, 0]}})
    assert manager.rampup_args()[:2] == ["1", "1"]
    manager = SharedScopeManager({"rampup": {"backoff_target": [2, 3]}})
    assert manager.rampup_args()[:2] == ["1", "2"]


def test_slot_jitter_writes_reach_a_shared_scope():
    """``slot.jitter = x`` (downloader.slots) works in shared mode too (a review)."""
    manager = SharedScopeManager({"concurrency": 2, "delay": 1.0})
    manager.set_jitter((-0.25, 0.25))
    assert manager.jitter == (-0.25, 0.25)
    assert manager.fallback.jitter == (-0.25, 0.25)
