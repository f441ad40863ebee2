"""The asyncio backend against a real redis-server: pipelining, reloads, failures as Exceptions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, DeferredList

from slotkit.shared.client import AsyncioRedisBackend, StoreDownError
from slotkit.shared.twin import fmt
from tests.test_shared_support import redis_server  # noqa: F401 - a fixture

KEYS = ["{w}:w", "{w}:s:a", "{w}:l:a"]
CALL_TIMEOUT = 2.0
"""Where the timeout is not under test: long enough for a loaded machine's replies."""


def acquire(lease: str) -> list[str]:
    argv = ["acquire", "", "w0", fmt(5.0), "0", lease, fmt(60.0), fmt(30.0), fmt(600.0), "1"]
    argv += [fmt(1.0), fmt(0.0), "1000", fmt(-1.0), fmt(60.0), fmt(0.0)]
    argv += [fmt(2.0), fmt(1.0), fmt(60.0), fmt(60.0), fmt(1.0), "0", "1", fmt(1.0)]
    argv += [fmt(0.0), fmt(0.0), "1000"]
    return argv


def backend(url: str, timeout: float = CALL_TIMEOUT) -> AsyncioRedisBackend:
    from twisted.internet import reactor

    return AsyncioRedisBackend(url, timeout, reactor)


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
    # Short, as the frozen call waits it out; not so short that the call after
    # the thaw is cut by a loaded machine.
    store = backend(redis_server.url, timeout=1.0)
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


@pytest.mark.parametrize("protocol", ["2", "3"])
@pytest_twisted.ensureDeferred
async def test_resp2_and_resp3_connections_answer_the_same(redis_server, protocol):  # noqa: F811
    store = backend(f"{redis_server.url}?protocol={protocol}")
    await store.prepare()
    first, second = await DeferredList(
        [store.run(KEYS, acquire("l0")), store.run(KEYS, acquire("l1"))],
        fireOnOneErrback=True,
        consumeErrors=True,
    )
    assert first[1][0] == second[1][0] == "ok"
    assert int(second[1][4]) == int(first[1][4]) - 1
    await store.close()


def aio(coro: Any) -> Deferred[Any]:
    return Deferred.fromFuture(asyncio.ensure_future(coro))


async def eventually(condition: Callable[[], bool], what: str, tries: int = 500) -> None:
    """Let the loop run (10 ms a turn) until *condition* holds: no deadline to miss
    on a loaded machine, only a bound for a test that would otherwise hang."""
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    for _ in range(tries):
        if condition():
            return
        await deferLater(reactor, 0.01, lambda: None)
    raise AssertionError(f"{what}: not after {tries} turns of the loop")


class FakeRedis:
    """A loopback server that answers ``+OK`` to anything, and EVALSHA as a test says."""

    def __init__(self, evalsha: list[bytes | None], hang_up: int = 0, refuse: bytes = b"") -> None:
        #: The reply to each EVALSHA, in chunks 10 ms apart; None closes the connection.
        #: ``{arg}`` in a chunk stands for the call's last argument.
        self.evalsha = evalsha
        #: How many connections to close as soon as redis-py's handshake is answered.
        self.hang_up = hang_up
        self.hung_up = 0
        #: A command answered with a NOPERM error (as an ACL would), and how often it came.
        self.refuse = refuse
        self.refused = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while header := await reader.readline():
            words = []
            for _ in range(int(header[1:])):
                size = int((await reader.readline())[1:])
                words.append((await reader.readexactly(size + 2))[:-2])
            if words[0].upper() == self.refuse:
                self.refused += 1
                writer.write(b"-NOPERM this user has no permissions to run it\r\n")
                continue
            if words[0].upper() == b"HELLO":  # redis-py 8 opens RESP3 connections
                version = int(words[1]) if len(words) > 1 else 2
                writer.write(b"%%1\r\n$5\r\nproto\r\n:%d\r\n" % version)
                continue
            if words[0].upper() != b"EVALSHA":
                writer.write(b"+OK\r\n")
                if b"LIB-VER" in words and self.hung_up < self.hang_up:  # the handshake's last
                    self.hung_up += 1
                    writer.close()
                    return
                continue
            for chunk in self.evalsha:
                if chunk is None:
                    writer.close()
                    return
                writer.write(chunk.replace(b"{arg}", words[-1]))
                await asyncio.sleep(0.01)

    def stop(self) -> None:
        assert self.server is not None
        self.server.close()


@pytest_twisted.ensureDeferred
async def test_a_reply_split_over_several_reads_is_one_reply() -> None:
    fake = FakeRedis([b"*3\r\n$2\r\nok\r\n$1", b"\r\nx\r\n:", b"5\r\n"])
    store = backend(await aio(fake.start()))
    assert await store.run(KEYS, ["ping"]) == ["ok", "x", 5]
    assert await store.run(KEYS, ["ping"]) == ["ok", "x", 5]
    await store.close()
    fake.stop()


@pytest_twisted.ensureDeferred
async def test_bytes_that_are_no_reply_fail_the_call_and_the_next_call_connects_again() -> None:
    fake = FakeRedis([b"?garbage\r\n"])
    store = backend(await aio(fake.start()))
    with pytest.raises(StoreDownError, match="unknown reply type"):
        await store.run(KEYS, ["ping"])
    fake.evalsha = [b"*1\r\n+fine\r\n"]
    assert await store.run(KEYS, ["ping"]) == ["fine"]
    await store.close()
    fake.stop()


@pytest_twisted.ensureDeferred
async def test_a_server_that_closes_the_connection_mid_reply_fails_the_call() -> None:
    fake = FakeRedis([b"*2\r\n+ha", None])
    store = backend(await aio(fake.start()))
    with pytest.raises(StoreDownError, match="closed"):
        await store.run(KEYS, ["ping"])
    fake.evalsha = [b"*1\r\n+again\r\n"]
    assert await store.run(KEYS, ["ping"]) == ["again"]
    await store.close()
    fake.stop()


async def published_until_heard(
    store: AsyncioRedisBackend, url: str, channel: str, heard: list[str], tries: int = 200
) -> None:
    """Subscribe and publish on *channel* every 10 ms until a message was heard.

    The throttle subscribes again after every successful call, which does
    nothing while the subscription runs: this does the same.
    """
    import redis
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    publisher = redis.Redis.from_url(url)
    try:
        for i in range(tries):
            if heard:
                return
            store.subscribe(channel, heard.append)
            publisher.publish(channel, f"event {i}")
            await deferLater(reactor, 0.01, lambda: None)
        raise AssertionError(f"nothing heard on {channel} in {tries} tries")
    finally:
        publisher.close()


@pytest.mark.parametrize("query", ["", "?protocol=2", "?protocol=3"])
@pytest_twisted.ensureDeferred
async def test_events_reach_the_subscriber_and_it_listens_again_after_a_restart(
    redis_server,  # noqa: F811
    query: str,
) -> None:
    store = backend(redis_server.url + query)
    heard: list[str] = []
    await published_until_heard(store, redis_server.url, "{w}:events", heard)
    assert heard[0].startswith("event ")
    redis_server.kill()
    redis_server.start()
    heard.clear()
    await published_until_heard(store, redis_server.url, "{w}:events", heard)
    assert heard[0].startswith("event ")
    await store.close()


@pytest_twisted.ensureDeferred
async def test_a_tls_connection_carries_calls_and_events(tmp_path) -> None:
    """``rediss://``: the owned transport is then TLS's, read the same way."""
    import shutil
    import subprocess

    from slotkit.shared.redis_process import free_port, start_redis
    from tests.test_shared_support import redis_binary

    binary = redis_binary()
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make the test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=x"]
    subprocess.run(
        [openssl, *request, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    port = free_port()
    tls = ["--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"]
    tls += ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    tls += ["--tls-ca-cert-file", str(cert)]
    try:
        process = start_redis(binary, port, tmp_path, extra=tls)
    except RuntimeError:
        pytest.skip("this redis-server was built without TLS")
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=none"
    try:
        store = backend(url)
        await store.prepare()
        assert (await store.run(KEYS, acquire("l0")))[0] == "ok"
        heard: list[str] = []
        await published_until_heard(store, url, "{w}:events", heard)
        assert heard[0].startswith("event ")
        await store.close()
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest_twisted.ensureDeferred
async def test_a_push_from_the_server_is_no_reply_to_a_call() -> None:
    """RESP3 lets a server push news at any time (maintenance notices, invalidations)."""
    push = b">4\r\n$9\r\nMIGRATING\r\n:1\r\n:15\r\n*1\r\n$1\r\n1\r\n"
    fake = FakeRedis([push + b"*2\r\n$2\r\nok\r\n$1\r\n{arg}\r\n"])
    store = backend(await aio(fake.start()))
    replies = await DeferredList(
        [store.run(KEYS, ["a"]), store.run(KEYS, ["b"])], fireOnOneErrback=True, consumeErrors=True
    )
    assert [reply for _, reply in replies] == [["ok", "a"], ["ok", "b"]]
    await store.close()
    fake.stop()


@pytest_twisted.ensureDeferred
async def test_a_connection_closed_right_after_its_handshake_is_noticed() -> None:
    fake = FakeRedis([b"*1\r\n+fine\r\n"], hang_up=2)
    store = backend(await aio(fake.start()))
    with pytest.raises(StoreDownError):
        await store.run(KEYS, ["ping"])
    if not fake.hung_up:
        pytest.skip("this redis-py sends no CLIENT SETINFO LIB-VER to hang up after")
    store.subscribe("{w}:events", lambda _: None)  # the second connection: hung up too

    def ended() -> bool:
        listener = store._listener
        return listener is not None and listener.done()

    await eventually(ended, "the subscription still waits on a closed connection")
    assert await store.run(KEYS, ["ping"]) == ["fine"]
    await store.close()
    fake.stop()


@pytest_twisted.ensureDeferred
async def test_a_call_made_just_before_close_still_ends(redis_server):  # noqa: F811
    store = backend(redis_server.url)
    call = store.run(KEYS, acquire("l0"))  # still connecting
    await store.close()
    with pytest.raises(StoreDownError):
        await call


@pytest_twisted.ensureDeferred
async def test_reconnections_give_their_connections_back_to_the_pool(redis_server):  # noqa: F811
    store = backend(redis_server.url)
    pool = store._redis.connection_pool
    for i in range(4):
        heard: list[str] = []
        await published_until_heard(store, redis_server.url, "{w}:events", heard)
        assert (await store.run(KEYS, acquire(f"l{i}")))[0] == "ok"
        redis_server.kill()
        redis_server.start()
        with pytest.raises(StoreDownError):  # the call that finds the old connection gone
            await store.run(KEYS, acquire(f"x{i}"))
    assert len(pool._in_use_connections) <= 2, "one for the calls, one for the events"
    await store.close()


@pytest_twisted.ensureDeferred
async def test_a_refused_subscription_is_tried_again_at_most_twice_a_second() -> None:
    """The throttle asks after every successful call; an ACL refusal must not cost one each."""
    from twisted.internet import reactor
    from twisted.internet.task import Clock, deferLater

    # The backend's clock spaces the attempts: a fake one, so that a loaded
    # machine cannot stretch the 0.3 s of calls past half a second. The
    # connections are real, on the loop, and waited for as long as they take.
    clock = Clock()
    fake = FakeRedis([], refuse=b"SUBSCRIBE")
    store = AsyncioRedisBackend(await aio(fake.start()), CALL_TIMEOUT, clock)
    store.subscribe("{w}:events", lambda _: None)

    def first_refused() -> bool:
        listener = store._listener
        return fake.refused == 1 and listener is not None and listener.done()

    await eventually(first_refused, "the first subscription refused and ended")
    for _ in range(30):  # 0.3 s of calls, each followed by subscribe()
        clock.advance(0.01)
        store.subscribe("{w}:events", lambda _: None)
        await deferLater(reactor, 0.01, lambda: None)
    assert store.stats.commands == 1  # no second attempt was even started
    assert fake.refused == 1
    clock.advance(0.5)  # 0.8 s after the first attempt: tried again
    store.subscribe("{w}:events", lambda _: None)
    await eventually(lambda: fake.refused == 2, "the second attempt")
    await store.close()
    fake.stop()
