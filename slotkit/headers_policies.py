"""Rate-limit policies from each header family (part of :mod:`slotkit.headers`).

Turns the structured ``RateLimit`` / ``RateLimit-Policy`` fields and the
separate ``RateLimit-*`` / ``X-RateLimit-*`` fields into policies, and picks
the binding policy and the one that supplies ``limit``/``window``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from slotkit.headers_fields import _RATELIMIT, _RATELIMIT_POLICY, KNOWN_HEADERS, _parse_members
from slotkit.headers_values import MAX_DELTA_SECONDS, _parse_number

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
