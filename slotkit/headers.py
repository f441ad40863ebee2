"""Pure parsing of rate-limit response headers into a :class:`RateLimitHint`.

Nothing here touches a reactor or a clock: the caller passes ``now`` (seconds
since the epoch) and every function is deterministic. No function in this
module raises, whatever it is given; invalid input simply yields ``None`` (or
an empty hint).

Headers understood
------------------
``Retry-After``
    Either delta-seconds or an HTTP-date (IMF-fixdate, RFC 850 or asctime).
    Delta-seconds must be a positive integer written with ASCII digits (RFC
    9110 ``1*DIGIT``): ``0``, negative numbers, fractions such as ``1.5``,
    exponents and anything else are rejected, so the caller falls back to
    exponential backoff. An HTTP-date is measured against the response's own
    ``Date`` header when that is valid (so clock skew between client and
    server cancels out), otherwise against ``now``; a date that is not in the
    future is rejected. With several values the largest valid one wins.
``RateLimit`` (draft-ietf-httpapi-ratelimit-headers)
    The current structured form, a list of policies such as
    ``"default";r=50;t=30`` (``r`` remaining, ``t`` seconds until reset), and
    the earlier dictionary form ``limit=100, remaining=50, reset=30``.
``RateLimit-Policy``
    ``"default";q=100;w=60`` (quota and window) and the older ``100;w=60``.
    Used for ``limit``/``window`` when the binding policy (see below) does
    not state them itself: the policy with the same name if there is one,
    otherwise the one with the smallest quota.
``RateLimit-Limit`` / ``RateLimit-Remaining`` / ``RateLimit-Reset``
    The early-draft separate fields (plain numbers; the first member of
    ``RateLimit-Limit`` may carry a ``w=``/``window=`` parameter).
``X-RateLimit-Limit`` / ``X-RateLimit-Remaining`` / ``X-RateLimit-Reset``
    The de-facto headers, also under the ``X-Rate-Limit-*`` spelling.

Decisions
---------
* Quota and reset numbers (everything except ``Retry-After``) are parsed
  tolerantly: non-negative decimals such as ``1.5`` are accepted because
  they are common in the wild. A reset of ``0`` is a valid *reset* value
  but never produces a delay.
* A number read from the separate ``RateLimit-Reset`` / ``X-RateLimit-Reset``
  fields that is at least ``10**9`` is taken to be an absolute Unix
  timestamp (as GitHub sends) and converted to a delta against the ``Date``
  header, or ``now``; a timestamp that is not in the future is ignored.
* Any delay or reset above ``MAX_DELTA_SECONDS`` (``10**9`` s) is rejected
  rather than clamped; NaN and infinities never come out. Capping at
  ``BACKOFF_MAX_DELAY`` is the caller's job.
* Each header family (structured ``RateLimit`` items, the ``RateLimit-*``
  separate fields, the ``X-RateLimit-*`` fields) gives one or more
  *policies*. ``remaining`` is the smallest remaining value of any policy,
  and a policy that states a reset but no remaining value inherits it. The *binding*
  policy is the exhausted one (remaining 0) with the latest reset, else the
  one with the least remaining (latest reset on ties), else (when nothing
  states a remaining value) the one with the latest reset. ``reset``
  describes the binding policy, and so do ``limit``/``window`` when it
  states a limit itself.
* A reset turns into a wait only when its policy is exhausted or its
  remaining value is unknown (no header of the response states one).
  ``delay`` is the largest of these waits and of the valid ``Retry-After``
  values. The parser does not know the status code: callers are expected
  to apply ``delay`` on backoff triggers, and may use ``remaining`` and
  ``reset`` to reconcile quotas on any response.
* Header values longer than ``MAX_VALUE_LENGTH`` characters are ignored.
"""

from __future__ import annotations

import calendar
import datetime
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KNOWN_HEADERS",
    "MAX_DELTA_SECONDS",
    "MAX_VALUE_LENGTH",
    "RateLimitHint",
    "parse_delta_seconds",
    "parse_http_date",
    "parse_rate_limit_headers",
]

#: Largest number of seconds accepted as a delay or reset (about 31.7 years).
#: Reset numbers at or above it in the separate reset fields are epoch times.
MAX_DELTA_SECONDS = 10**9

#: Header values longer than this (in characters) are ignored as garbage.
MAX_VALUE_LENGTH = 4096

# Longest run of characters accepted for one number; keeps float/int
# conversion cheap and far away from Python's int-string digit limit.
_MAX_NUMBER_CHARS = 32

_OWS = " \t"

_INTEGER_RE = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)
_KEY_RE = re.compile(r"[a-z*][a-z0-9_.*-]*", re.ASCII)

_MONTH_ALT = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"
_MONTHS = {name: index for index, name in enumerate(_MONTH_ALT.split("|"), start=1)}
_DAY_ALT = "mon|tue|wed|thu|fri|sat|sun"
_LONG_DAY_ALT = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_TIME = r"([0-9]{2}):([0-9]{2}):([0-9]{2})"
_FLAGS = re.ASCII | re.IGNORECASE

# IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT" (weekday tolerated missing).
_IMF_RE = re.compile(
    rf"(?:(?:{_DAY_ALT})[ \t]*,[ \t]*)?([0-9]{{1,2}})[ \t]+({_MONTH_ALT})[ \t]+"
    rf"([0-9]{{4}})[ \t]+{_TIME}[ \t]+(?:GMT|UTC)",
    _FLAGS,
)
# RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT" (short weekday and a four-digit
# year tolerated, as in many cookie dates).
_RFC850_RE = re.compile(
    rf"(?:{_LONG_DAY_ALT}|{_DAY_ALT})[ \t]*,[ \t]*([0-9]{{1,2}})-({_MONTH_ALT})-"
    rf"([0-9]{{2}}|[0-9]{{4}})[ \t]+{_TIME}[ \t]+(?:GMT|UTC)",
    _FLAGS,
)
# asctime: "Sun Nov  6 08:49:37 1994".
_ASCTIME_RE = re.compile(
    rf"(?:{_DAY_ALT})[ \t]+({_MONTH_ALT})[ \t]+([0-9]{{1,2}})[ \t]+{_TIME}"
    rf"[ \t]+([0-9]{{4}})",
    _FLAGS,
)

# Naive on purpose: all arithmetic here is in UTC and never involves a clock.
_EPOCH = datetime.datetime(1970, 1, 1)


@dataclass(frozen=True, slots=True)
class RateLimitHint:
    """What a response's headers say about the rate limit of its scope.

    All numbers are finite. ``delay`` is ``None`` or in
    ``(0, MAX_DELTA_SECONDS]``; ``remaining``, ``limit``, ``window`` and
    ``reset`` are ``None`` or ``>= 0`` (``window`` ``> 0``).
    """

    #: Seconds to wait before the next request to the scope (largest valid
    #: hint), or ``None`` when the headers ask for no wait.
    delay: float | None = None
    #: Quota units left in the current window (smallest over all policies).
    remaining: float | None = None
    #: Quota size of the binding policy.
    limit: float | None = None
    #: Quota window of the binding policy, in seconds.
    window: float | None = None
    #: Seconds until the binding policy's window resets.
    reset: float | None = None
    #: Lower-case names of the headers that carried at least one valid value.
    sources: tuple[str, ...] = ()

    @property
    def exhausted(self) -> bool:
        """Whether the server reported that no quota is left."""
        return self.remaining is not None and self.remaining <= 0


_EMPTY = RateLimitHint()


# --------------------------------------------------------------------------
# Scalar helpers


def _to_text(value: object) -> str | None:
    """Decode one header value; ``None`` for unusable types or huge values."""
    text: str
    if isinstance(value, str):
        text = value
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) > MAX_VALUE_LENGTH:
            return None
        # Latin-1 maps every byte to a character, so it cannot fail; anything
        # outside ASCII is then rejected by the ASCII-only grammars below.
        text = raw.decode("latin-1")
    elif isinstance(value, bool):
        return None
    elif isinstance(value, (int, float)):
        if isinstance(value, int) and abs(value) >= 10**_MAX_NUMBER_CHARS:
            return None
        text = repr(value)
    else:
        return None
    if len(text) > MAX_VALUE_LENGTH:
        return None
    return text.strip(_OWS)


def _finite_in_range(number: float, maximum: float) -> float | None:
    if math.isfinite(number) and 0 <= number <= maximum:
        return number
    return None


def _parse_number(text: str, *, fractions: bool = True, maximum: float = math.inf) -> float | None:
    """A non-negative ASCII integer or decimal, or ``None``."""
    text = text.strip(_OWS)
    if not text or len(text) > _MAX_NUMBER_CHARS:
        return None
    pattern = _DECIMAL_RE if fractions else _INTEGER_RE
    if pattern.fullmatch(text) is None:
        return None
    return _finite_in_range(float(text), maximum)


def parse_delta_seconds(value: str | bytes) -> float | None:
    """Parse RFC 9110 delta-seconds (``1*DIGIT``) as a positive delay.

    Returns ``None`` for zero, negatives, fractions, values above
    ``MAX_DELTA_SECONDS`` and anything that is not a plain ASCII integer.
    """
    text = _to_text(value)
    if text is None:
        return None
    number = _parse_number(text, fractions=False, maximum=MAX_DELTA_SECONDS)
    if number is None or number <= 0:
        return None
    return number


def _four_digit_year(two_digits: int, now: float) -> int | None:
    """RFC 9110 rule for RFC 850 years: never more than 50 years ahead."""
    try:
        current = (_EPOCH + datetime.timedelta(seconds=now)).year
    except (OverflowError, ValueError):  # NaN, infinities, out of range
        return None
    year = (current // 100) * 100 + two_digits
    if year > current + 50:
        year -= 100
    return year


def _timestamp(
    year: int, month: int, day: int, hour: int, minute: int, second: int
) -> float | None:
    if not 1 <= month <= 12 or year < 1:
        return None
    if not 1 <= day <= calendar.monthrange(year, month)[1]:
        return None
    # RFC 9110 allows second 60 for leap seconds.
    if hour > 23 or minute > 59 or second > 60:
        return None
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


def parse_http_date(value: str | bytes, *, now: float) -> float | None:
    """Parse an HTTP-date into seconds since the epoch, or ``None``.

    Accepts IMF-fixdate, the obsolete RFC 850 form and asctime. ``now`` is
    only used to place the two-digit years of RFC 850 dates.
    """
    text = _to_text(value)
    if not text:
        return None
    match = _IMF_RE.fullmatch(text)
    if match is not None:
        day, month, year, hour, minute, second = match.groups()
        year_number: int | None = int(year)
    else:
        match = _RFC850_RE.fullmatch(text)
        if match is not None:
            day, month, year, hour, minute, second = match.groups()
            two_digit = len(year) == 2
            year_number = _four_digit_year(int(year), now) if two_digit else int(year)
        else:
            match = _ASCTIME_RE.fullmatch(text)
            if match is None:
                return None
            month, day, hour, minute, second, year = match.groups()
            year_number = int(year)
    if year_number is None:
        return None
    return _timestamp(
        year_number,
        _MONTHS[month.lower()],
        int(day),
        int(hour),
        int(minute),
        int(second),
    )


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

#: Every header name this module reads, in the order used for ``sources``.
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


# --------------------------------------------------------------------------
# Policies


@dataclass(slots=True)
class _Policy:
    name: str | None = None
    remaining: float | None = None
    limit: float | None = None
    window: float | None = None
    reset: float | None = None

    def has_state(self) -> bool:
        return self.remaining is not None or self.reset is not None


def _quota(text: str | None) -> float | None:
    return None if text is None else _parse_number(text)


def _window(text: str | None) -> float | None:
    number = _parse_number(text, maximum=MAX_DELTA_SECONDS) if text else None
    return number if number is not None and number > 0 else None


def _reset_delta(text: str | None) -> float | None:
    return None if text is None else _parse_number(text, maximum=MAX_DELTA_SECONDS)


def _reset_maybe_epoch(text: str, reference: float) -> float | None:
    """Reset from a separate field: delta seconds, or an epoch timestamp."""
    number = _parse_number(text)
    if number is None:
        return None
    if number < MAX_DELTA_SECONDS:
        return number
    delta = number - reference
    if math.isfinite(delta) and 0 < delta <= MAX_DELTA_SECONDS:
        return delta
    return None


class _Sources:
    def __init__(self) -> None:
        self.names: set[str] = set()

    def add(self, name: str, value: float | None) -> float | None:
        if value is not None:
            self.names.add(name)
        return value

    def ordered(self) -> tuple[str, ...]:
        return tuple(name for name in KNOWN_HEADERS if name in self.names)


def _ratelimit_policies(values: list[str], sources: _Sources) -> list[_Policy]:
    """Policies from the ``RateLimit`` field (item and dictionary forms)."""
    policies: list[_Policy] = []
    legacy = _Policy()
    for member in _parse_members(values):
        if member.key is None:
            policy = _Policy(
                name=member.item or None,
                remaining=sources.add(_RATELIMIT, _quota(member.params.get("r"))),
                reset=sources.add(_RATELIMIT, _reset_delta(member.params.get("t"))),
            )
            if policy.has_state():
                policies.append(policy)
        elif member.key == "limit":
            legacy.limit = sources.add(_RATELIMIT, _quota(member.item))
        elif member.key == "remaining":
            legacy.remaining = sources.add(_RATELIMIT, _quota(member.item))
        elif member.key == "reset":
            legacy.reset = sources.add(_RATELIMIT, _reset_delta(member.item))
    if legacy.has_state() or legacy.limit is not None:
        policies.append(legacy)
    return policies


def _quota_policies(values: list[str], sources: _Sources) -> list[_Policy]:
    """Quota definitions from ``RateLimit-Policy``."""
    policies: list[_Policy] = []
    for member in _parse_members(values):
        if member.key is not None:
            continue
        if "q" in member.params:
            name: str | None = member.item or None
            limit = _quota(member.params["q"])
        else:  # older drafts: a bare number with a w= parameter
            name = None
            limit = _quota(member.item)
        window = _window(member.params.get("w") or member.params.get("window"))
        if limit is not None:
            sources.add(_RATELIMIT_POLICY, limit)
            policies.append(_Policy(name=name, limit=limit, window=window))
    return policies


def _numbers(found: dict[str, list[str]], names: Iterable[str], sources: _Sources) -> list[float]:
    numbers: list[float] = []
    for name in names:
        for member in _parse_members(found.get(name, [])):
            if member.key is None:
                number = sources.add(name, _quota(member.item))
                if number is not None:
                    numbers.append(number)
    return numbers


def _limit_line(value: str) -> tuple[float | None, float | None]:
    """Limit (and window) from one ``*-Limit`` line.

    Early drafts let ``RateLimit-Limit`` list quota policies after the
    current limit (``10, 10;w=1, 50;w=60``): the first number is the limit,
    and its window is the ``w``/``window`` parameter of the first member with
    that same quota that carries one.
    """
    limit: float | None = None
    window: float | None = None
    for member in _parse_members([value]):
        if member.key is not None:
            continue
        quota = _quota(member.item)
        if quota is None:
            continue
        if limit is None:
            limit = quota
        if quota == limit and window is None:
            window = _window(member.params.get("w") or member.params.get("window"))
    return limit, window


def _separate_fields_policy(
    found: dict[str, list[str]],
    limit_names: tuple[str, ...],
    remaining_names: tuple[str, ...],
    reset_names: tuple[str, ...],
    reference: float,
    sources: _Sources,
) -> _Policy | None:
    """One policy from a ``*-Limit`` / ``*-Remaining`` / ``*-Reset`` family."""
    policy = _Policy()
    for name in limit_names:
        for value in found.get(name, []):
            limit, window = _limit_line(value)
            if limit is None:
                continue
            sources.add(name, limit)
            if policy.limit is None or limit < policy.limit:
                policy.limit, policy.window = limit, window
    remaining = _numbers(found, remaining_names, sources)
    if remaining:
        policy.remaining = min(remaining)
    resets: list[float] = []
    for name in reset_names:
        for member in _parse_members(found.get(name, [])):
            if member.key is None:
                reset = sources.add(name, _reset_maybe_epoch(member.item, reference))
                if reset is not None:
                    resets.append(reset)
    if resets:
        policy.reset = max(resets)
    if policy.has_state() or policy.limit is not None:
        return policy
    return None


def _reset_key(policy: _Policy) -> float:
    return -1.0 if policy.reset is None else policy.reset


def _scarcity_key(policy: _Policy) -> tuple[float, float]:
    remaining = math.inf if policy.remaining is None else policy.remaining
    return remaining, -_reset_key(policy)


def _binding(policies: list[_Policy]) -> _Policy | None:
    with_remaining = [p for p in policies if p.remaining is not None]
    if with_remaining:
        exhausted = [p for p in with_remaining if p.remaining == 0]
        if exhausted:
            return max(exhausted, key=_reset_key)
        return min(with_remaining, key=_scarcity_key)
    return max(policies, key=_reset_key) if policies else None


def _pick_quota(binding: _Policy | None, quotas: list[_Policy]) -> _Policy | None:
    """The policy that supplies ``limit``/``window`` (never mixed)."""
    if binding is not None and binding.limit is not None:
        return binding
    if not quotas:
        return None
    if binding is not None and binding.name is not None:
        for quota in quotas:
            if quota.name == binding.name:
                return quota
    return min(quotas, key=lambda q: (q.limit, -(q.window or 0.0)))


# --------------------------------------------------------------------------
# Entry point


def _parse(headers: object, now: float) -> RateLimitHint:
    found = _collect(headers)
    if not found:
        return _EMPTY
    sources = _Sources()

    # Like Headers.get(), the last valid Date value wins.
    reference = now
    for text in found.get(_DATE, []):
        server_now = parse_http_date(text, now=now)
        if server_now is not None:
            reference = server_now

    waits: list[float] = []
    for text in found.get(_RETRY_AFTER, []):
        wait = parse_delta_seconds(text)
        if wait is None:
            retry_at = parse_http_date(text, now=now)
            if retry_at is not None:
                wait = _finite_in_range(retry_at - reference, MAX_DELTA_SECONDS)
        if wait is not None and wait > 0:
            sources.add(_RETRY_AFTER, wait)
            waits.append(wait)

    policies = _ratelimit_policies(found.get(_RATELIMIT, []), sources)
    families: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
        ((_DRAFT_LIMIT,), (_DRAFT_REMAINING,), (_DRAFT_RESET,)),
        (_X_LIMIT, _X_REMAINING, _X_RESET),
    )
    for limit_names, remaining_names, reset_names in families:
        policy = _separate_fields_policy(
            found, limit_names, remaining_names, reset_names, reference, sources
        )
        if policy is not None:
            policies.append(policy)
    quotas = _quota_policies(found.get(_RATELIMIT_POLICY, []), sources)

    remaining_values = [p.remaining for p in policies if p.remaining is not None]
    remaining = min(remaining_values) if remaining_values else None
    for policy in policies:
        if policy.remaining is None and policy.reset is not None:
            policy.remaining = remaining  # inherit the response-wide value
        if policy.reset is not None and policy.reset > 0 and not policy.remaining:
            waits.append(policy.reset)

    binding = _binding([p for p in policies if p.has_state()])
    # Families that state a limit but no remaining/reset still inform limit.
    quotas.extend(p for p in policies if not p.has_state() and p.limit is not None)
    quota = _pick_quota(binding, quotas)
    return RateLimitHint(
        delay=max(waits) if waits else None,
        remaining=remaining,
        limit=None if quota is None else quota.limit,
        window=None if quota is None else quota.window,
        reset=None if binding is None else binding.reset,
        sources=sources.ordered(),
    )


def parse_rate_limit_headers(headers: object, *, now: float) -> RateLimitHint:
    """Read the rate-limit hints of a response's headers.

    *headers* is a Scrapy ``Headers`` object, or any mapping (or iterable of
    pairs) from ``str``/``bytes`` names to ``str``/``bytes`` values or lists
    of them; names are matched case-insensitively. *now* is the current
    time in seconds since the epoch, used for HTTP-dates and epoch resets
    when the response has no valid ``Date`` header. Never raises: anything
    unusable is ignored and an empty hint (all ``None``) is returned when
    nothing valid is found.
    """
    try:
        return _parse(headers, now)
    except Exception:  # the contract is "never raise"
        # Only reachable with hostile objects (e.g. an ``items()`` that
        # raises); every str/bytes input is handled by _parse itself.
        return _EMPTY
