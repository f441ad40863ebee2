"""One pipelined redis-py connection for the script calls, tuned for a busy event loop.

redis-py's ``Redis.evalsha`` costs several turns of the event loop before
the command even leaves: the pool's lock, then ``asyncio.wait_for`` around
the write (a new task) whenever a socket timeout is set. In a crawler
whose loop is busy with responses, each turn can take milliseconds, so the
round trip of a 0.1 ms script grows to 5-10 ms.

:class:`ScriptWire` keeps one connection of redis-py's own
(:class:`redis.asyncio.Connection`, with its parser) and:

* writes each call at once, from the caller's turn of the loop (no task,
  no lock): calls issued together are pipelined on the wire;
* reads the replies in order in one reader task, which fires each call's
  Deferred directly;
* bounds every read by the timeout; a timeout or a connection error fails
  every call in flight with :class:`StoreDownError` and drops the
  connection (the next call reconnects).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred

__all__ = ["ScriptWire"]


class ScriptWire:
    """EVALSHA calls on one connection: written at once, replies read in order."""

    def __init__(
        self,
        redis: Any,
        timeout: float,
        store_error: Callable[[BaseException], Exception],
        on_reply: Callable[[float, Sequence[str], Any], None],
        now: Callable[[], float],
    ) -> None:
        self._redis = redis
        self._timeout = timeout
        self._store_error = store_error
        self._on_reply = on_reply
        self._now = now
        self._connection: Any = None
        self._connecting: asyncio.Task[Any] | None = None
        #: Calls written and not answered yet, in order: (deferred, argv, sent at).
        self._waiting: deque[tuple[Deferred[Any], Sequence[str], float]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._reader_connection: Any = None
        self._closed = False
        self._background: set[asyncio.Task[Any]] = set()

    def call(self, *args: str) -> Deferred[Any]:
        """Send one command; the Deferred fires with its reply or an ``Exception``."""
        d: Deferred[Any] = Deferred()
        if self._closed:
            d.errback(self._store_error(ConnectionError("the connection is closed")))
            return d
        connection = self._connection
        writer = getattr(connection, "_writer", None)
        if connection is None or writer is None or writer.is_closing():
            # First call, or after a failure: connect (in a task), then send.
            self._spawn(self._connect_and_send(d, args))
            return d
        self._send(connection, writer, d, args)
        return d

    def _send(self, connection: Any, writer: Any, d: Deferred[Any], args: Sequence[str]) -> None:
        try:
            writer.writelines(connection.pack_command(*args))
        except Exception as exc:
            d.errback(self._store_error(exc))
            self._drop(exc)
            return
        self._waiting.append((d, args, self._now()))
        reader = self._reader
        if reader is None or reader.done() or self._reader_connection is not connection:
            self._reader_connection = connection
            self._reader = asyncio.ensure_future(self._read(connection, self._waiting))

    async def _connect_and_send(self, d: Deferred[Any], args: Sequence[str]) -> None:
        try:
            if self._connecting is None or self._connecting.done():
                self._connecting = asyncio.ensure_future(self._connect())
            connection = await asyncio.shield(self._connecting)
        except BaseException as exc:
            if not d.called:
                d.errback(self._store_error(exc))
            return
        writer = getattr(connection, "_writer", None)
        if writer is None:
            d.errback(self._store_error(ConnectionError("no writer after connecting")))
            return
        self._send(connection, writer, d, args)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _connect(self) -> Any:
        pool = self._redis.connection_pool
        # The handshake reads replies without a socket timeout: bound it here.
        try:
            getting = pool.get_connection()
        except TypeError:  # redis-py 5 wants a command name (8 warns about one)
            getting = pool.get_connection("EVALSHA")
        connection = await asyncio.wait_for(getting, 4 * self._timeout)
        # Ours for good: never given back to the pool, so nothing else writes on it.
        self._connection = connection
        return connection

    async def _read(
        self, connection: Any, waiting: deque[tuple[Deferred[Any], Sequence[str], float]]
    ) -> None:
        try:
            while waiting:
                try:
                    reply = await connection.read_response(timeout=self._timeout)
                except Exception as exc:
                    from redis.exceptions import ResponseError

                    if not isinstance(exc, ResponseError):
                        raise
                    reply = exc  # an error reply (NOSCRIPT): that call fails, the rest goes on
                if reply is None:
                    # redis-py's answer to a read that timed out (no command of
                    # ours replies nil): the server is frozen or gone.
                    raise TimeoutError(f"no reply within {self._timeout} s")
                d, args, sent = waiting.popleft()
                if isinstance(reply, Exception):
                    if not d.called:
                        d.errback(reply)
                    continue
                with contextlib.suppress(Exception):
                    self._on_reply(sent, args, reply)
                if not d.called:
                    d.callback(reply)
        except BaseException as exc:
            if connection is self._connection:
                self._drop(exc)
            else:  # an older connection, already dropped: fail only its own calls
                while waiting:
                    d = waiting.popleft()[0]
                    if not d.called:
                        d.errback(self._store_error(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise

    def _drop(self, error: BaseException) -> None:
        """The connection failed: fail every call in flight, forget the connection."""
        connection, self._connection = self._connection, None
        waiting, self._waiting = self._waiting, deque()
        for d, _, _ in waiting:
            if not d.called:
                d.errback(self._store_error(error))
        if connection is not None:
            with contextlib.suppress(Exception):
                self._spawn(connection.disconnect(nowait=True))

    def close(self) -> None:
        self._closed = True
        for task in (self._reader, self._connecting, *self._background):
            if task is not None:
                task.cancel()
        self._drop(ConnectionError("the connection is closed"))
