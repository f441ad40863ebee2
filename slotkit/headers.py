"""Pure parsing of rate-limit response headers into a :class:`RateLimitHint`.

Nothing here touches a reactor or a clock: the caller passes ``now`` (seconds
since the epoch) and every function is deterministic. No function in this
module (or in the modules it is built from, below) raises, whatever it is
given; invalid input simply yields ``None`` (or an empty hint).

This module is the public API (:func:`parse_rate_limit_headers` and
:class:`RateLimitHint`) and re-exports the public names of its parts:
:mod:`slotkit.headers_values` (numbers, delta-seconds, HTTP dates),
:mod:`slotkit.headers_fields` (finding the known headers, splitting
structured-field values) and :mod:`slotkit.headers_policies` (one policy per
header family, and which policy binds).

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
* A ``Retry-After`` above ``MAX_DELTA_SECONDS`` (``10**9`` s, any number
  of digits, or an HTTP-date that far ahead) is ``MAX_DELTA_SECONDS``: the
  server asked for the longest wait, and capping it at ``BACKOFF_MAX_DELAY``
  is the caller's job. A reset that large is refused: there it is a unit
  mistake (an epoch timestamp, or milliseconds, where seconds belong) more
  likely than a wait of decades. NaN and infinities never come out.
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

Malformed values
----------------
A rate-limit header value that is present but unusable (garbage, negative,
NaN or infinite, non-ASCII, too long, out of range, an unparsable
structured-field member or parameter, an epoch timestamp or HTTP-date too
far ahead) is ignored and reported on the ``slotkit`` logger at DEBUG
level: one line per header and response, naming the header, the offending
value (escaped to ASCII and cut to about 100 characters) and why it was
refused. Well-formed values that simply ask for no wait are *not* logged:
``Retry-After: 0``, an HTTP-date or epoch reset that is not in the future
(often just clock skew), a reset of ``0``. Absent headers log nothing, and
neither does a bad ``Date`` header (it is not a rate-limit header; the
parser falls back to ``now``). Unknown parameters and dictionary keys of
the structured fields are ignored silently (they may be extensions) unless
nothing in the header was usable.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from slotkit.headers_fields import (
    _DATE,
    _DISPLAY_NAMES,
    _DRAFT_LIMIT,
    _DRAFT_REMAINING,
    _DRAFT_RESET,
    _RATELIMIT,
    _RATELIMIT_POLICY,
    _RETRY_AFTER,
    _X_LIMIT,
    _X_REMAINING,
    _X_RESET,
    KNOWN_HEADERS,
    _collect,
    _Rejected,
)
from slotkit.headers_policies import (
    _binding,
    _pick_quota,
    _quota_policies,
    _ratelimit_policies,
    _separate_fields_policy,
    _Sources,
)
from slotkit.headers_values import (
    MAX_DELTA_SECONDS,
    MAX_VALUE_LENGTH,
    _ahead_problem,
    _retry_after_problem,
    _show,
    _wait_at_most,
    parse_delta_seconds,
    parse_http_date,
)

__all__ = [
    "KNOWN_HEADERS",
    "MAX_DELTA_SECONDS",
    "MAX_VALUE_LENGTH",
    "RateLimitHint",
    "parse_delta_seconds",
    "parse_http_date",
    "parse_rate_limit_headers",
]


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

logger = logging.getLogger("slotkit")

# At most this many unusable values of one header are quoted in its log line,
# and at most this many problems of each.
_MAX_SHOWN_VALUES = 3


# --------------------------------------------------------------------------
# Entry point


def _parse(headers: object, now: float) -> RateLimitHint:
    found, undecodable = _collect(headers)
    # Fast path for most responses: no rate-limit header (a Date alone
    # cannot produce a hint).
    if undecodable is None and (not found or (len(found) == 1 and _DATE in found)):
        return _EMPTY
    sources = _Sources(debug=logger.isEnabledFor(logging.DEBUG))
    if undecodable is not None and sources.debug:
        sources.rejected.extend(undecodable)

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
            if retry_at is None:
                if sources.debug:
                    sources.reject(_RETRY_AFTER, text, _retry_after_problem(text))
            else:
                wait = _wait_at_most(retry_at - reference, MAX_DELTA_SECONDS)
                if wait is None and sources.debug:
                    problem = _ahead_problem(retry_at - reference, "HTTP-date")
                    sources.reject(_RETRY_AFTER, text, problem)
        if wait is not None and wait > 0:
            sources.add(_RETRY_AFTER, wait)
            waits.append(wait)
        elif wait is not None and sources.debug:
            sources.reject(_RETRY_AFTER, text, None)  # a date equal to the reference

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
    if sources.debug:
        _log_rejected(found, sources)
    return RateLimitHint(
        delay=max(waits) if waits else None,
        remaining=remaining,
        limit=None if quota is None else quota.limit,
        window=None if quota is None else quota.window,
        reset=None if binding is None else binding.reset,
        sources=sources.ordered(),
    )


def _more(count: int, what: str) -> str:
    return f"and {count} more {what}{'s' if count > 1 else ''}"


def _describe(entries: list[tuple[object, list[str]]]) -> str:
    """``'value' (why; why), 'value' (why)``, kept short whatever the input."""
    parts: list[str] = []
    for value, problems in entries[:_MAX_SHOWN_VALUES]:
        reasons = problems[:_MAX_SHOWN_VALUES]
        if len(problems) > _MAX_SHOWN_VALUES:
            reasons.append(_more(len(problems) - _MAX_SHOWN_VALUES, "problem"))
        parts.append(f"{_show(value)} ({'; '.join(reasons)})")
    if len(entries) > _MAX_SHOWN_VALUES:
        parts.append(_more(len(entries) - _MAX_SHOWN_VALUES, "value"))
    return ", ".join(parts)


def _log_rejected(found: dict[str, list[str]], sources: _Sources) -> None:
    """One DEBUG line per rate-limit header that carried an unusable value."""
    by_name: dict[str, list[tuple[object, list[str]]]] = {}
    rejected: list[_Rejected] = sources.rejected
    for name, value, problem in rejected:
        entries = by_name.setdefault(name, [])
        # Problems found in the same line are reported together.
        if entries and entries[-1][0] is value:
            entries[-1][1].append(problem)
        else:
            entries.append((value, [problem]))
    for name, values in found.items():
        # Whatever else made a header useless (only unknown keys, an empty
        # value ...) still gets a line.
        if name != _DATE and name not in sources.names and name not in sources.no_wait:
            by_name.setdefault(name, [(values[0], ["no usable value"])])
    for name in KNOWN_HEADERS:
        if name in by_name:
            logger.debug(
                "slotkit: ignored malformed rate-limit header %s: %s",
                _DISPLAY_NAMES[name],
                _describe(by_name[name]),
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
