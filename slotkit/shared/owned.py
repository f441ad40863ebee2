"""A redis-py connection whose replies slotkit reads itself, straight from the transport.

redis-py opens the connection (address, TLS, password, database and
protocol version all come from the URL as usual) and runs its handshake;
then :func:`own_connection` swaps the transport's protocol for
:class:`Replies`, which parses each chunk as it is read
(:mod:`slotkit.shared.resp`) and hands every complete reply to a callback
in that same turn of the event loop. redis-py's own stream reader would
wake a reader task instead: one more turn, queued behind everything else
the loop has to do, which in a crawling worker is a large share of a
reply's latency.

The connection is never given back to redis-py's pool, so nothing else
reads or writes on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from slotkit.shared.resp import ReplyParser

__all__ = ["Replies", "give_back", "own_connection"]


class Replies(asyncio.Protocol):
    """An owned connection's protocol: each reply to *on_reply*, the end once to *on_lost*."""

    def __init__(
        self,
        transport: asyncio.Transport,
        parser: ReplyParser,
        on_reply: Callable[[Any], None],
        on_lost: Callable[[BaseException], None],
    ) -> None:
        self.transport = transport
        self._parser = parser
        self._on_reply = on_reply
        self._on_lost = on_lost
        self._active = True
        # redis-py's stream protocol, still told of the connection's end so
        # that its writer's wait_closed() (redis-py awaits it when closing) returns.
        self._before = transport.get_protocol()

    def stop(self) -> None:
        """Deliver nothing more: the owner is done with this connection."""
        self._active = False

    def data_received(self, data: bytes) -> None:
        try:
            for reply in self._parser.feed(data):
                if not self._active:  # stopped by an earlier reply's callback
                    return
                self._on_reply(reply)
        except Exception as exc:  # bytes that are no reply: nothing after them can be trusted
            self._lost(exc)

    def eof_received(self) -> bool:
        return False  # the server closed its side: close ours, connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc or ConnectionError("the server closed the connection"))
        with contextlib.suppress(Exception):
            self._before.connection_lost(exc)

    def _lost(self, error: BaseException) -> None:
        if self._active:
            self._active = False
            self._on_lost(error)


async def own_connection(
    redis: Any,
    timeout: float,
    on_reply: Callable[[Any], None],
    on_lost: Callable[[BaseException], None],
) -> tuple[Any, Replies]:
    """Open a connection of *redis*'s pool and read its replies with :class:`Replies`."""
    pool = redis.connection_pool
    try:
        getting = pool.get_connection()
    except TypeError:  # redis-py 5 wants a command name (8 warns about one)
        getting = pool.get_connection("EVALSHA")
    # The handshake reads replies without a socket timeout: bound it here.
    connection = await asyncio.wait_for(getting, 4 * timeout)
    transport = connection._writer.transport
    replies = Replies(transport, _parser(connection), on_reply, on_lost)
    transport.set_protocol(replies)
    # The server may have closed the connection before the swap (redis-py's
    # pool hands out a connection whose EOF it has not noticed): its stream
    # reader saw that, and Replies never will.
    reader = connection._reader
    if transport.is_closing() or getattr(reader, "_eof", False) or reader.exception():
        replies.stop()
        await give_back(redis, connection)
        raise ConnectionError("the server closed the connection as it was opened")
    return connection, replies


async def give_back(redis: Any, connection: Any) -> None:
    """Close an owned connection and return it to *redis*'s pool, which may open it again."""
    with contextlib.suppress(Exception):
        await connection.disconnect(nowait=True)
    # Not given back, every reconnection would leave one more in the pool's
    # in-use set, up to a URL's max_connections.
    with contextlib.suppress(Exception):
        await redis.connection_pool.release(connection)


def _parser(connection: Any) -> ReplyParser:
    try:
        from redis._parsers.base import BaseParser
    except ImportError:  # a redis-py without the module: every error reply is a ResponseError
        from redis.exceptions import ResponseError

        return ReplyParser(connection.encoder.decode, ResponseError)
    return ReplyParser(connection.encoder.decode, BaseParser.parse_error)
