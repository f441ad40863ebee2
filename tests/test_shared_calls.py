"""How many store calls a request costs, shared rampup, and failures that are not Exceptions.

Time is on Clocks (see ``test_shared_throttle``); the store is the twin.
"""

from __future__ import annotations

import asyncio
import re

import pytest
import pytest_twisted
from scrapy import Request
from twisted.internet.defer import Deferred, fail

from slotkit.shared.link import FALLBACK
from slotkit.shared.twin import TwinStore
from tests.test_shared_throttle import Cluster, reserve_now, settle


def lease_sets(store: TwinStore) -> dict[str, int]:
    return {key: len(zset) for key, zset in store.zsets.items() if ":l:" in key}


@pytest_twisted.ensureDeferred
async def test_a_release_rides_on_the_next_acquire():
    """A finished request's lease is given back by the next call, not by a call of its own."""
    cluster = Cluster(1)
    (a,) = cluster.workers
    scope = a.scope("p", concurrency=10, delay=0.0)
    await cluster.run_for(0.05)
    before = cluster.store.calls
    tickets = []
    for i in range(5):
        ticket = await reserve_now(a, f"http://p/{i}", [scope])
        a.throttle.release(ticket)  # finished at once; its lease waits for a ride
        tickets.append(ticket)
    await settle()
    assert cluster.store.calls - before == 5, "one call per request"
    assert lease_sets(cluster.store) == {"{t}:l:p": 1}, "only the last lease is still out"
    # With no call to ride on, the last lease goes on its own after the linger.
    await cluster.run_for(a.throttle.options.release_linger + 0.02)
    assert cluster.store.calls - before == 6
    assert lease_sets(cluster.store) == {}
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_full_scope_calls_kept_leases_back():
    """A worker that finds a scope full makes the others give back the leases they keep."""
    cluster = Cluster(2)
    a, b = cluster.workers
    ta = await reserve_now(a, "http://n/a", [a.scope("n", concurrency=2, delay=0.0)])
    tb = await reserve_now(b, "http://n/b", [b.scope("n", concurrency=2, delay=0.0)])
    assert not ta.urgent, "a slot was still free after a's acquire"
    assert tb.urgent, "b took the last slot: its release will not wait"
    a.throttle.release(ta)  # kept for a ride (the scope had room)
    await settle()
    assert lease_sets(cluster.store) == {"{t}:l:n": 2}
    waiting = cluster.fetch(b, "http://n/b2", [b.scopes["n"]])
    await settle()
    assert waiting.done(), "the 'need' event made a give its lease back, and b went at once"
    b.throttle.release(tb)
    b.throttle.release(waiting.result())
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_calls_carry_the_heartbeat_once_per_half_period():
    """Most calls skip the heartbeat (half the store's work); one per half beat carries it.

    The worker count still reaches every worker: one that leaves is missed by the
    others' next call carrying the heartbeat.
    """
    cluster = Cluster(2)
    a, b = cluster.workers
    await cluster.run_for(0.05)  # both workers' first heartbeat
    carried: list[bool] = []
    run = cluster.store.run

    def recording(keys, argv):
        if argv[2] == "w0":
            carried.append(argv[3] != "")
        return run(keys, argv)

    cluster.store.run = recording  # type: ignore[method-assign]
    scope = a.scope("q", concurrency=10, delay=0.1)
    for i in range(20):  # 2 s of requests, one every 0.1 s
        a.throttle.release(await reserve_now(a, f"http://q/{i}", [scope]))
        await cluster.run_for(0.1)
    # 20 acquires in 2 s (each a call; releases ride on them): the heartbeat on
    # the first call at least half a beat (0.5 s) after the last one.
    assert len(carried) == 20
    assert 3 <= sum(carried) <= 4, carried
    assert a.throttle.workers == 2, "b came after a's first heartbeat"
    b.throttle.close()
    await settle()
    for i in range(6):
        a.throttle.release(await reserve_now(a, f"http://q/late{i}", [scope]))
        await cluster.run_for(0.1)
    assert a.throttle.workers == 1, "b's leave reached a with its next heartbeat"
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_heartbeats_are_skipped_while_calls_flow():
    """A worker whose calls prove it alive sends no heartbeat of its own."""
    cluster = Cluster(1)
    (a,) = cluster.workers
    scope = a.scope("h", concurrency=10, delay=0.1)
    await cluster.run_for(0.05)  # the first heartbeat
    before = cluster.store.calls
    futures = [cluster.fetch(a, f"http://h/{i}", [scope]) for i in range(8)]
    await settle()
    for _ in range(20):
        await cluster.run_for(0.05)
        for future in futures:
            if future.done() and future.result().lease is not None:
                a.throttle.release(future.result())
    assert all(f.done() for f in futures)
    # 8 acquires; releases ride on them (the last one goes alone); the heartbeat
    # due at 1 s is skipped, as the acquires proved the worker alive.
    assert cluster.store.calls - before == 8 + 1
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_rampup_is_shared_by_every_worker():
    """A quiet rampup window speeds the scope up for all workers at once."""
    cluster = Cluster(2)
    a, b = cluster.workers
    rampup = {"window": 10.0, "delay_factor": 0.5, "min_delay": 0.25}
    config = {"concurrency": 10, "delay": 1.0, "rampup": rampup}
    a.throttle.release(await reserve_now(a, "http://r/0", [a.scope("r", **config)]))
    state = cluster.store.hashes["{t}:s:r"]
    assert float(state["rd"]) == 1.0
    assert float(state["rc"]) == 1.0, "rampup starts at the concurrency floor"
    await cluster.run_for(10.5, step=0.5)
    # b's first request closes a's quiet window: one step down for everybody.
    b.throttle.release(await reserve_now(b, "http://r/1", [b.scope("r", **config)]))
    assert float(cluster.store.hashes["{t}:s:r"]["rd"]) == 0.5
    late = cluster.fetch(a, "http://r/2", [a.scopes["r"]])
    await settle()
    assert not late.done()
    await cluster.run_for(0.4)
    assert not late.done()
    await cluster.run_for(0.2)
    assert late.done(), "a now waits the shared, ramped-up delay (0.5 s), not 1 s"
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_cancelled_store_call_goes_to_the_fallback():
    """A call ending in asyncio.CancelledError (a BaseException) counts as a failure."""
    cluster = Cluster(1)
    (a,) = cluster.workers
    scope = a.scope("c", concurrency=2, delay=0.0)
    await cluster.run_for(0.05)

    def cancelled(keys, argv) -> Deferred:
        return fail(asyncio.CancelledError())

    a.backend.run = cancelled  # type: ignore[method-assign]
    future = asyncio.ensure_future(a.throttle.reserve(Request("http://c/0"), [scope], [None]))
    await settle()
    await cluster.run_for(0.6)
    assert future.done()
    assert future.exception() is None
    assert future.result().fallback_ticket is not None, "admitted by the local fallback"
    assert a.throttle.mode == FALLBACK
    cluster.close()


def test_the_redis_url_switches_slotkit_downloader_to_the_shared_one():
    """``THROTTLING_REDIS_URL`` is all it takes; without it the downloader stays local."""
    from scrapy.utils.test import get_crawler

    from slotkit import Downloader
    from slotkit.shared import SharedDownloader

    shared = Downloader(get_crawler(settings_dict={"THROTTLING_REDIS_URL": "local"}))
    assert type(shared) is SharedDownloader
    assert shared.shared is not None
    shared.close()
    plain = Downloader(get_crawler())
    assert type(plain) is Downloader
    plain.close()
    alias = SharedDownloader(get_crawler(settings_dict={"THROTTLING_REDIS_URL": "local"}))
    assert alias.shared is not None
    alias.close()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"THROTTLING_REDIS_URL": "http://127.0.0.1/"}, "must be a redis://, rediss://"),
        (
            {"THROTTLING_REDIS_URL": "redis://127.0.0.1:notaport/0"},
            "THROTTLING_REDIS_URL 'redis://127.0.0.1:notaport/0' cannot be used: Port",
        ),
        (
            {"THROTTLING_REDIS_URL": "local", "THROTTLING_REDIS_TIMEOUT": "abc"},
            "THROTTLING_REDIS_TIMEOUT must be a number of seconds > 0 (got 'abc')",
        ),
        ({"THROTTLING_REDIS_URL": "local", "THROTTLING_REDIS_TIMEOUT": 0}, "seconds > 0"),
        (
            # redis-py would use database 0 without a word.
            {"THROTTLING_REDIS_URL": "redis://127.0.0.1:6379/abc"},
            "the database after the host must be a number, as in redis://localhost:6379/0 "
            "(got 'abc')",
        ),
    ],
)
def test_bad_shared_settings_fail_at_start_naming_the_setting(settings, message):
    from scrapy.utils.test import get_crawler

    from slotkit import Downloader
    from slotkit.settings import SettingsError

    with pytest.raises(SettingsError, match=re.escape(message)):
        Downloader(get_crawler(settings_dict=settings))


@pytest_twisted.ensureDeferred
async def test_a_hold_racing_a_reservation_timer_still_stops_it():
    """A hold that lands just after a reservation's time (within the guard) holds it back."""
    from slotkit.shared.downloader import current_pass
    from tests.test_shared_throttle import DELAY, HOLD

    cluster = Cluster(2)
    a, b = cluster.workers
    ta = await reserve_now(a, "http://g/0", [a.scope("g", concurrency=5)])
    pending = cluster.fetch(b, "http://g/1", [b.scope("g", concurrency=5)])
    await settle()
    guard = b.throttle.options.hold_guard
    cluster.advance(DELAY + guard / 2)  # b's reserved time has passed, its guard has not
    await settle()
    assert not pending.done()
    token = current_pass.set(ta)
    a.scopes["g"].manager.record_backoff(HOLD, a.clock.seconds())
    current_pass.reset(token)
    held_at = cluster.clock.seconds()
    await cluster.run_for(HOLD + 2 * guard)
    assert pending.done()
    ((went, _),) = b.sent
    assert went >= held_at + HOLD - 1e-6
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_hold_message_tells_idle_workers_its_end():
    """A worker with nothing reserved learns a hold's end from the message alone."""
    from slotkit.shared.downloader import current_pass
    from tests.test_shared_throttle import HOLD

    cluster = Cluster(2)
    a, b = cluster.workers
    ta = await reserve_now(a, "http://e/0", [a.scope("e", concurrency=5)])
    b.scope("e", concurrency=5)  # known to b, nothing reserved
    token = current_pass.set(ta)
    a.scopes["e"].manager.record_backoff(HOLD, a.clock.seconds())
    current_pass.reset(token)
    await settle()
    fallback = b.scopes["e"].manager.fallback
    assert abs(fallback.hold_until - (b.clock.seconds() + HOLD)) < 1e-3
    cluster.close()


@pytest_twisted.ensureDeferred
async def test_a_dropped_subscription_is_renewed_by_the_next_successful_call():
    """Not a heartbeat later: until then a hold reaches the worker only with a reply."""
    cluster = Cluster(1)
    (a,) = cluster.workers
    scope = a.scope("s", concurrency=10, delay=0.0)
    await cluster.run_for(0.05)
    a.backend._callbacks.clear()  # the server closed the event connection
    await reserve_now(a, "http://s/1", [scope])
    assert a.backend._callbacks, "subscribed again by the call that found the store up"
    cluster.close()


def test_the_twin_delivers_each_event_once_however_often_subscribed():
    """The throttle subscribes again after every successful call, with a new bound-method
    object each time: the twin (local mode) must not deliver an event once per call."""
    from twisted.internet.task import Clock

    from slotkit.shared.client import TwinBackend

    class Listener:
        def __init__(self) -> None:
            self.got: list[str] = []

        def on_event(self, message: str) -> None:
            self.got.append(message)

    store = TwinStore(Clock())
    backend = TwinBackend(store)
    listener = Listener()
    for _ in range(3):
        backend.subscribe("{t}:ev", listener.on_event)
    store.publish("{t}:ev", "free\tc")
    store.run(["{t}:w"], ["beat", "", "w", "5.0", "0"])  # delivers what was published
    assert listener.got == ["free\tc"]
