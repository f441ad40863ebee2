"""Rate-limit policies from each header family (part of :mod:`slotkit.headers`).

Turns the structured ``RateLimit`` / ``RateLimit-Policy`` fields and the
separate ``RateLimit-*`` / ``X-RateLimit-*`` fields into policies, and picks
the binding policy and the one that supplies ``limit``/``window``.

When the ``slotkit`` logger logs at DEBUG level (``_Sources.debug``), every
value that is present but unusable is noted on :class:`_Sources` (header,
raw line, reason) for the log line of :mod:`slotkit.headers`. That
bookkeeping only runs on the rejection path, and not at all otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from slotkit.headers_fields import (
    _RATELIMIT,
    _RATELIMIT_POLICY,
    KNOWN_HEADERS,
    _Member,
    _parse_members,
    _Rejected,
)
from slotkit.headers_values import (
    _NOT_A_NUMBER,
    MAX_DELTA_SECONDS,
    _ahead_problem,
    _number_problem,
    _parse_number,
    _show,
)

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


def _reset_epoch_problem(text: str, reference: float) -> str | None:
    """Why :func:`_reset_maybe_epoch` gave ``None`` (``None``: a past timestamp)."""
    number = _parse_number(text)
    if number is None:
        return _number_problem(text)
    return _ahead_problem(number - reference, "epoch timestamp")


def _window_problem(text: str) -> str:
    return "zero" if _parse_number(text) == 0 else _number_problem(text, maximum=MAX_DELTA_SECONDS)


# Characters of a parameter or member quoted in a reason (the whole line is
# quoted too).
_SHOWN_PART_CHARS = 40


def _param(key: str, text: str, problem: str) -> str:
    return f"{key}={_show(text, _SHOWN_PART_CHARS)}: {problem}"


def _item(member: _Member, line: str, problem: str) -> str:
    """*problem*, naming the member when *line* has more than this one."""
    if member.item == line:
        return problem
    return f"{_show(member.item, _SHOWN_PART_CHARS)}: {problem}"


class _Sources:
    """Which headers gave a valid value, and which values were unusable."""

    def __init__(self, *, debug: bool = False) -> None:
        self.names: set[str] = set()
        #: Whether to note unusable values (callers test it before working
        #: out why a value is unusable).
        self.debug = debug
        #: Unusable values, in the order met: see :data:`_Rejected`.
        self.rejected: list[_Rejected] = []
        #: Headers with a well-formed value that asks for nothing (a zero
        #: ``Retry-After``, a past date): neither used nor malformed.
        self.no_wait: set[str] = set()

    def add(self, name: str, value: float | None) -> float | None:
        if value is not None:
            self.names.add(name)
        return value

    def reject(self, name: str, value: object, problem: str | None) -> None:
        """Note an unusable *value* of header *name*; ``None``: asks for no wait."""
        if problem is None:
            self.no_wait.add(name)
        else:
            self.rejected.append((name, value, problem))

    def ordered(self) -> tuple[str, ...]:
        return tuple(name for name in KNOWN_HEADERS if name in self.names)


def _legacy_value(key: str, text: str, line: str, sources: _Sources) -> float | None:
    """``limit``/``remaining``/``reset`` of the dictionary form of ``RateLimit``."""
    reset = key == "reset"
    number = _reset_delta(text) if reset else _quota(text)
    if number is None and sources.debug:
        problem = _number_problem(text, maximum=MAX_DELTA_SECONDS if reset else math.inf)
        sources.reject(_RATELIMIT, line, _param(key, text, problem))
    return sources.add(_RATELIMIT, number)


def _note_item_policy(
    r_text: str | None, t_text: str | None, policy: _Policy, line: str, sources: _Sources
) -> None:
    """Note what made a ``RateLimit`` item unusable (if anything did)."""
    if r_text is None and t_text is None:
        sources.reject(_RATELIMIT, line, "a policy with neither r= nor t=")
    if r_text is not None and policy.remaining is None:
        sources.reject(_RATELIMIT, line, _param("r", r_text, _number_problem(r_text)))
    if t_text is not None and policy.reset is None:
        problem = _number_problem(t_text, maximum=MAX_DELTA_SECONDS)
        sources.reject(_RATELIMIT, line, _param("t", t_text, problem))


def _ratelimit_policies(values: list[str], sources: _Sources) -> list[_Policy]:
    """Policies from the ``RateLimit`` field (item and dictionary forms)."""
    policies: list[_Policy] = []
    legacy = _Policy()
    for line in values:
        for member in _parse_members([line]):
            if member.key is None:
                r_text = member.params.get("r")
                t_text = member.params.get("t")
                policy = _Policy(
                    name=member.item or None,
                    remaining=sources.add(_RATELIMIT, _quota(r_text)),
                    reset=sources.add(_RATELIMIT, _reset_delta(t_text)),
                )
                if policy.has_state():
                    policies.append(policy)
                if sources.debug:
                    _note_item_policy(r_text, t_text, policy, line, sources)
            elif member.key == "limit":
                legacy.limit = _legacy_value(member.key, member.item, line, sources)
            elif member.key == "remaining":
                legacy.remaining = _legacy_value(member.key, member.item, line, sources)
            elif member.key == "reset":
                legacy.reset = _legacy_value(member.key, member.item, line, sources)
    if legacy.has_state() or legacy.limit is not None:
        policies.append(legacy)
    return policies


def _window_param(member: _Member, name: str, line: str, sources: _Sources) -> float | None:
    """The ``w``/``window`` parameter of *member*, noting an unusable one."""
    key = "w" if member.params.get("w") else "window"
    text = member.params.get(key)
    window = _window(text)
    if text and window is None and sources.debug:
        sources.reject(name, line, _param(key, text, _window_problem(text)))
    return window


def _quota_policies(values: list[str], sources: _Sources) -> list[_Policy]:
    """Quota definitions from ``RateLimit-Policy``."""
    policies: list[_Policy] = []
    for line in values:
        for member in _parse_members([line]):
            if member.key is not None:
                continue
            if "q" in member.params:
                name: str | None = member.item or None
                limit = _quota(member.params["q"])
                if limit is None and sources.debug:
                    problem = _param("q", member.params["q"], _number_problem(member.params["q"]))
                    sources.reject(_RATELIMIT_POLICY, line, problem)
            else:  # older drafts: a bare number with a w= parameter
                name = None
                limit = _quota(member.item)
                if limit is None and sources.debug:
                    problem = _number_problem(member.item)
                    if problem == _NOT_A_NUMBER:
                        problem = "a policy with no q="
                    sources.reject(_RATELIMIT_POLICY, line, _item(member, line, problem))
            window = _window_param(member, _RATELIMIT_POLICY, line, sources)
            if limit is not None:
                sources.add(_RATELIMIT_POLICY, limit)
                policies.append(_Policy(name=name, limit=limit, window=window))
    return policies


def _numbers(found: dict[str, list[str]], names: Iterable[str], sources: _Sources) -> list[float]:
    numbers: list[float] = []
    for name in names:
        for line in found.get(name, []):
            for member in _parse_members([line]):
                if member.key is not None:
                    continue
                number = sources.add(name, _quota(member.item))
                if number is not None:
                    numbers.append(number)
                elif sources.debug:
                    sources.reject(name, line, _item(member, line, _number_problem(member.item)))
    return numbers


def _limit_line(name: str, line: str, sources: _Sources) -> tuple[float | None, float | None]:
    """Limit (and window) from one ``*-Limit`` line.

    Early drafts let ``RateLimit-Limit`` list quota policies after the
    current limit (``10, 10;w=1, 50;w=60``): the first number is the limit,
    and its window is the ``w``/``window`` parameter of the first member with
    that same quota that carries one.
    """
    limit: float | None = None
    window: float | None = None
    for member in _parse_members([line]):
        if member.key is not None:
            continue
        quota = _quota(member.item)
        if quota is None:
            if sources.debug:
                sources.reject(name, line, _item(member, line, _number_problem(member.item)))
            continue
        member_window = _window_param(member, name, line, sources)
        if limit is None:
            limit = quota
        if quota == limit and window is None:
            window = member_window
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
            limit, window = _limit_line(name, value, sources)
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
        for line in found.get(name, []):
            for member in _parse_members([line]):
                if member.key is not None:
                    continue
                reset = sources.add(name, _reset_maybe_epoch(member.item, reference))
                if reset is not None:
                    resets.append(reset)
                elif sources.debug:
                    problem = _reset_epoch_problem(member.item, reference)
                    if problem is not None:
                        problem = _item(member, line, problem)
                    sources.reject(name, line, problem)
    if resets:
        policy.reset = max(resets)
    if remaining and len(remaining) == len(resets) > 1:
        # Values listed in step (``X-RateLimit-Remaining: 9, 9999`` with
        # ``X-RateLimit-Reset: 1, 50000``: a per-second and a daily policy)
        # pair up: a spent one binds until its own latest reset, else the
        # scarcest one with its own reset. Taken apart, 9 left until the
        # daily reset made a budget of 9 requests for 300 s (a probe).
        pairs = list(zip(remaining, resets, strict=True))
        spent = [pair for pair in pairs if pair[0] <= 0]
        if spent:
            policy.remaining, policy.reset = max(spent, key=lambda pair: pair[1])
        else:
            policy.remaining, policy.reset = min(pairs, key=lambda pair: (pair[0], -pair[1]))
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
