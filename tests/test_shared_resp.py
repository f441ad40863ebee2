"""The Redis reply parser the script wire reads with: every type, any split of the bytes."""

from __future__ import annotations

import pytest
from redis.exceptions import NoScriptError, ResponseError

from slotkit.shared.resp import ProtocolError, ReplyParser


def parser() -> ReplyParser:
    from redis._parsers.base import BaseParser

    return ReplyParser(lambda data: data.decode("utf-8"), BaseParser.parse_error)


def parse_all(data: bytes) -> list[object]:
    return list(parser().feed(data))


@pytest.mark.parametrize(
    ("wire", "value"),
    [
        (b"+OK\r\n", "OK"),
        (b":-42\r\n", -42),
        (b"$5\r\nhello\r\n", "hello"),
        (b"$0\r\n\r\n", ""),
        (b"$-1\r\n", None),
        (b"*-1\r\n", None),
        (b"*0\r\n", []),
        (b"*3\r\n$2\r\nok\r\n:7\r\n*1\r\n$1\r\nx\r\n", ["ok", 7, ["x"]]),
        (b"$4\r\na\r\nb\r\n", "a\r\nb"),  # a bulk string's length, not its CRLF, ends it
        # RESP3
        (b"_\r\n", None),
        (b",1.5\r\n", 1.5),
        (b"#t\r\n", True),
        (b"#f\r\n", False),
        (b"(12345678901234567890\r\n", 12345678901234567890),
        (b"=8\r\ntxt:abcd\r\n", "abcd"),
        (b"%1\r\n+key\r\n:1\r\n", {"key": 1}),
        (b"~2\r\n+a\r\n+b\r\n", ["a", "b"]),
        (b">2\r\n+message\r\n+x\r\n", ["message", "x"]),
        (b"|1\r\n+ttl\r\n:3\r\n+OK\r\n", "OK"),  # attributes are skipped
    ],
)
def test_every_reply_type_is_parsed(wire: bytes, value: object) -> None:
    assert parse_all(wire) == [value]


def test_error_replies_become_redis_py_exceptions() -> None:
    replies = parse_all(b"-NOSCRIPT No matching script\r\n-ERR bad\r\n!9\r\nERR blob!\r\n")
    assert isinstance(replies[0], NoScriptError)
    assert isinstance(replies[1], ResponseError)
    assert str(replies[1]) == "bad"
    assert isinstance(replies[2], ResponseError)
    assert "blob" in str(replies[2])


def test_bytes_arriving_one_at_a_time_give_the_same_replies_in_order() -> None:
    wire = b"*2\r\n$2\r\nok\r\n:5\r\n+OK\r\n$3\r\nabc\r\n%1\r\n+k\r\n*1\r\n:1\r\n"
    reader = parser()
    seen: list[object] = []
    for i in range(len(wire)):
        seen.extend(reader.feed(wire[i : i + 1]))
        if i < 14:
            assert seen == [], "nothing before the first reply is complete"
    assert seen == [["ok", 5], "OK", "abc", {"k": [1]}]


@pytest.mark.parametrize("wire", [b"?what\r\n", b":12x\r\n", b"$abc\r\nxyz\r\n"])
def test_bytes_that_are_no_reply_raise_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_all(wire)
