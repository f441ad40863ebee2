"""How the shared throttle talks to its store.

A *backend* runs one operation of ``script.lua`` and answers with a
Deferred; it never blocks the reactor thread:

* :class:`AsyncioRedisBackend`: redis-py's asyncio client, on Scrapy's
  default asyncio reactor (or in reactorless mode, on the running loop);
* :class:`~slotkit.shared.threaded.ThreadedRedisBackend` (its own module):
  redis-py's synchronous client on a dedicated thread pool, for every other
  reactor;
* :class:`TwinBackend`: the in-process :class:`~slotkit.shared.twin.TwinStore`,
  for ``THROTTLING_REDIS_URL = "local"`` and for tests (it can also play a
  store that is down or frozen).

Each backend also delivers the script's ``PUBLISH`` messages (a scope was
held, stepped back, or had a slot freed) to one callback, and can be asked
to re-subscribe after the store came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Protocol

from twisted.internet.defer import Deferred, fail, succeed

from slotkit.shared.twin import TwinStore

__all__ = [
    "AsyncioRedisBackend",
    "Backend",
    "StoreDownError",
    "TwinBackend",
    "script_source",
]


logger = logging.getLogger("slotkit")


class StoreDownError(ConnectionError):
    """The shared store did not answer (refused, reset, or timed out)."""


def script_source() -> str:
    """The text of ``script.lua``, shipped inside the package."""
    return resources.files("slotkit.shared").joinpath("script.lua").read_text("utf-8")


def script_and_sha() -> tuple[str, str]:
    """``script.lua`` and its SHA1, the name ``EVALSHA`` runs it by."""
    source = script_source()
    return source, hashlib.sha1(source.encode("utf-8")).hexdigest()


class Backend(Protocol):
    """What the shared throttle needs from a store."""

    def run(self, keys: Sequence[str], argv: Sequence[str]) -> Deferred[list[str]]:
        """Run one script operation; fire with its reply (a list of strings)."""

    def subscribe(self, channel: str, callback: Callable[[str], object]) -> None:
        """Deliver every message published on *channel* to *callback* (reactor thread).

        Calling it again after the store came back re-subscribes if the old
        subscription died; it is a no-op while the subscription is alive.
        """

    def prepare(self, connections: int = 2) -> Deferred[None] | None:
        """Load the script and open connections ahead of the first request."""

    def close(self) -> Deferred[None] | None:
        """Release connections and threads."""


class TwinBackend:
    """The in-process twin, with switches that make it behave like a failed store."""

    def __init__(self, store: TwinStore) -> None:
        self.store = store
        #: Refuse every call at once (a killed server).
        self.down = False
        #: Never answer (a frozen server); the throttle's timeout ends the wait.
        self.frozen = False
        self._callbacks: list[tuple[str, Callable[[str], object]]] = []
        store.subscribers.append(self._deliver)
        self.stats = CallStats(store.clock)

    def run(self, keys: Sequence[str], argv: Sequence[str]) -> Deferred[list[str]]:
        if self.down:
            return fail(StoreDownError("twin store is down"))
        if self.frozen:
            return Deferred()
        self.stats.commands += 1
        reply = self.store.run(keys, argv)
        self.stats.record(self.stats.now(), argv, reply)
        return succeed(reply)

    def prepare(self, connections: int = 2) -> None:
        return None

    def _deliver(self, channel: str, message: str) -> None:
        if self.down or self.frozen:
            return
        for wanted, callback in list(self._callbacks):
            if wanted == channel:
                callback(message)

    def subscribe(self, channel: str, callback: Callable[[str], object]) -> None:
        # ==, not is: each access to a bound method makes a new object, and
        # the throttle subscribes again after every successful call.
        if not any(wanted == channel and cb == callback for wanted, cb in self._callbacks):
            self._callbacks.append((channel, callback))

    def close(self) -> None:
        if self._deliver in self.store.subscribers:
            self.store.subscribers.remove(self._deliver)
        self._callbacks.clear()


def _no_retry(*, asyncio_client: bool) -> dict[str, Any]:
    """redis-py options: fail fast, the shared throttle does its own retrying.

    The asyncio client gets the asyncio ``Retry`` (redis-py 8 converts a
    synchronous one, with a warning per connection pool).
    """
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    retry = AsyncRetry(NoBackoff(), 0) if asyncio_client else Retry(NoBackoff(), 0)
    return {"retry": retry, "retry_on_error": [], "health_check_interval": 0}


def _as_store_error(error: BaseException) -> Exception:
    """Any failure of a store call as a :class:`StoreDownError` (an ordinary ``Exception``).

    A cancelled call ends in :class:`asyncio.CancelledError`, a
    ``BaseException``: let through, it escapes ``except Exception`` clauses
    all the way into Scrapy's scraper, whose task then dies without telling
    the engine the request is done, and the crawl never closes.
    """
    if isinstance(error, StoreDownError):
        return error
    message = str(error) or type(error).__name__
    wrapped = StoreDownError(f"{type(error).__name__}: {message}")
    wrapped.__cause__ = error
    return wrapped


#: Seconds between two attempts to (re)open a backend's event subscription.
RESUBSCRIBE_EVERY = 0.5


class CallStats:
    """What a backend sent: commands on the wire, and how long each script call took."""

    def __init__(self, clock: Any) -> None:
        self._clock = clock
        #: Every command sent to the server (script calls, script loads, subscribes).
        self.commands = 0
        #: Seconds from sending an ``acquire`` to reading its reply, per call (bounded).
        self.round_trips: list[float] = []
        #: When each of those acquires was sent (the clock's time).
        self.sent_at: list[float] = []
        #: The same for the acquires the script answered with "go now".
        self.go_now: list[float] = []
        #: When the event subscription was last (re)opened.
        self._subscribed_at = -math.inf

    def now(self) -> float:
        return float(self._clock.seconds())

    def subscribing(self) -> bool:
        """Count an attempt to (re)open the event subscription, unless it is too soon.

        The throttle asks after every successful call, so that a dropped
        subscription comes back at once; one the server keeps refusing (an ACL
        without SUBSCRIBE) is then tried at most twice a second, not per call.
        """
        now = self.now()
        if now < self._subscribed_at + RESUBSCRIBE_EVERY:
            return False
        self._subscribed_at = now
        self.commands += 1
        return True

    def record(self, started: float, argv: Sequence[str], reply: Sequence[str]) -> None:
        if argv[0] != "acquire" or len(self.round_trips) >= 200_000:
            return
        took = self.now() - started
        self.round_trips.append(took)
        self.sent_at.append(started)
        if reply[0] == "ok" and float(reply[2]) <= 0:
            self.go_now.append(took)


class AsyncioRedisBackend:
    """redis-py's asyncio client on the reactor's event loop.

    Script calls go through one pipelined connection (:class:`ScriptWire`);
    the event subscription has a connection of its own.
    """

    def __init__(self, url: str, timeout: float, clock: Any = None) -> None:
        import redis.asyncio as aioredis

        from slotkit.shared.wire import ScriptWire

        # No socket timeout on the connections: with one, redis-py wraps every
        # write in asyncio.wait_for (a task, a turn of the loop). Reads are
        # bounded by the wire instead; connecting by the connect timeout.
        self._redis = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=None,
            socket_connect_timeout=timeout,
            **_no_retry(asyncio_client=True),
        )
        self._source, self._sha = script_and_sha()
        self._timeout = timeout
        self._listener: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        if clock is None:
            from twisted.internet import reactor as clock
        self.stats = CallStats(clock)
        self._wire = ScriptWire(
            self._redis, timeout, _as_store_error, self._replied, self.stats.now
        )

    def _replied(self, sent: float, args: Sequence[str], reply: Any) -> None:
        if args and args[0] == "EVALSHA":
            self.stats.record(sent, args[3 + int(args[2]) :], reply)

    def _task(self, coro: Any) -> Deferred[Any]:
        """Run *coro* as a task; its Deferred fires with its result or an ``Exception``."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        d: Deferred[Any] = Deferred(lambda _: task.cancel())

        def done(finished: asyncio.Task[Any]) -> None:
            self._tasks.discard(finished)
            error = None if finished.cancelled() else finished.exception()
            if d.called:
                return
            if finished.cancelled():
                d.errback(StoreDownError("the store call was cancelled"))
            elif error is not None:
                d.errback(_as_store_error(error))
            else:
                d.callback(finished.result())

        task.add_done_callback(done)
        return d

    def run(self, keys: Sequence[str], argv: Sequence[str]) -> Deferred[list[str]]:
        from redis.exceptions import NoScriptError

        self.stats.commands += 1
        d = self._wire.call("EVALSHA", self._sha, str(len(keys)), *keys, *argv)

        def reload(failure: Any) -> Any:
            if not failure.check(NoScriptError):
                return failure
            # A restarted (or flushed) server: load the script, run the call again.
            self.stats.commands += 2
            loaded = self._wire.call("SCRIPT", "LOAD", self._source)
            return loaded.addCallback(
                lambda _: self._wire.call("EVALSHA", self._sha, str(len(keys)), *keys, *argv)
            )

        return d.addErrback(reload).addCallback(list)

    def prepare(self, connections: int = 1) -> Deferred[None]:
        """Connect and load the script before the first request."""
        self.stats.commands += 1
        return self._wire.call("SCRIPT", "LOAD", self._source).addCallback(lambda _: None)

    def subscribe(self, channel: str, callback: Callable[[str], object]) -> None:
        if self._listener is not None and not self._listener.done():
            return
        if not self.stats.subscribing():
            return
        self._listener = asyncio.ensure_future(self._listen(channel, callback))

    async def _listen(self, channel: str, callback: Callable[[str], object]) -> None:
        # Ends on the first error; the throttle calls subscribe() again after
        # its next successful call, so no retry loop (and no sleep) here.
        # The connection is owned (slotkit.shared.owned): an event reaches
        # the throttle in the turn of the loop that read it.
        from slotkit.shared.owned import give_back, own_connection

        ended: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

        def event(reply: Any) -> None:
            # ["message", channel, data]; RESP3 sends the same as a push.
            if isinstance(reply, list) and len(reply) == 3 and reply[0] == "message":
                try:
                    callback(reply[2])
                except Exception:  # one bad event must not end the subscription
                    logger.exception("slotkit: handling a shared-store event failed")
            elif isinstance(reply, Exception):
                lost(reply)

        def lost(error: BaseException) -> None:
            if not ended.done():
                ended.set_result(error)

        connection = replies = None
        try:
            connection, replies = await own_connection(self._redis, self._timeout, event, lost)
            replies.transport.writelines(connection.pack_command("SUBSCRIBE", channel))
            error = await ended
            logger.debug("slotkit: the shared-store subscription ended: %r", error)
        except Exception:
            logger.debug("slotkit: the shared-store subscription ended", exc_info=True)
        finally:
            if replies is not None:
                replies.stop()
            if connection is not None:
                with contextlib.suppress(BaseException):
                    await give_back(self._redis, connection)

    def close(self) -> Deferred[None]:
        """Stop listening, give up calls in flight, close every connection."""
        self._wire.close()
        if self._listener is not None:
            self._listener.cancel()
        for task in list(self._tasks):
            task.cancel()
        return self._task(self._redis.aclose())
