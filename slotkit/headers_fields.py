"""Finding rate-limit headers and splitting their values (part of :mod:`slotkit.headers`).

Collects the known headers of a response (case-insensitively, from Scrapy
``Headers``, mappings or pairs) and splits list / parameter values the way
structured fields are written, tolerating what real servers send.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from slotkit.headers_values import _OWS, _to_text

_KEY_RE = re.compile(r"[a-z*][a-z0-9_.*-]*", re.ASCII)


# --------------------------------------------------------------------------
# Header collection


def _header_name(key: object) -> str | None:
    if isinstance(key, (bytes, bytearray)):
        name = bytes(key).decode("latin-1")
    elif isinstance(key, str):
        name = key
    else:
        return None
    name = name.strip(_OWS)
    if not name.isascii():
        return None
    return name.lower()


def _value_list(value: object) -> list[object]:
    if isinstance(value, (str, bytes, bytearray, memoryview, int, float)):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    return []


_RETRY_AFTER = "retry-after"
_DATE = "date"
_RATELIMIT = "ratelimit"
_RATELIMIT_POLICY = "ratelimit-policy"
_DRAFT_LIMIT = "ratelimit-limit"
_DRAFT_REMAINING = "ratelimit-remaining"
_DRAFT_RESET = "ratelimit-reset"
_X_LIMIT = ("x-ratelimit-limit", "x-rate-limit-limit")
_X_REMAINING = ("x-ratelimit-remaining", "x-rate-limit-remaining")
_X_RESET = ("x-ratelimit-reset", "x-rate-limit-reset")

#: Every header name the parser reads, in the order used for ``sources``.
KNOWN_HEADERS: tuple[str, ...] = (
    _RETRY_AFTER,
    _RATELIMIT,
    _RATELIMIT_POLICY,
    _DRAFT_LIMIT,
    _DRAFT_REMAINING,
    _DRAFT_RESET,
    *_X_LIMIT,
    *_X_REMAINING,
    *_X_RESET,
    _DATE,
)
_KNOWN = frozenset(KNOWN_HEADERS)


def _collect(headers: object) -> dict[str, list[str]]:
    """Known headers, lower-case name -> decoded values, in input order."""
    if headers is None:
        return {}
    items: Iterable[Any]
    if isinstance(headers, Mapping) or hasattr(headers, "items"):
        items = headers.items()
    elif isinstance(headers, (list, tuple)):
        items = headers
    else:
        return {}
    found: dict[str, list[str]] = {}
    for pair in items:
        if not isinstance(pair, tuple) or len(pair) != 2:
            continue
        name = _header_name(pair[0])
        if name is None or name not in _KNOWN:
            continue
        for raw in _value_list(pair[1]):
            text = _to_text(raw)
            if text is not None:
                found.setdefault(name, []).append(text)
    return found


# --------------------------------------------------------------------------
# Tolerant structured-field splitting


def _split_outside_quotes(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [part.strip(_OWS) for part in parts]


def _unquote(text: str) -> str:
    text = text.strip(_OWS)
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _key_value(segment: str) -> tuple[str, str] | None:
    """Split ``key=value``; ``None`` unless the key is a valid lower key."""
    key, sep, value = segment.partition("=")
    key = key.strip(_OWS).lower()
    if not sep or _KEY_RE.fullmatch(key) is None:
        return None
    return key, value.strip(_OWS)


@dataclass(slots=True)
class _Member:
    """One list member: a bare item (or a dictionary key/value) + params."""

    item: str
    key: str | None
    params: dict[str, str]


def _parse_members(values: list[str]) -> list[_Member]:
    members: list[_Member] = []
    for value in values:
        for raw_member in _split_outside_quotes(value, ","):
            if not raw_member:
                continue
            segments = _split_outside_quotes(raw_member, ";")
            head = segments[0]
            key: str | None = None
            if not head.startswith('"'):
                pair = _key_value(head)
                if pair is not None:
                    key, head = pair
            params: dict[str, str] = {}
            for segment in segments[1:]:
                pair = _key_value(segment)
                if pair is not None:
                    params.setdefault(pair[0], _unquote(pair[1]))
            members.append(_Member(_unquote(head), key, params))
    return members
