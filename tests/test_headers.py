"""Tests for slotkit.headers: the pure rate-limit header parser."""

from __future__ import annotations

import calendar
import contextlib
import dataclasses
import email.utils
import logging
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from scrapy.http import Headers

from slotkit import headers as headers_module
from slotkit.headers import (
    KNOWN_HEADERS,
    MAX_DELTA_SECONDS,
    MAX_VALUE_LENGTH,
    RateLimitHint,
    parse_delta_seconds,
    parse_http_date,
    parse_rate_limit_headers,
)

# 2025-01-01T00:00:00Z, a Wednesday.
NOW = float(calendar.timegm((2025, 1, 1, 0, 0, 0)))


def imf(timestamp: float) -> str:
    return email.utils.formatdate(timestamp, usegmt=True)


def parse(headers: Any, now: float = NOW) -> RateLimitHint:
    return parse_rate_limit_headers(headers, now=now)


# ----------------------------------------------------------------- delta-seconds


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("120", 120.0, id="plain"),
        pytest.param(b"30", 30.0, id="bytes"),
        pytest.param("1", 1.0, id="one"),
        pytest.param("007", 7.0, id="leading-zeros"),
        pytest.param(" \t5 ", 5.0, id="optional-whitespace"),
        pytest.param(str(MAX_DELTA_SECONDS), float(MAX_DELTA_SECONDS), id="at-cap"),
        pytest.param("0", None, id="zero"),
        pytest.param("000", None, id="zeros"),
        pytest.param("-1", None, id="negative"),
        pytest.param("+5", None, id="plus-sign"),
        # Not RFC 9110's, but a server sending one means it (see parse_delta_seconds).
        pytest.param("1.5", 1.5, id="fraction"),
        pytest.param("2.0", 2.0, id="fraction-integral"),
        pytest.param("0.01", 1.0, id="fraction-below-one-second"),
        pytest.param(".5", None, id="fraction-no-int"),
        pytest.param("1e3", None, id="exponent"),
        pytest.param("1_000", None, id="underscore"),
        pytest.param("0x10", None, id="hex"),
        pytest.param("nan", None, id="nan"),
        pytest.param("inf", None, id="inf"),
        pytest.param("Infinity", None, id="infinity"),
        pytest.param("", None, id="empty"),
        pytest.param("   ", None, id="blank"),
        pytest.param("soon", None, id="garbage"),
        pytest.param("12 34", None, id="two-numbers"),
        pytest.param("120, 60", None, id="comma-list"),
        pytest.param("5s", None, id="unit-suffix"),
        pytest.param("\u0661\u0662", None, id="arabic-indic-digits"),
        pytest.param("\uff11\uff12", None, id="fullwidth-digits"),
        pytest.param("12\xa0", None, id="nbsp"),
        pytest.param("5\n", None, id="trailing-newline"),
        # Asking for longer than any wait is asking for the longest (capped later).
        pytest.param(str(MAX_DELTA_SECONDS + 1), float(MAX_DELTA_SECONDS), id="above-cap"),
        pytest.param("9" * 40, float(MAX_DELTA_SECONDS), id="forty-digits"),
        pytest.param("9" * 5000, None, id="beyond-int-digit-limit"),
        pytest.param(b"\xff\xfe\xfd", None, id="undecodable"),
        pytest.param(b"\xc3\x28", None, id="bad-utf8"),
        pytest.param("\udcff", None, id="lone-surrogate"),
    ],
)
def test_parse_delta_seconds(value: str | bytes, expected: float | None) -> None:
    assert parse_delta_seconds(value) == expected


# ------------------------------------------------------------------- HTTP-date


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("Wed, 01 Jan 2025 00:02:00 GMT", NOW + 120, id="imf-fixdate"),
        pytest.param(b"Wed, 01 Jan 2025 00:02:00 GMT", NOW + 120, id="imf-bytes"),
        pytest.param("wed, 01 jan 2025 00:02:00 gmt", NOW + 120, id="imf-lowercase"),
        pytest.param("01 Jan 2025 00:02:00 GMT", NOW + 120, id="imf-no-weekday"),
        pytest.param("Wed, 1 Jan 2025 00:02:00 GMT", NOW + 120, id="imf-one-digit-day"),
        pytest.param("Wed, 01 Jan 2025 00:02:00 UTC", NOW + 120, id="imf-utc"),
        pytest.param("Wednesday, 01-Jan-25 00:02:00 GMT", NOW + 120, id="rfc850"),
        pytest.param("Wed, 01-Jan-2025 00:02:00 GMT", NOW + 120, id="rfc850-cookie-style"),
        pytest.param("Wed Jan  1 00:02:00 2025", NOW + 120, id="asctime"),
        pytest.param("Wed Jan 01 00:02:00 2025", NOW + 120, id="asctime-two-digit-day"),
        pytest.param(
            "Sun, 06 Nov 1994 08:49:37 GMT",
            float(calendar.timegm((1994, 11, 6, 8, 49, 37))),
            id="rfc9110-example",
        ),
        pytest.param(
            "Sunday, 06-Nov-94 08:49:37 GMT",
            float(calendar.timegm((1994, 11, 6, 8, 49, 37))),
            id="rfc9110-example-rfc850",
        ),
        pytest.param(
            "Sun Nov  6 08:49:37 1994",
            float(calendar.timegm((1994, 11, 6, 8, 49, 37))),
            id="rfc9110-example-asctime",
        ),
        # Two-digit years: at most 50 years ahead of `now` (2025).
        pytest.param(
            "Monday, 01-Jan-74 00:00:00 GMT",
            float(calendar.timegm((2074, 1, 1, 0, 0, 0))),
            id="rfc850-49-years-ahead",
        ),
        pytest.param(
            "Monday, 01-Jan-76 00:00:00 GMT",
            float(calendar.timegm((1976, 1, 1, 0, 0, 0))),
            id="rfc850-51-years-ahead-is-past",
        ),
        pytest.param(
            "Wed, 31 Dec 2025 23:59:60 GMT",
            float(calendar.timegm((2026, 1, 1, 0, 0, 0))),
            id="leap-second",
        ),
        pytest.param("Wed, 30 Feb 2025 00:00:00 GMT", None, id="february-30"),
        pytest.param("Thu, 29 Feb 2024 00:00:00 GMT", 1709164800.0, id="leap-day"),
        pytest.param("Sat, 29 Feb 2025 00:00:00 GMT", None, id="not-a-leap-year"),
        pytest.param("Wed, 01 Jan 2025 24:00:00 GMT", None, id="hour-24"),
        pytest.param("Wed, 01 Jan 2025 00:60:00 GMT", None, id="minute-60"),
        pytest.param("Wed, 01 Jan 2025 00:00:61 GMT", None, id="second-61"),
        pytest.param("Wed, 00 Jan 2025 00:00:00 GMT", None, id="day-zero"),
        pytest.param("Wed, 01 Foo 2025 00:00:00 GMT", None, id="bad-month"),
        pytest.param("Wed, 01 Jan 2025 00:02:00 +0100", None, id="numeric-zone"),
        pytest.param("Wed, 01 Jan 2025 00:02:00", None, id="no-zone"),
        pytest.param("Wed, 01 Jan 0000 00:00:00 GMT", None, id="year-zero"),
        pytest.param("2025-01-01T00:02:00Z", None, id="iso-8601"),
        pytest.param("120", None, id="delta-seconds"),
        pytest.param("", None, id="empty"),
        pytest.param("Wed, \uff101 Jan 2025 00:02:00 GMT", None, id="fullwidth-digit"),
        pytest.param(b"Wed, 01 Jan 2025 00:02:00 GMT\xff", None, id="trailing-garbage"),
        pytest.param(b"\xff" * 40, None, id="undecodable"),
    ],
)
def test_parse_http_date(value: str | bytes, expected: float | None) -> None:
    assert parse_http_date(value, now=NOW) == expected


@pytest.mark.parametrize("now", [math.nan, math.inf, -math.inf, 1e300, -1e300])
def test_parse_http_date_two_digit_year_with_unusable_now(now: float) -> None:
    assert parse_http_date("Monday, 01-Jan-74 00:00:00 GMT", now=now) is None
    # Four-digit years do not need `now`.
    assert parse_http_date("Wed, 01 Jan 2025 00:02:00 GMT", now=now) == NOW + 120


# ----------------------------------------------------------------- Retry-After


@pytest.mark.parametrize(
    ("headers", "delay"),
    [
        pytest.param({"Retry-After": "120"}, 120.0, id="delta"),
        pytest.param({"retry-after": "120"}, 120.0, id="lowercase-name"),
        pytest.param({b"RETRY-AFTER": b"120"}, 120.0, id="bytes-uppercase-name"),
        pytest.param({"Retry-After": 120}, 120.0, id="int-value"),
        pytest.param({"Retry-After": "0"}, None, id="zero"),
        pytest.param({"Retry-After": "-5"}, None, id="negative"),
        pytest.param({"Retry-After": "1.5"}, 1.5, id="fraction"),
        pytest.param({"Retry-After": 1.5}, 1.5, id="float-value"),
        pytest.param({"Retry-After": "tomorrow"}, None, id="garbage"),
        pytest.param({"Retry-After": b"\x80\xff"}, None, id="undecodable"),
        pytest.param({"Retry-After": str(10**9)}, 1e9, id="huge-at-cap"),
        pytest.param({"Retry-After": str(10**9 + 1)}, 1e9, id="huge-above-cap"),
        pytest.param({"Retry-After": "9" * 400}, 1e9, id="huge-many-digits"),
        pytest.param({"Retry-After": "9" * 10000}, None, id="absurdly-long"),
        pytest.param({"Retry-After": imf(NOW + 90)}, 90.0, id="date-vs-now"),
        pytest.param({"Retry-After": imf(NOW)}, None, id="date-equal-now"),
        pytest.param({"Retry-After": imf(NOW - 90)}, None, id="date-in-past"),
        pytest.param(
            {"Retry-After": imf(NOW + 90), "Date": imf(NOW + 60)},
            30.0,
            id="date-vs-date-header",
        ),
        pytest.param(
            {"Retry-After": imf(NOW + 90), "Date": imf(NOW - 60)},
            150.0,
            id="date-vs-lagging-date-header",
        ),
        pytest.param(
            # After our clock but not after the server's: no wait.
            {"Retry-After": imf(NOW + 90), "Date": imf(NOW + 100)},
            None,
            id="date-before-date-header",
        ),
        pytest.param(
            {"Retry-After": imf(NOW + 90), "Date": "garbage"},
            90.0,
            id="invalid-date-header-falls-back-to-now",
        ),
        pytest.param(
            {"Retry-After": imf(NOW + 90), "Date": [imf(NOW + 10), "bad", imf(NOW + 30)]},
            60.0,
            id="last-valid-date-header-wins",
        ),
        pytest.param({"Retry-After": "Wednesday, 01-Jan-25 00:01:00 GMT"}, 60.0, id="rfc850-date"),
        pytest.param({"Retry-After": "Wed Jan  1 00:01:00 2025"}, 60.0, id="asctime-date"),
        pytest.param(
            {"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, 1e9, id="date-too-far-ahead"
        ),
        pytest.param({"Retry-After": ["10", "30", "20"]}, 30.0, id="several-values-max"),
        pytest.param({"Retry-After": ["0", "x", "1.5", "7"]}, 7.0, id="only-valid-value"),
        pytest.param({"Retry-After": [imf(NOW + 45), "30"]}, 45.0, id="date-and-delta-values"),
        pytest.param({"Retry-After": []}, None, id="empty-list"),
    ],
)
def test_retry_after(headers: dict[Any, Any], delay: float | None) -> None:
    hint = parse(headers)
    assert hint.delay == delay
    assert hint.sources == (("retry-after",) if delay is not None else ())
    assert hint.remaining is None
    assert hint.reset is None


def test_retry_after_with_scrapy_headers() -> None:
    headers = Headers({"Retry-After": ["10", "40"], "Date": imf(NOW)})
    headers.appendlist("retry-after", "25")
    assert parse(headers) == RateLimitHint(delay=40.0, sources=("retry-after",))


def test_iterable_of_pairs_is_accepted() -> None:
    pairs = [("Retry-After", "5"), (b"retry-after", b"9"), ("Other", "x")]
    assert parse(pairs).delay == 9.0


# ------------------------------------------------------- X-RateLimit-* headers


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param(
            {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"},
            RateLimitHint(
                delay=30.0,
                remaining=0.0,
                limit=60.0,
                reset=30.0,
                sources=("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"),
            ),
            id="exhausted-delta-reset",
        ),
        pytest.param(
            {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "12", "X-RateLimit-Reset": "30"},
            RateLimitHint(
                delay=None,
                remaining=12.0,
                limit=60.0,
                reset=30.0,
                sources=("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"),
            ),
            id="not-exhausted-no-delay",
        ),
        pytest.param(
            {"X-RateLimit-Reset": "30"},
            RateLimitHint(delay=30.0, reset=30.0, sources=("x-ratelimit-reset",)),
            id="reset-without-remaining-is-a-wait",
        ),
        pytest.param(
            {"X-RateLimit-Reset": "0", "X-RateLimit-Remaining": "0"},
            RateLimitHint(
                remaining=0.0,
                reset=0.0,
                sources=("x-ratelimit-remaining", "x-ratelimit-reset"),
            ),
            id="zero-reset-no-delay",
        ),
        pytest.param(
            {"X-RateLimit-Reset": "2.5", "X-RateLimit-Remaining": "0"},
            RateLimitHint(
                delay=2.5,
                remaining=0.0,
                reset=2.5,
                sources=("x-ratelimit-remaining", "x-ratelimit-reset"),
            ),
            id="fractional-reset-tolerated",
        ),
        pytest.param(
            # GitHub style: absolute epoch seconds, measured against Date.
            {
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": str(int(NOW) + 3600),
                "Date": imf(NOW + 600),
            },
            RateLimitHint(
                delay=3000.0,
                remaining=0.0,
                reset=3000.0,
                sources=("x-ratelimit-remaining", "x-ratelimit-reset"),
            ),
            id="epoch-reset-vs-date-header",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW) + 3600)},
            RateLimitHint(
                delay=3600.0,
                remaining=0.0,
                reset=3600.0,
                sources=("x-ratelimit-remaining", "x-ratelimit-reset"),
            ),
            id="epoch-reset-vs-now",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW) - 5)},
            RateLimitHint(remaining=0.0, sources=("x-ratelimit-remaining",)),
            id="epoch-reset-in-past-ignored",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW) * 1000 + 5000)},
            RateLimitHint(remaining=0.0, sources=("x-ratelimit-remaining",)),
            id="millisecond-epoch-rejected",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(10**9 - 1)},
            RateLimitHint(
                delay=float(10**9 - 1),
                remaining=0.0,
                reset=float(10**9 - 1),
                sources=("x-ratelimit-remaining", "x-ratelimit-reset"),
            ),
            id="largest-delta-reset",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "-1", "X-RateLimit-Reset": "-30"},
            RateLimitHint(),
            id="negative-values-ignored",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "nan", "X-RateLimit-Limit": "inf"},
            RateLimitHint(),
            id="nan-inf-ignored",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": ["7", "3"], "X-RateLimit-Limit": ["100", "50"]},
            RateLimitHint(
                remaining=3.0,
                limit=50.0,
                sources=("x-ratelimit-limit", "x-ratelimit-remaining"),
            ),
            id="several-lines-most-restrictive",
        ),
        pytest.param(
            {"X-Rate-Limit-Remaining": "0", "X-Rate-Limit-Reset": "15"},
            RateLimitHint(
                delay=15.0,
                remaining=0.0,
                reset=15.0,
                sources=("x-rate-limit-remaining", "x-rate-limit-reset"),
            ),
            id="x-rate-limit-spelling",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "0.5", "X-RateLimit-Reset": "10"},
            RateLimitHint(
                remaining=0.5,
                reset=10.0,
                sources=("x-ratelimit-remaining", "x-ratelimit-reset"),
            ),
            id="fractional-remaining-not-exhausted",
        ),
    ],
)
def test_x_ratelimit(headers: dict[str, Any], expected: RateLimitHint) -> None:
    assert parse(headers) == expected


# ------------------------------------------------ IETF draft RateLimit headers


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param(
            {"RateLimit": '"default";r=50;t=30', "RateLimit-Policy": '"default";q=100;w=60'},
            RateLimitHint(
                remaining=50.0,
                limit=100.0,
                window=60.0,
                reset=30.0,
                sources=("ratelimit", "ratelimit-policy"),
            ),
            id="current-draft-not-exhausted",
        ),
        pytest.param(
            {"RateLimit": '"default";r=0;t=30', "RateLimit-Policy": '"default";q=100;w=60'},
            RateLimitHint(
                delay=30.0,
                remaining=0.0,
                limit=100.0,
                window=60.0,
                reset=30.0,
                sources=("ratelimit", "ratelimit-policy"),
            ),
            id="current-draft-exhausted",
        ),
        pytest.param(
            {"RateLimit": "default;r=0;t=5"},
            RateLimitHint(delay=5.0, remaining=0.0, reset=5.0, sources=("ratelimit",)),
            id="token-policy-name",
        ),
        pytest.param(
            {"RateLimit": '"default" ; r = 0 ; t = 5'},
            RateLimitHint(delay=5.0, remaining=0.0, reset=5.0, sources=("ratelimit",)),
            id="sloppy-whitespace",
        ),
        pytest.param(
            {"RateLimit": '"default";R=0;T=5'},
            RateLimitHint(delay=5.0, remaining=0.0, reset=5.0, sources=("ratelimit",)),
            id="uppercase-keys",
        ),
        pytest.param(
            {"RateLimit": '"a,b;c=d";r=0;t=5'},
            RateLimitHint(delay=5.0, remaining=0.0, reset=5.0, sources=("ratelimit",)),
            id="separators-inside-quoted-name",
        ),
        pytest.param(
            {"RateLimit": r'"a\"b";r=0;t=5', "RateLimit-Policy": r'"a\"b";q=9;w=3, "z";q=1'},
            RateLimitHint(
                delay=5.0,
                remaining=0.0,
                limit=9.0,
                window=3.0,
                reset=5.0,
                sources=("ratelimit", "ratelimit-policy"),
            ),
            id="escaped-quote-in-name",
        ),
        pytest.param(
            {
                "RateLimit": '"burst";r=0;t=10, "daily";r=0;t=50, "hourly";r=3;t=5',
                "RateLimit-Policy": '"burst";q=10;w=1, "daily";q=1000;w=86400',
            },
            RateLimitHint(
                delay=50.0,
                remaining=0.0,
                limit=1000.0,
                window=86400.0,
                reset=50.0,
                sources=("ratelimit", "ratelimit-policy"),
            ),
            id="several-policies-largest-exhausted-reset",
        ),
        pytest.param(
            {
                "RateLimit": '"burst";r=8;t=1, "daily";r=3;t=500',
                "RateLimit-Policy": '"burst";q=10;w=1, "daily";q=1000;w=86400',
            },
            RateLimitHint(
                remaining=3.0,
                limit=1000.0,
                window=86400.0,
                reset=500.0,
                sources=("ratelimit", "ratelimit-policy"),
            ),
            id="several-policies-smallest-remaining",
        ),
        pytest.param(
            {"RateLimit": ['"burst";r=8;t=1', '"daily";r=0;t=500']},
            RateLimitHint(delay=500.0, remaining=0.0, reset=500.0, sources=("ratelimit",)),
            id="policies-on-separate-lines",
        ),
        pytest.param(
            {
                "RateLimit": '"unknown";r=4;t=9',
                "RateLimit-Policy": '"burst";q=10;w=1, "daily";q=1000;w=86400',
            },
            RateLimitHint(
                remaining=4.0,
                limit=10.0,
                window=1.0,
                reset=9.0,
                sources=("ratelimit", "ratelimit-policy"),
            ),
            id="no-name-match-smallest-quota",
        ),
        pytest.param(
            {"RateLimit-Policy": '"burst";q=100;w=60;qu="requests";pk=:abc=:'},
            RateLimitHint(limit=100.0, window=60.0, sources=("ratelimit-policy",)),
            id="policy-only-extra-params",
        ),
        pytest.param(
            {"RateLimit-Policy": 'limit=5, "a";q=9;w=2, x'},
            RateLimitHint(limit=9.0, window=2.0, sources=("ratelimit-policy",)),
            id="policy-field-ignores-dictionary-and-garbage-members",
        ),
        pytest.param(
            {"RateLimit": "limit=100, remaining=0, reset=30"},
            RateLimitHint(
                delay=30.0, remaining=0.0, limit=100.0, reset=30.0, sources=("ratelimit",)
            ),
            id="draft-07-dictionary",
        ),
        pytest.param(
            {"RateLimit": "limit=100, remaining=20, reset=30", "RateLimit-Policy": "100;w=60"},
            RateLimitHint(
                remaining=20.0,
                limit=100.0,
                reset=30.0,
                sources=("ratelimit", "ratelimit-policy"),
            ),
            id="draft-07-dictionary-own-limit-wins",
        ),
        pytest.param(
            {"RateLimit": "remaining=20, reset=30", "RateLimit-Policy": "100;w=60, 1000;w=3600"},
            RateLimitHint(
                remaining=20.0,
                limit=100.0,
                window=60.0,
                reset=30.0,
                sources=("ratelimit", "ratelimit-policy"),
            ),
            id="draft-07-policy-field",
        ),
        pytest.param(
            {
                "RateLimit-Limit": "10, 10;w=1, 50;w=60",
                "RateLimit-Remaining": "0",
                "RateLimit-Reset": "7",
            },
            RateLimitHint(
                delay=7.0,
                remaining=0.0,
                limit=10.0,
                window=1.0,
                reset=7.0,
                sources=("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"),
            ),
            id="early-draft-separate-fields",
        ),
        pytest.param(
            {"RateLimit-Limit": "100, 100;window=60", "RateLimit-Remaining": "5"},
            RateLimitHint(
                remaining=5.0,
                limit=100.0,
                window=60.0,
                sources=("ratelimit-limit", "ratelimit-remaining"),
            ),
            id="early-draft-window-param",
        ),
        pytest.param(
            {"RateLimit-Reset": "30"},
            RateLimitHint(delay=30.0, reset=30.0, sources=("ratelimit-reset",)),
            id="early-draft-reset-alone",
        ),
        pytest.param(
            {"RateLimit-Reset": "30", "X-RateLimit-Remaining": "5"},
            RateLimitHint(
                remaining=5.0,
                reset=30.0,
                sources=("ratelimit-reset", "x-ratelimit-remaining"),
            ),
            id="reset-alone-but-quota-left-elsewhere",
        ),
        pytest.param(
            {"RateLimit": '"default";r=0;t=1000000001'},
            RateLimitHint(remaining=0.0, sources=("ratelimit",)),
            id="huge-reset-rejected",
        ),
        pytest.param(
            {"RateLimit": '"default";r=0;t=1e3'},
            RateLimitHint(remaining=0.0, sources=("ratelimit",)),
            id="exponent-rejected",
        ),
        pytest.param(
            {"RateLimit": '"default";r=-1;t=-5'},
            RateLimitHint(),
            id="negatives-rejected",
        ),
        pytest.param(
            {"RateLimit": '"default";r;t="x"'},
            RateLimitHint(),
            id="boolean-and-string-params",
        ),
        pytest.param(
            {"RateLimit": '"unterminated;r=0;t=5'},
            RateLimitHint(),
            id="unterminated-quote",
        ),
        pytest.param(
            {"RateLimit": ',,, ;;; ===, "", r=, t='},
            RateLimitHint(),
            id="separator-soup",
        ),
        pytest.param(
            {"RateLimit": b'"d\xff";r=0;t=5'},
            RateLimitHint(delay=5.0, remaining=0.0, reset=5.0, sources=("ratelimit",)),
            id="non-ascii-name-is-fine",
        ),
        pytest.param(
            {"RateLimit": b'"d";r=\xff0;t=5'},
            RateLimitHint(reset=5.0, delay=5.0, sources=("ratelimit",)),
            id="non-ascii-number-rejected",
        ),
    ],
)
def test_ietf_ratelimit(headers: dict[str, Any], expected: RateLimitHint) -> None:
    assert parse(headers) == expected


# --------------------------------------------------------------- combinations


def test_delay_is_largest_of_retry_after_and_exhausted_reset() -> None:
    hint = parse(
        {
            "Retry-After": "20",
            "RateLimit": '"a";r=0;t=45',
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": "10",
        }
    )
    assert hint.delay == 45.0
    assert hint.remaining == 0.0
    assert hint.reset == 45.0
    assert hint.exhausted
    assert hint.sources == (
        "retry-after",
        "ratelimit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    )


def test_retry_after_beats_shorter_reset() -> None:
    hint = parse({"Retry-After": "90", "RateLimit": '"a";r=0;t=45'})
    assert hint.delay == 90.0
    assert hint.reset == 45.0


def test_reset_without_exhaustion_does_not_delay_retry_after() -> None:
    hint = parse({"Retry-After": "3", "RateLimit": '"a";r=10;t=45'})
    assert hint.delay == 3.0
    assert not hint.exhausted


def test_limit_only_family_still_reports_limit() -> None:
    hint = parse({"RateLimit": '"a";r=0', "X-RateLimit-Limit": "500"})
    assert hint == RateLimitHint(
        remaining=0.0, limit=500.0, sources=("ratelimit", "x-ratelimit-limit")
    )


def test_scrapy_headers_and_dict_agree() -> None:
    raw = {
        "Retry-After": [imf(NOW + 30)],
        "Date": [imf(NOW + 10)],
        "RateLimit": ['"a";r=0;t=5', '"b";r=2;t=70'],
        "RateLimit-Policy": ['"a";q=5;w=10'],
        "X-RateLimit-Limit": ["500"],
    }
    from_dict = parse(raw)
    assert from_dict == parse(Headers(raw))
    assert from_dict == RateLimitHint(
        delay=20.0,
        remaining=0.0,
        limit=5.0,
        window=10.0,
        reset=5.0,
        sources=("retry-after", "ratelimit", "ratelimit-policy", "x-ratelimit-limit"),
    )


# ---------------------------------------------------------- robustness & misc


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(None, id="none"),
        pytest.param({}, id="empty-dict"),
        pytest.param(Headers(), id="empty-headers"),
        pytest.param(42, id="int"),
        pytest.param("Retry-After: 5", id="str"),
        pytest.param(b"Retry-After: 5", id="bytes"),
        pytest.param([("Retry-After",)], id="short-pair"),
        pytest.param([["Retry-After", "5"]], id="list-pair"),
        pytest.param({1: "5", None: "5", ("Retry-After",): "5"}, id="odd-keys"),
        pytest.param({"Retry-After": object()}, id="odd-value"),
        pytest.param({"Retry-After": [None, True, [b"5"], {"a": 1}]}, id="odd-list-items"),
        pytest.param({"Retry-After": 10**400}, id="huge-int-value"),
        pytest.param({"Retry-After": math.inf}, id="inf-value"),
        pytest.param({"Retry-After": "5" * (MAX_VALUE_LENGTH + 1)}, id="over-long-value"),
        pytest.param({"Retry-After\udcff": "5"}, id="surrogate-name"),
        pytest.param({"Retry-Aft\u00e9r": "5"}, id="non-ascii-name"),
        pytest.param({"X-Other": "5", "Content-Type": "text/html"}, id="unrelated"),
        pytest.param({"Date": imf(NOW)}, id="date-only"),
    ],
)
def test_unusable_input_gives_empty_hint(headers: Any) -> None:
    assert parse(headers) == RateLimitHint()


class _ExplodingHeaders:
    def items(self) -> Any:
        raise RuntimeError("boom")


def test_hostile_headers_object_does_not_raise() -> None:
    assert parse(_ExplodingHeaders()) == RateLimitHint()


@pytest.mark.parametrize("now", [math.nan, math.inf, -math.inf, 0.0, -1.0, 1e300])
def test_unusable_now_only_affects_clock_relative_values(now: float) -> None:
    hint = parse(
        {
            "Retry-After": ["7", imf(NOW + 100)],
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": str(int(NOW) + 3600),
        },
        now=now,
    )
    assert hint.delay is None or (math.isfinite(hint.delay) and hint.delay >= 7.0)
    assert hint.remaining == 0.0


def test_hint_is_frozen_slotted_and_hashable() -> None:
    hint = parse({"Retry-After": "5"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        hint.delay = 1.0  # type: ignore[misc]
    assert not hasattr(hint, "__dict__")
    assert hash(hint) == hash(RateLimitHint(delay=5.0, sources=("retry-after",)))


def test_exhausted_property() -> None:
    assert not RateLimitHint().exhausted
    assert not RateLimitHint(remaining=1.0).exhausted
    assert RateLimitHint(remaining=0.0).exhausted


# ------------------------------------------------------------ property tests

_NAME_VARIANTS = [
    variant
    for name in KNOWN_HEADERS
    for variant in (name, name.title(), name.upper(), name.encode(), name.title().encode())
]

_ascii_number = st.one_of(
    st.integers(min_value=-5, max_value=2 * 10**9).map(str),
    st.floats().map(repr),
    st.sampled_from(["0", "00", "", "-0", "1.5", "0.25", "1e3", "nan", "inf", "9" * 40]),
)
_sf_key = st.sampled_from(["r", "t", "q", "w", "window", "limit", "remaining", "reset", "pk"])
_sf_name = st.sampled_from(["", '"default"', "burst", '"a,b;c=1"', r'"\""', '"open', '"\xe9"'])


@st.composite
def _sf_member(draw: st.DrawFn) -> str:
    head = draw(st.one_of(_sf_name, _ascii_number, st.tuples(_sf_key, _ascii_number).map("=".join)))
    params = draw(st.lists(st.tuples(_sf_key, _ascii_number), max_size=3))
    return ";".join([head, *("=".join(p) for p in params)])


_sf_value = st.lists(_sf_member(), min_size=1, max_size=3).map(", ".join)

_http_date_text = st.integers(min_value=-(10**10), max_value=300_000_000_000).map(
    lambda ts: imf(ts) if -62135596800 <= ts <= 253402300799 else str(ts)
)

_text_value = st.one_of(_ascii_number, _sf_value, _http_date_text, st.text(max_size=20))


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


_scalar_value = st.one_of(
    _text_value,
    _text_value.map(_encode),
    st.binary(max_size=20),
    st.integers(),
    st.floats(),
    st.none(),
)
_header_value = st.one_of(_scalar_value, st.lists(_scalar_value, max_size=3))
_header_name = st.one_of(
    st.sampled_from(_NAME_VARIANTS),
    st.text(max_size=12),
    st.binary(max_size=12),
)
_headers_dict = st.dictionaries(_header_name, _header_value, max_size=6)
_now = st.one_of(
    st.just(NOW),
    st.floats(min_value=-1e12, max_value=1e12),
    st.floats(),
)

# What Scrapy's Headers can store: bytes names (no surrounding blanks, which
# Headers keeps but the parser strips) and bytes/int values or lists of them.
_storable_scalar = st.one_of(
    _text_value.map(_encode),
    st.binary(max_size=20),
    st.integers(min_value=-(10**6), max_value=3 * 10**9),
)
_storable_headers = st.dictionaries(
    st.one_of(
        st.sampled_from([name for name in _NAME_VARIANTS if isinstance(name, bytes)]),
        st.binary(min_size=1, max_size=12).filter(lambda k: k.strip(b" \t") == k),
    ),
    st.one_of(_storable_scalar, st.lists(_storable_scalar, max_size=3)),
    max_size=6,
)


def _assert_sane(hint: RateLimitHint) -> None:
    assert isinstance(hint, RateLimitHint)
    if hint.delay is not None:
        assert math.isfinite(hint.delay)
        assert 0 < hint.delay <= MAX_DELTA_SECONDS
    for value in (hint.remaining, hint.limit, hint.reset):
        assert value is None or (math.isfinite(value) and value >= 0)
    if hint.reset is not None:
        assert hint.reset <= MAX_DELTA_SECONDS
    assert hint.window is None or (math.isfinite(hint.window) and hint.window > 0)
    assert set(hint.sources) <= set(KNOWN_HEADERS) - {"date"}
    assert list(hint.sources) == sorted(hint.sources, key=KNOWN_HEADERS.index)
    assert len(set(hint.sources)) == len(hint.sources)
    assert hint.exhausted == (hint.remaining == 0)


@given(headers=_headers_dict, now=_now)
@example(headers={"Retry-After": "9" * 5000}, now=NOW)
@example(headers={b"RateLimit": b'"\xff";r=0;t=1e400'}, now=math.nan)
def test_property_never_raises_and_is_sane(headers: dict[Any, Any], now: float) -> None:
    # Call the unguarded implementation so the defensive wrapper in
    # parse_rate_limit_headers cannot hide a bug.
    hint = headers_module._parse(headers, now)
    _assert_sane(hint)
    assert parse_rate_limit_headers(headers, now=now) == hint


@given(headers=_storable_headers, now=_now)
def test_property_scrapy_headers_match_plain_dict(headers: dict[bytes, Any], now: float) -> None:
    # Headers merges names that differ in case, in insertion order, which is
    # also the order in which the parser reads a plain dict's values.
    assert parse(Headers(headers), now) == parse(headers, now)


@given(seconds=st.integers(min_value=1, max_value=MAX_DELTA_SECONDS))
def test_property_delta_seconds_round_trip(seconds: int) -> None:
    assert parse_delta_seconds(str(seconds)) == float(seconds)
    assert parse_delta_seconds(str(seconds).encode()) == float(seconds)
    assert parse(Headers({"Retry-After": str(seconds)})).delay == float(seconds)


@given(seconds=st.integers(min_value=MAX_DELTA_SECONDS + 1, max_value=10**400))
def test_property_delta_seconds_above_cap_ask_for_the_longest(seconds: int) -> None:
    assert parse_delta_seconds(str(seconds)) == float(MAX_DELTA_SECONDS)


@given(value=st.one_of(st.text(), st.binary()))
def test_property_helpers_never_raise(value: str | bytes) -> None:
    delta = parse_delta_seconds(value)
    assert delta is None or (math.isfinite(delta) and 0 < delta <= MAX_DELTA_SECONDS)
    assert delta is None or float(int(delta)) == delta
    date = parse_http_date(value, now=NOW)
    assert date is None or math.isfinite(date)


@given(timestamp=st.integers(min_value=-62135596800, max_value=253402300799))
def test_property_imf_fixdate_round_trip(timestamp: int) -> None:
    assert parse_http_date(imf(timestamp), now=NOW) == float(timestamp)


@given(timestamp=st.integers(min_value=0, max_value=253402300799), now=_now)
def test_property_asctime_round_trip(timestamp: int, now: float) -> None:
    moment = email.utils.parsedate_to_datetime(imf(timestamp))
    text = moment.strftime("%a %b ") + f"{moment.day:2d}" + moment.strftime(" %H:%M:%S %Y")
    assert parse_http_date(text, now=now) == float(timestamp)


@given(
    offset=st.integers(min_value=1, max_value=10**8),
    skew=st.integers(min_value=-(10**6), max_value=10**6),
)
def test_property_http_date_measured_against_date_header(offset: int, skew: int) -> None:
    server_now = NOW + skew
    hint = parse({"Retry-After": imf(server_now + offset), "Date": imf(server_now)})
    assert hint.delay == float(offset)


@given(
    values=st.lists(st.integers(min_value=-10, max_value=10**6).map(str), min_size=1),
    extra=st.dictionaries(st.sampled_from(_NAME_VARIANTS), _header_value, max_size=4),
)
def test_property_delay_covers_every_valid_retry_after(
    values: list[str], extra: dict[Any, Any]
) -> None:
    # Other Retry-After spellings in `extra` may only raise the delay.
    headers = {**extra, "Retry-After": values}
    hint = parse(headers)
    valid = [float(v) for v in values if int(v) > 0]
    if valid:
        assert hint.delay is not None
        assert hint.delay >= max(valid)
        assert "retry-after" in hint.sources
    _assert_sane(hint)


@given(
    policies=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=1000),  # remaining
            st.integers(min_value=0, max_value=10**6),  # reset
        ),
        min_size=1,
        max_size=6,
    )
)
def test_property_multiple_policies_most_restrictive(policies: list[tuple[int, int]]) -> None:
    value = ", ".join(f'"p{i}";r={r};t={t}' for i, (r, t) in enumerate(policies))
    hint = parse({"RateLimit": value})
    assert hint.remaining == min(r for r, _ in policies)
    exhausted_resets = [t for r, t in policies if r == 0]
    if exhausted_resets:
        assert hint.reset == max(exhausted_resets)
        expected_delay = max(exhausted_resets)
        assert hint.delay == (expected_delay if expected_delay > 0 else None)
    else:
        assert hint.delay is None
        least = min(r for r, _ in policies)
        assert hint.reset == max(t for r, t in policies if r == least)


# ------------------------------------------- debug log of unusable values

_MALFORMED = "ignored malformed rate-limit header"


def _log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "slotkit" and _MALFORMED in record.getMessage()
    ]


def _parse_logged(caplog: pytest.LogCaptureFixture, headers: Any, now: float = NOW) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="slotkit"):
        parse(headers, now)
    for record in caplog.records:
        assert record.levelno == logging.DEBUG
    return _log_lines(caplog)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param(
            {"Retry-After": "abc"},
            "Retry-After: 'abc' (neither delta-seconds nor an HTTP-date)",
            id="retry-after-garbage",
        ),
        pytest.param({"Retry-After": "-5"}, "Retry-After: '-5' (negative)", id="negative"),
        pytest.param({"Retry-After": ".5"}, "'.5' (not a plain decimal number)", id="fraction"),
        pytest.param({"Retry-After": "1e3"}, "'1e3' (not a plain decimal number)", id="exponent"),
        pytest.param({"Retry-After": "nan"}, "'nan' (not a finite number)", id="nan"),
        pytest.param({"Retry-After": "-inf"}, "'-inf' (not a finite number)", id="minus-inf"),
        pytest.param({"Retry-After": ""}, "Retry-After: '' (empty)", id="empty"),
        pytest.param(
            {"Retry-After": "\uff11\uff12"},
            r"Retry-After: '\uff11\uff12' (non-ASCII characters)",
            id="fullwidth-digits-str",
        ),
        pytest.param(
            {b"Retry-After": b"\xff\xfe"},
            r"Retry-After: '\xff\xfe' (non-ASCII characters)",
            id="undecodable-bytes",
        ),
        pytest.param(
            {"Retry-After": "1\r\nX-Evil: 1"},
            r"'1\r\nX-Evil: 1' (neither delta-seconds nor an HTTP-date)",
            id="crlf-escaped",
        ),
        pytest.param(
            {"Retry-After": object()},
            "Retry-After: <object> (unsupported value type object)",
            id="odd-value-type",
        ),
        pytest.param(
            {"Retry-After": "5" * (MAX_VALUE_LENGTH + 1)},
            f"({MAX_VALUE_LENGTH + 1} chars) (longer than {MAX_VALUE_LENGTH} characters)",
            id="over-long-value",
        ),
        pytest.param(
            {"RateLimit": '"default";r=abc;t=-1'},
            "RateLimit: '\"default\";r=abc;t=-1' (r='abc': not a number; t='-1': negative)",
            id="ratelimit-params",
        ),
        pytest.param(
            {"RateLimit": '"default";r=0;t=nan'},
            "(t='nan': not a finite number)",
            id="ratelimit-nan-reset",
        ),
        pytest.param(
            {"RateLimit": "limit=, remaining=-1, reset=???"},
            "(limit='': empty; remaining='-1': negative; reset='???': not a number)",
            id="ratelimit-dictionary-form",
        ),
        pytest.param(
            {"RateLimit": "garbage"},
            "RateLimit: 'garbage' (a policy with neither r= nor t=)",
            id="ratelimit-garbage",
        ),
        pytest.param(
            {"RateLimit": "foo=1"}, "RateLimit: 'foo=1' (no usable value)", id="unknown-key-only"
        ),
        pytest.param(
            {"RateLimit-Policy": "garbage;;;q==;w=-3"},
            "RateLimit-Policy: 'garbage;;;q==;w=-3' (q='=': not a number; w='-3': negative)",
            id="policy-params",
        ),
        pytest.param(
            {"RateLimit-Policy": '"a";w=60'},
            "RateLimit-Policy: '\"a\";w=60' ('a': a policy with no q=)",
            id="policy-without-quota",
        ),
        pytest.param({"RateLimit-Reset": "-1"}, "RateLimit-Reset: '-1' (negative)", id="reset"),
        pytest.param(
            {"X-RateLimit-Reset": str(int(NOW) * 1000)},
            f"(epoch timestamp more than {MAX_DELTA_SECONDS} seconds ahead)",
            id="millisecond-epoch",
        ),
        pytest.param(
            {"X-RateLimit-Reset": "1.5.6"},
            "X-RateLimit-Reset: '1.5.6' (not a number)",
            id="x-reset",
        ),
        pytest.param(
            {"X-Rate-Limit-Remaining": "-3"},
            "X-Rate-Limit-Remaining: '-3' (negative)",
            id="x-remaining-other-spelling",
        ),
        pytest.param(
            {"X-RateLimit-Limit": "10, x, 20;w=abc"},
            "X-RateLimit-Limit: '10, x, 20;w=abc' ('x': not a number; w='abc': not a number)",
            id="x-limit-members",
        ),
    ],
)
def test_unusable_value_logs_one_debug_line(
    caplog: pytest.LogCaptureFixture, headers: dict[Any, Any], expected: str
) -> None:
    (line,) = _parse_logged(caplog, headers)
    assert expected in line
    assert line.startswith(f"slotkit: {_MALFORMED} ")
    assert line.isascii()


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="nothing"),
        pytest.param({"Content-Type": "text/html", "X-Other": "abc"}, id="unrelated"),
        pytest.param({"Date": "garbage"}, id="bad-date-alone"),
        pytest.param({"Date": "garbage", "Retry-After": "5"}, id="bad-date-with-valid-hint"),
        pytest.param({"Retry-After": ["5", "10"]}, id="valid"),
        pytest.param({"Retry-After": "0"}, id="zero-asks-for-no-wait"),
        pytest.param({"Retry-After": imf(NOW - 90)}, id="past-date"),
        pytest.param({"Retry-After": imf(NOW)}, id="date-equal-now"),
        pytest.param({"X-RateLimit-Reset": str(int(NOW) - 5)}, id="past-epoch-reset"),
        pytest.param({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "0"}, id="zero-reset"),
        pytest.param({"RateLimit": '"a";r=5;t=10;pk=xyz'}, id="unknown-parameter"),
        pytest.param({"RateLimit": '"a";r=5;t=10, extra=1'}, id="unknown-key-beside-policy"),
        pytest.param({"Retry-After": None}, id="none-value"),
        pytest.param({"Retry-After": []}, id="no-values"),
    ],
)
def test_absent_valid_or_no_wait_values_log_nothing(
    caplog: pytest.LogCaptureFixture, headers: dict[Any, Any]
) -> None:
    assert _parse_logged(caplog, headers) == []


def test_one_line_per_header_however_many_bad_values(caplog: pytest.LogCaptureFixture) -> None:
    headers = Headers({"Retry-After": ["abc", "-1", "7", "1e3", "zz"], "RateLimit": "garbage"})
    headers.appendlist("X-RateLimit-Remaining", "-3")
    headers.appendlist("X-RateLimit-Remaining", "x")
    lines = _parse_logged(caplog, headers)
    assert len(lines) == 3
    retry_after, ratelimit, remaining = lines
    assert "Retry-After: 'abc' (neither" in retry_after
    assert "'-1' (negative), '1e3' (not a plain decimal number), and 1 more value" in retry_after
    assert "'7'" not in retry_after
    assert "RateLimit: 'garbage'" in ratelimit
    assert "X-RateLimit-Remaining: '-3' (negative), 'x' (not a number)" in remaining


def test_valid_parts_are_still_used_when_a_header_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    headers = {"RateLimit": '"a";r=0;t=-1, "b";r=0;t=20', "Retry-After": ["x", "4"]}
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="slotkit"):
        hint = parse(headers)
    assert hint == RateLimitHint(
        delay=20.0, remaining=0.0, reset=20.0, sources=("retry-after", "ratelimit")
    )
    assert len(_log_lines(caplog)) == 2


def test_logged_value_is_truncated(caplog: pytest.LogCaptureFixture) -> None:
    (line,) = _parse_logged(caplog, {"Retry-After": "\u00e9" * 3000})
    assert line.isascii()
    assert "... (3000 chars) (non-ASCII characters)" in line
    assert len(line) < 250
    (line,) = _parse_logged(caplog, {"Retry-After": b"x" * 20000})
    assert f"{'x' * 99}... (20000 chars) (longer than {MAX_VALUE_LENGTH} characters)" in line
    assert len(line) < 250


def test_problems_of_one_value_are_capped(caplog: pytest.LogCaptureFixture) -> None:
    value = ", ".join(f'"p{i}";r=-{i};t=x' for i in range(1, 30))
    (line,) = _parse_logged(caplog, {"RateLimit": value})
    assert "(r='-1': negative; t='x': not a number; r='-2': negative; and 55 more problems)" in line
    assert len(line) < 400


def test_huge_int_value_is_not_rendered(caplog: pytest.LogCaptureFixture) -> None:
    (line,) = _parse_logged(caplog, {"X-RateLimit-Reset": 10**5000})
    assert "X-RateLimit-Reset: <int of 16610 bits> (integer too large)" in line


def test_nothing_is_logged_above_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="slotkit"):
        hint = parse({"Retry-After": "abc", "RateLimit": "garbage", "X-RateLimit-Reset": "-1"})
    assert hint == RateLimitHint()
    assert caplog.records == []


@contextlib.contextmanager
def _slotkit_debug_records() -> Iterator[list[logging.LogRecord]]:
    """Collect the "slotkit" logger's records at DEBUG (no caplog: usable in @given)."""
    records: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log = logging.getLogger("slotkit")
    handler = _Keep(logging.DEBUG)
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


@given(headers=_headers_dict, now=_now)
@example(headers={"Retry-After": ["9" * 5000, "x", "-1", "1.5"]}, now=NOW)
@example(headers={b"RateLimit": b'"\xff";r=0;t=1e400', "X-RateLimit-Reset": 10**400}, now=math.nan)
def test_property_debug_log_is_bounded_and_changes_nothing(
    headers: dict[Any, Any], now: float
) -> None:
    quiet = headers_module._parse(headers, now)
    with _slotkit_debug_records() as records:
        loud = headers_module._parse(headers, now)
    assert loud == quiet
    named = [record.args[0] for record in records if isinstance(record.args, tuple)]
    assert len(named) == len(set(named)) == len(records)  # one line per header
    for record in records:
        message = record.getMessage()
        assert record.levelno == logging.DEBUG
        assert message.isascii()
        assert "\n" not in message
        assert "\r" not in message
        # At most three values of ~100 characters, three short reasons each.
        assert len(message) < 2000


@pytest.mark.parametrize(
    ("remaining", "expected"),
    [
        ("9, 9999", (9.0, 1.0, None)),
        ("0, 9999", (0.0, 1.0, 1.0)),
        ("9, 0", (0.0, 50000.0, 50000.0)),
    ],
)
def test_values_listed_in_step_pair_up(
    remaining: str, expected: tuple[float, float, float | None]
) -> None:
    """Acceptance probe: a per-second and a daily policy listed in step gave the
    per-second remaining with the daily reset, a budget of 9 requests for 300 s."""
    headers = Headers(
        {
            "X-RateLimit-Limit": "10, 10000",
            "X-RateLimit-Remaining": remaining,
            "X-RateLimit-Reset": "1, 50000",
        }
    )
    hint = parse_rate_limit_headers(headers, now=1000.0)
    assert (hint.remaining, hint.reset, hint.delay) == expected
