"""The shared store's backend for every reactor but asyncio's: redis-py's synchronous client.

Calls run on a dedicated thread pool (never the reactor thread) and come
back as Deferreds; the event subscription listens on a thread of its own
and hands each message to the reactor thread. See :mod:`slotkit.shared.client`
for the other backends and what every backend does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, fail

from slotkit.shared.client import (
    CallStats,
    StoreDownError,
    _no_retry,
    logger,
    script_and_sha,
)

__all__ = ["ThreadedRedisBackend"]


def _daemon_thread(*args: Any, **kwargs: Any) -> threading.Thread:
    return threading.Thread(*args, daemon=True, **kwargs)


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
            **_no_retry(asyncio_client=False),
        )
        self._source, self._sha = script_and_sha()
        self._pool = ThreadPool(minthreads=1, maxthreads=threads, name="slotkit-redis")
        # Daemon threads: a pool nobody stopped must not keep the process alive.
        self._pool.threadFactory = _daemon_thread  # type: ignore[assignment]
        self._pool.start()
        self._listener: threading.Thread | None = None
        self._closed = False
        self.stats = CallStats(reactor)

    def _evalsha(self, keys: Sequence[str], argv: Sequence[str]) -> list[str]:
        from redis.exceptions import NoScriptError

        stats = self.stats
        started = stats.now()
        stats.commands += 1
        try:
            reply = self._redis.evalsha(self._sha, len(keys), *keys, *argv)
        except NoScriptError:
            stats.commands += 2
            self._redis.script_load(self._source)
            reply = self._redis.evalsha(self._sha, len(keys), *keys, *argv)
        stats.record(started, argv, reply)
        return list(reply)

    def run(self, keys: Sequence[str], argv: Sequence[str]) -> Deferred[list[str]]:
        from twisted.internet.threads import deferToThreadPool

        if self._closed:
            return fail(StoreDownError("the backend is closed"))
        return deferToThreadPool(self._reactor, self._pool, self._evalsha, keys, argv)

    def prepare(self, connections: int = 2) -> Deferred[None]:
        from twisted.internet.threads import deferToThreadPool

        def load() -> None:
            self.stats.commands += 1
            self._redis.script_load(self._source)

        return deferToThreadPool(self._reactor, self._pool, load)

    def subscribe(self, channel: str, callback: Callable[[str], object]) -> None:
        if self._closed or (self._listener is not None and self._listener.is_alive()):
            return
        if not self.stats.subscribing():
            return

        def listen() -> None:
            pubsub = self._redis.pubsub()
            try:
                pubsub.subscribe(channel)
                while not self._closed:
                    message = pubsub.get_message(timeout=0.5)
                    if message and message.get("type") == "message" and not self._closed:
                        self._reactor.callFromThread(callback, message["data"])
            except Exception:
                logger.debug("slotkit: the shared-store subscription ended", exc_info=True)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()

        self._listener = threading.Thread(target=listen, name="slotkit-redis-events", daemon=True)
        self._listener.start()

    def close(self) -> None:
        """Stop the pool without waiting on the reactor thread.

        ``ThreadPool.stop`` joins its threads, and a call in flight to a
        frozen server holds one for up to the socket timeout: that join runs
        on a helper thread, never on the reactor's.
        """
        if self._closed:
            return
        self._closed = True

        def stop() -> None:
            self._pool.stop()
            self._redis.close()

        threading.Thread(target=stop, name="slotkit-redis-close", daemon=True).start()
