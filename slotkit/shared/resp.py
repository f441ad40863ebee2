"""Redis replies parsed as their bytes arrive (RESP2, and the types RESP3 adds).

The script wire hands every chunk a connection reads to :class:`ReplyParser`
from the transport's own ``data_received`` callback, so a complete reply
fires its call in the turn of the event loop that read it. (redis-py's
stream reader wakes a reader task instead: one more turn, queued behind
whatever else that turn holds, which in a crawling worker is the largest
share of an acquire's round trip at the tail.)

The replies the wire reads are small (a script's answer, a script's SHA),
so an incomplete reply is simply parsed again from its start when more
bytes come.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ProtocolError", "Push", "ReplyParser"]

_CRLF = b"\r\n"
#: A reply whose bytes have not all arrived yet.
_INCOMPLETE: Any = object()


class ProtocolError(Exception):
    """The server sent bytes that are not a Redis reply."""


class Push(list[Any]):
    """A RESP3 push: sent by the server on its own (a pub/sub message, a
    client-tracking invalidation, a maintenance notice), never the reply to a call."""


class ReplyParser:
    """Complete replies out of a byte stream, in order.

    *decode* turns a bulk or simple string's bytes into the value callers
    see (``str`` with ``decode_responses``); *error* turns an error reply's
    text into the exception a call fails with.
    """

    def __init__(self, decode: Callable[[bytes], Any], error: Callable[[str], Exception]) -> None:
        self._decode = decode
        self._error = error
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[Any]:
        """Take *data*; yield every reply it completes (errors as exception instances)."""
        self._buffer += data
        while self._buffer:
            parsed = self._parse(0)
            if parsed is _INCOMPLETE:
                return
            value, end = parsed
            del self._buffer[:end]
            yield value

    def _parse(self, start: int) -> Any:
        buffer = self._buffer
        eol = buffer.find(_CRLF, start)
        if eol < 0:
            return _INCOMPLETE
        kind = buffer[start]
        line = bytes(buffer[start + 1 : eol])
        after = eol + 2
        try:
            if kind == 0x2B:  # + simple string
                return self._decode(line), after
            if kind == 0x2D:  # - error
                return self._error(line.decode("utf-8", "replace")), after
            if kind in (0x3A, 0x28):  # : integer, ( big number
                return int(line), after
            if kind == 0x2C:  # , double
                return float(line), after
            if kind == 0x23:  # # boolean
                return line == b"t", after
            if kind == 0x5F:  # _ null
                return None, after
            if kind in (0x24, 0x3D, 0x21):  # $ bulk, = verbatim, ! bulk error
                return self._bulk(kind, int(line), after)
            if kind in (0x2A, 0x7E, 0x3E, 0x25, 0x7C):  # * array, ~ set, > push, % map, | attribute
                return self._aggregate(kind, int(line), after)
        except ValueError as exc:
            raise ProtocolError(f"a malformed reply line {bytes(buffer[start:eol])!r}") from exc
        raise ProtocolError(f"an unknown reply type {chr(kind)!r}")

    def _bulk(self, kind: int, size: int, start: int) -> Any:
        if size < 0:
            return None, start
        end = start + size
        if len(self._buffer) < end + 2:
            return _INCOMPLETE
        data = bytes(self._buffer[start:end])
        if kind == 0x21:
            return self._error(data.decode("utf-8", "replace")), end + 2
        if kind == 0x3D:  # "txt:" or "mkd:" before the text
            data = data[4:]
        return self._decode(data), end + 2

    def _aggregate(self, kind: int, count: int, start: int) -> Any:
        if count < 0:
            return None, start
        items: list[Any] = []
        for _ in range(count * 2 if kind in (0x25, 0x7C) else count):
            parsed = self._parse(start)
            if parsed is _INCOMPLETE:
                return _INCOMPLETE
            item, start = parsed
            items.append(item)
        if kind == 0x7C:  # attributes describe the reply that follows: skip them
            return self._parse(start)
        if kind == 0x25:
            return dict(zip(items[::2], items[1::2], strict=True)), start
        if kind == 0x3E:
            return Push(items), start
        return items, start
