"""The asyncio backend against a real redis-server: pipelining, reloads, failures as Exceptions."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.defer import DeferredList

from slotkit.shared.client import AsyncioRedisBackend, StoreDownError
from slotkit.shared.twin import fmt
from tests.test_shared_support import redis_server  # noqa: F401 - a fixture

KEYS = ["{w}:w", "{w}:s:a", "{w}:l:a"]


def acquire(lease: str) -> list[str]:
    argv = ["acquire", "", "w0", fmt(5.0), "0", lease, fmt(60.0), fmt(30.0), fmt(600.0), "1"]
    argv += [fmt(1.0), fmt(0.0), "1000", fmt(-1.0), fmt(60.0), fmt(0.0)]
    argv += [fmt(2.0), fmt(1.0), fmt(60.0), fmt(60.0), fmt(1.0), "0", "1", fmt(1.0)]
    argv += [fmt(0.0), fmt(0.0), "1000"]
    return argv


def backend(url: str) -> AsyncioRedisBackend:
    from twisted.internet import reactor

    return AsyncioRedisBackend(url, 0.25, reactor)


@pytest_twisted.ensureDeferred
async def test_calls_issued_together_are_pipelined_and_answered_in_order(redis_server):  # noqa: F811
    store = backend(redis_server.url)
    await store.prepare()
    calls = [store.run(KEYS, acquire(f"l{i}")) for i in range(20)]
    replies = await DeferredList(calls, fireOnOneErrback=True, consumeErrors=True)
    slots = [int(reply[4]) for _, reply in replies]
    assert slots == [1000 - 1 - i for i in range(20)], "each call saw the leases before it"
    assert store.stats.commands == 21
    assert len(store.stats.round_trips) == 20
    await store.close()


@pytest_twisted.ensureDeferred
async def test_a_flushed_script_is_loaded_again(redis_server):  # noqa: F811
    import redis

    store = backend(redis_server.url)
    await store.prepare()
    redis.Redis.from_url(redis_server.url).script_flush()
    reply = await store.run(KEYS, acquire("l0"))
    assert reply[0] == "ok"
    assert store.stats.commands == 1 + 3  # EVALSHA, SCRIPT LOAD, EVALSHA
    await store.close()


@pytest_twisted.ensureDeferred
async def test_a_frozen_server_fails_calls_with_an_exception_then_recovers(redis_server):  # noqa: F811
    store = backend(redis_server.url)
    await store.prepare()
    redis_server.freeze()
    with pytest.raises(StoreDownError):  # an Exception, never a CancelledError
        await store.run(KEYS, acquire("l0"))
    redis_server.thaw()
    reply = await store.run(KEYS, acquire("l1"))
    assert reply[0] == "ok"
    await store.close()


@pytest_twisted.ensureDeferred
async def test_a_killed_server_fails_calls_with_an_exception(redis_server):  # noqa: F811
    store = backend(redis_server.url)
    await store.prepare()
    redis_server.kill()
    with pytest.raises(StoreDownError):
        await store.run(KEYS, acquire("l0"))
    await store.close()
