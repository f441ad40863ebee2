"""How the shared throttle talks to its store.

A *backend* runs one operation of ``script.lua`` and answers with a
Deferred; it never blocks the reactor thread:

* :class:`AsyncioRedisBackend`: redis-py's asyncio client, on Scrapy's
  default asyncio reactor (or in reactorless mode, on the running loop);
* :class:`ThreadedRedisBackend`: redis-py's synchronous client on a
  dedicated thread pool, for every other reactor;
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
import threading
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Protocol

from twisted.internet.defer import Deferred, fail, succeed

from slotkit.shared.twin import TwinStore

__all__ = [
    "AsyncioRedisBackend",
    "Backend",
    "StoreDownError",
    "ThreadedRedisBackend",
    "TwinBackend",
    "script_source",
]


class StoreDownError(ConnectionError):
    """The shared store did not answer (refused, reset, or timed out)."""


def script_source() -> str:
    """The text of ``script.lua``, shipped inside the package."""
    return resources.files("slotkit.shared").joinpath("script.lua").read_text("utf-8")


class Backend(Protocol):
    """What the shared throttle needs from a store."""

    def run(self, keys: Sequence[str], argv: Sequence[str]) -> Deferred[list[str]]:
        """Run one script operation; fire with its reply (a list of strings)."""

    def subscribe(self, channel: str, callback: Callable[[str], object]) -> None:
        """Deliver every message published on *channel* to *callback* (reactor thread).

        Calling it again after the store came back re-subscribes if the old
        subscription died; it is a no-op while the subscription is alive.
        """

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

    def run(self, keys: Sequence[str], argv: Sequence[str]) -> Deferred[list[str]]:
        if self.down:
            return fail(StoreDownError("twin store is down"))
        if self.frozen:
            return Deferred()
        return succeed(self.store.run(keys, argv))

    def _deliver(self, channel: str, message: str) -> None:
        if self.down or self.frozen:
            return
        for wanted, callback in list(self._callbacks):
            if wanted == channel:
                callback(message)

    def subscribe(self, channel: str, callback: Callable[[str], object]) -> None:
        if not any(wanted == channel and cb is callback for wanted, cb in self._callbacks):
            self._callbacks.append((channel, callback))

    def close(self) -> None:
        if self._deliver in self.store.subscribers:
            self.store.subscribers.remove(self._deliver)
        self._callbacks.clear()


class AsyncioRedisBackend:
    """redis-py's asyncio client; every call is a task on the reactor's event loop."""

    def __init__(self, url: str, timeout: float) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry_on_timeout=False,
        )
        self._script = self._redis.register_script(script_source())
        self._listener: asyncio.Task[None] | None = None

    def run(self, keys: Sequence[str], argv: Sequence[str]) -> Deferred[list[str]]:
        future = asyncio.ensure_future(self._script(keys=list(keys), args=list(argv)))
        return Deferred.fromFuture(future)

    def subscribe(self, channel: str, callback: Callable[[str], object]) -> None:
        if self._listener is not None and not self._listener.done():
            return
        self._listener = asyncio.ensure_future(self._listen(channel, callback))

    async def _listen(self, channel: str, callback: Callable[[str], object]) -> None:
        # Ends on the first error; the throttle calls subscribe() again after
        # its next successful heartbeat, so no retry loop (and no sleep) here.
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(channel)
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    callback(message["data"])
        except Exception:
            pass
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    def close(self) -> Deferred[None]:
        if self._listener is not None:
            self._listener.cancel()
        return Deferred.fromFuture(asyncio.ensure_future(self._redis.aclose()))


class ThreadedRedisBackend:
    """redis-py's synchronous client, called only from a dedicated thread pool."""

    def __init__(self, url: str, timeout: float, reactor: Any, threads: int = 4) -> None:
        import redis
        from twisted.python.threadpool import ThreadPool

        self._reactor = reactor
        self._redis = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry_on_timeout=False,
        )
        self._script = self._redis.register_script(script_source())
        self._pool = ThreadPool(minthreads=1, maxthreads=threads, name="slotkit-redis")
        self._pool.start()
        self._listener: threading.Thread | None = None
        self._closed = False

    def run(self, keys: Sequence[str], argv: Sequence[str]) -> Deferred[list[str]]:
        from twisted.internet.threads import deferToThreadPool

        return deferToThreadPool(
            self._reactor, self._pool, self._script, keys=list(keys), args=list(argv)
        )

    def subscribe(self, channel: str, callback: Callable[[str], object]) -> None:
        if self._listener is not None and self._listener.is_alive():
            return

        def listen() -> None:
            pubsub = self._redis.pubsub()
            try:
                pubsub.subscribe(channel)
                while not self._closed:
                    message = pubsub.get_message(timeout=1.0)
                    if message and message.get("type") == "message":
                        self._reactor.callFromThread(callback, message["data"])
            except Exception:
                pass
            finally:
                pubsub.close()

        self._listener = threading.Thread(target=listen, name="slotkit-redis-events", daemon=True)
        self._listener.start()

    def close(self) -> None:
        self._closed = True
        self._pool.stop()
        self._redis.close()
