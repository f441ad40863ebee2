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

from slotkit.headers_values import _OWS, _to_text, _value_problem

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


def _value_list(value: object) -> list[object] | tuple[object, ...]:
    """The values of one header: a list or tuple of them, or a single one.

    Unusable types are kept, for :func:`_to_text` to refuse (and report);
    ``None`` counts as no value.
    """
    if isinstance(value, (list, tuple)):
        return value
    return () if value is None else (value,)


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

# Header key (str or bytes, as given) -> its known lower-case name, or "" for
# any other header. Responses repeat a few dozen names, and looking one up
# costs far less than normalising it, on every header of every response.
# Bounded (long keys are not cached; the cache is emptied when full), so a
# server inventing names cannot grow it.
_NAME_CACHE: dict[str | bytes, str] = {}
_NAME_CACHE_SIZE = 1024
_NAME_CACHE_KEY_LENGTH = 64


def _known_name(key: Any) -> str:
    """The lower-case name of *key* if the parser reads it, else ``""``."""
    cacheable = type(key) is bytes or type(key) is str
    if cacheable:
        name = _NAME_CACHE.get(key)
        if name is not None:
            return name
    normalised = _header_name(key)
    name = normalised if normalised in _KNOWN else ""
    if cacheable and len(key) <= _NAME_CACHE_KEY_LENGTH:
        if len(_NAME_CACHE) >= _NAME_CACHE_SIZE:
            _NAME_CACHE.clear()
        _NAME_CACHE[key] = name
    return name


#: How log lines spell each known header.
_DISPLAY_NAMES: dict[str, str] = {
    name: "-".join(
        {"ratelimit": "RateLimit", "x": "X"}.get(part, part.capitalize())
        for part in name.split("-")
    )
    for name in KNOWN_HEADERS
}

#: A value the parser could not use: lower-case header name, the value (the
#: decoded text, or the original object when it could not be decoded) and why.
_Rejected = tuple[str, object, str]


def _collect(headers: object) -> tuple[dict[str, list[str]], list[_Rejected] | None]:
    """Known headers, lower-case name -> decoded values, in input order.

    Also returns the rate-limit header values that could not be decoded (too
    long, or of an unusable type), or ``None`` when there were none; values
    of ``Date``, which is not a rate-limit header, are dropped silently.
    """
    if not headers:  # None, or no header at all
        return {}, None
    items: Iterable[Any]
    getlist = getattr(headers, "getlist", None)
    if getlist is not None and hasattr(headers, "keys"):
        # Scrapy's Headers: its items() builds every value list (5 of the
        # 8 us a plain response cost here); only known names need theirs.
        keys = headers.keys()  # any object with getlist() and keys(), not only dicts
        items = [(key, getlist(key)) for key in keys if _known_name(key)]
    elif isinstance(headers, Mapping) or hasattr(headers, "items"):
        items = headers.items()
    elif isinstance(headers, (list, tuple)):
        items = headers
    else:
        return {}, None
    found: dict[str, list[str]] = {}
    rejected: list[_Rejected] | None = None
    for pair in items:
        if not isinstance(pair, tuple) or len(pair) != 2:
            continue
        name = _known_name(pair[0])
        if not name:
            continue
        for raw in _value_list(pair[1]):
            text = _to_text(raw)
            if text is not None:
                found.setdefault(name, []).append(text)
            elif name != _DATE:
                if rejected is None:
                    rejected = []
                rejected.append((name, raw, _value_problem(raw)))
    return found, rejected


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
