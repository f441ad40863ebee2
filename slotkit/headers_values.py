"""Scalar parsers for rate-limit header values (part of :mod:`slotkit.headers`).

Decoding one header value, tolerant non-negative numbers, RFC 9110
delta-seconds and HTTP-dates. Like the rest of the parser, nothing here reads
a clock or raises on bad input.

The ``*_problem`` helpers say, in a few words, why a value was rejected; they
are only called on the rejection path, for the debug log of
:mod:`slotkit.headers`.
"""

from __future__ import annotations

import calendar
import datetime
import math
import re

#: Largest number of seconds accepted as a delay or reset (about 31.7 years).
#: Reset numbers at or above it in the separate reset fields are epoch times.
MAX_DELTA_SECONDS = 10**9

#: Header values longer than this (in characters) are ignored as garbage.
MAX_VALUE_LENGTH = 4096

# Longest run of characters accepted for one number; keeps float/int
# conversion cheap and far away from Python's int-string digit limit.
_MAX_NUMBER_CHARS = 32

_OWS = " \t"

#: Characters of a rejected value quoted in a debug log line.
_SHOWN_CHARS = 100

_INTEGER_RE = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)

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


def _value_problem(value: object) -> str:
    """Why :func:`_to_text` returned ``None`` for *value*."""
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return f"longer than {MAX_VALUE_LENGTH} characters"
    if isinstance(value, int) and not isinstance(value, bool):
        return "integer too large"
    return f"unsupported value type {_type_name(value)}"


def _type_name(value: object) -> str:
    return ascii(type(value).__name__)[1:-1]


def _show(value: object, limit: int = _SHOWN_CHARS) -> str:
    """A short, log-safe rendering of a header value: ASCII only, escaped.

    Text and bytes are cut to *limit* characters (bytes are shown byte for
    byte, as Latin-1); other objects are shown by type only, so that no
    foreign ``__repr__`` runs.
    """
    if isinstance(value, str):
        text = value
    elif isinstance(value, (bytes, bytearray, memoryview)):
        text = bytes(value).decode("latin-1")
    elif isinstance(value, float) or (
        isinstance(value, int) and abs(value) < 10**_MAX_NUMBER_CHARS
    ):
        return repr(value)
    elif isinstance(value, int):
        return f"<int of {value.bit_length()} bits>"
    else:
        return f"<{_type_name(value)}>"
    shown = ascii(text[:limit])
    if len(text) <= limit and len(shown) <= limit + 2:
        return shown
    return f"{shown[:limit]}... ({len(text)} chars)"


def _finite_in_range(number: float, maximum: float) -> float | None:
    if math.isfinite(number) and 0 <= number <= maximum:
        return number
    return None


def _wait_at_most(number: float, maximum: float) -> float | None:
    """*number* if it is a wait of 0 or more seconds; a longer one than *maximum* is *maximum*.

    A server asking for longer than any wait this module reports (31 years)
    still asks for the longest: the caller caps it at ``BACKOFF_MAX_DELAY``,
    as the specification says, rather than retrying at once.
    """
    if math.isnan(number) or number < 0:
        return None
    return min(number, maximum)


def _parse_number(
    text: str, *, fractions: bool = True, maximum: float = math.inf, clamp: bool = False
) -> float | None:
    """A non-negative ASCII integer or decimal, or ``None``.

    Above *maximum*: ``None``, or *maximum* with *clamp* (a wait, of any
    number of digits).
    """
    text = text.strip(_OWS)
    if not text or (len(text) > _MAX_NUMBER_CHARS and not clamp):
        return None
    pattern = _DECIMAL_RE if fractions else _INTEGER_RE
    if pattern.fullmatch(text) is None:
        return None
    # float() reads any number of digits cheaply (int() would hit Python's
    # digit limit); _to_text already refused values over MAX_VALUE_LENGTH.
    number = float(text)
    return _wait_at_most(number, maximum) if clamp else _finite_in_range(number, maximum)


_NOT_A_NUMBER = "not a number"


def _number_problem(text: str, *, fractions: bool = True, maximum: float = math.inf) -> str:
    """Why :func:`_parse_number` rejected *text* (``_NOT_A_NUMBER`` if unclear)."""
    text = text.strip(_OWS)
    if not text:
        return "empty"
    if not text.isascii():
        return "non-ASCII characters"
    unsigned = text[1:] if text[0] in "+-" else text
    if unsigned.lower() in ("nan", "inf", "infinity"):
        return "not a finite number"
    if text[0] == "-" and _DECIMAL_RE.fullmatch(unsigned):
        return "negative"
    if _DECIMAL_RE.fullmatch(text):
        if not fractions and _INTEGER_RE.fullmatch(text) is None:
            return "not a whole number"
        if len(text) > _MAX_NUMBER_CHARS:
            return "too many digits"
        return f"more than {maximum:.0f} seconds"  # only seconds have a maximum
    if len(text) <= _MAX_NUMBER_CHARS:
        try:
            float(text)
        except ValueError:
            pass
        else:  # signs, exponents, digit separators, a bare "." ...
            return "not a plain integer" if not fractions else "not a plain decimal number"
    return _NOT_A_NUMBER


def parse_delta_seconds(value: str | bytes) -> float | None:
    """Parse RFC 9110 delta-seconds (``1*DIGIT``) as a positive delay.

    A plain decimal (``2.5``) is taken too: the RFC allows whole seconds
    only, but a server that sends one means it, and ignoring it had the
    ordinary backoff step send sooner than it asked. Below one second it is
    one second, the least whole seconds can say: ``0.01`` re-sent a
    rate-limited request every 10 ms (a review: 250 requests in 3 s).
    Returns ``None`` for zero, negatives and anything that is not a plain
    ASCII number; a value above ``MAX_DELTA_SECONDS`` is that.
    """
    text = _to_text(value)
    if text is None:
        return None
    number = _parse_number(text, maximum=MAX_DELTA_SECONDS, clamp=True)
    if number is None or number <= 0:
        return None
    return max(number, 1.0)


def _retry_after_problem(text: str) -> str | None:
    """Why a ``Retry-After`` value that is not an HTTP-date gave no delay.

    ``None`` for zero, which is well-formed and simply asks for no wait.
    """
    if _parse_number(text) == 0:
        return None
    problem = _number_problem(text, maximum=MAX_DELTA_SECONDS)
    return "neither delta-seconds nor an HTTP-date" if problem == _NOT_A_NUMBER else problem


def _ahead_problem(delta: float, what: str) -> str | None:
    """Why a moment *delta* seconds ahead gave no wait (``None``: not ahead)."""
    if delta > MAX_DELTA_SECONDS:
        return f"{what} more than {MAX_DELTA_SECONDS} seconds ahead"
    if math.isnan(delta):
        return f"{what} cannot be compared with the current time"
    # Not in the future: a well-formed value that asks for no wait.
    return None


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
