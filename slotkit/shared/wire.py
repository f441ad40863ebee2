"""One pipelined Redis connection for the script calls, tuned for a busy event loop.

redis-py's ``Redis.evalsha`` costs several turns of the event loop before
the command even leaves: the pool's lock, then ``asyncio.wait_for`` around
the write (a new task) whenever a socket timeout is set; and its reply
wakes a reader task, one more turn queued behind everything else the loop
has to do. In a crawler whose loop is busy with responses each turn can
take milliseconds, so the round trip of a 0.1 ms script grows to 5-10 ms.

:class:`ScriptWire` owns one connection (:mod:`slotkit.shared.owned`):

* each call is written at once, from the caller's turn of the loop (no
  task, no lock): calls issued together are pipelined on the wire;
* replies are parsed as their bytes are read and fire their calls'
  Deferreds in order, in the turn that read them;
* while calls wait, a reply must come within the timeout of the previous
  one (or of the first call); otherwise, or on a connection error, every
  call in flight fails with the store error and the connection is dropped
  (the next call connects again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred

from slotkit.shared.owned import Replies, give_back, own_connection
from slotkit.shared.resp import Push

__all__ = ["ScriptWire"]

logger = logging.getLogger(__name__)

#: A call written and not answered yet: its Deferred, its arguments, when it was sent.
_Call = tuple[Deferred[Any], Sequence[str], float]


class ScriptWire:
    """EVALSHA calls on one connection: written at once, answered as bytes arrive."""

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
        self._replies: Replies | None = None
        self._connecting: asyncio.Task[Any] | None = None
        self._waiting: deque[_Call] = deque()
        #: The loop's time of the last reply, or of the call that found none waiting.
        self._progress = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self._closed = False
        self._background: set[asyncio.Task[Any]] = set()

    def call(self, *args: str) -> Deferred[Any]:
        """Send one command; the Deferred fires with its reply or an ``Exception``."""
        d: Deferred[Any] = Deferred()
        if self._closed:
            d.errback(self._store_error(ConnectionError("the connection is closed")))
        elif self._replies is None or self._replies.transport.is_closing():
            if self._replies is not None:  # its calls must not wait for the next one's replies
                self._drop(ConnectionError("the connection is closing"))
            # First call, or after a failure: connect (in a task), then send.
            task = self._spawn(self._connect_and_send(d, args))
            # A task cancelled before its first step (close() in this very
            # turn) never runs its body: its call must still end.
            task.add_done_callback(lambda done: self._unstarted(done, d))
        else:
            self._send(d, args)
        return d

    def _unstarted(self, task: asyncio.Task[Any], d: Deferred[Any]) -> None:
        # Cancelled once running, the task fails its call itself; cancelled
        # before its first step, it never ran at all.
        if task.cancelled() and not d.called:
            d.errback(self._store_error(ConnectionError("the connection is closed")))

    def _send(self, d: Deferred[Any], args: Sequence[str]) -> None:
        assert self._replies is not None
        try:
            self._replies.transport.writelines(self._connection.pack_command(*args))
        except Exception as exc:
            d.errback(self._store_error(exc))
            self._drop(exc)
            return
        if not self._waiting:
            self._progress = asyncio.get_running_loop().time()
            self._watch()
        self._waiting.append((d, args, self._now()))

    async def _connect_and_send(self, d: Deferred[Any], args: Sequence[str]) -> None:
        try:
            if self._connecting is None or self._connecting.done():
                self._connecting = asyncio.ensure_future(self._connect())
            await asyncio.shield(self._connecting)
        except BaseException as exc:
            if not d.called:
                d.errback(self._store_error(exc))
            return
        if self._replies is None or self._replies.transport.is_closing():
            d.errback(self._store_error(ConnectionError("the connection closed at once")))
            return
        self._send(d, args)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _connect(self) -> None:
        connection, replies = await own_connection(
            self._redis, self._timeout, self._replied, self._drop
        )
        if self._closed:
            replies.stop()
            await give_back(self._redis, connection)
            raise ConnectionError("the connection is closed")
        self._connection, self._replies = connection, replies

    def _replied(self, reply: Any) -> None:
        if isinstance(reply, Push):  # the server's own news, not an answer: no call is due
            logger.debug("slotkit: the shared store pushed %r; ignored", reply[:1])
            return
        if not self._waiting:
            self._drop(ConnectionError(f"a reply no call waited for: {reply!r}"))
            return
        d, args, sent = self._waiting.popleft()
        self._progress = asyncio.get_running_loop().time()
        if isinstance(reply, Exception):  # an error reply (NOSCRIPT): that call fails
            if not d.called:
                d.errback(reply)
            return
        with contextlib.suppress(Exception):
            self._on_reply(sent, args, reply)
        if not d.called:
            d.callback(reply)

    def _watch(self) -> None:
        """Fail the calls in flight when no reply comes within the timeout."""
        if self._watchdog is None:
            loop = asyncio.get_running_loop()
            self._watchdog = loop.call_at(self._progress + self._timeout, self._check)

    def _check(self) -> None:
        self._watchdog = None
        if not self._waiting:
            return
        if asyncio.get_running_loop().time() - self._progress >= self._timeout:
            self._drop(TimeoutError(f"no reply within {self._timeout} s"))
        else:
            self._watch()

    def _drop(self, error: BaseException) -> None:
        """The connection failed: fail every call in flight, forget the connection."""
        connection, self._connection = self._connection, None
        if self._replies is not None:
            self._replies.stop()
            self._replies = None
        waiting, self._waiting = self._waiting, deque()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for d, _, _ in waiting:
            if not d.called:
                d.errback(self._store_error(error))
        if connection is not None:
            self._spawn(give_back(self._redis, connection))

    def close(self) -> None:
        self._closed = True
        for task in (self._connecting, *self._background):
            if task is not None:
                task.cancel()
        self._drop(ConnectionError("the connection is closed"))
