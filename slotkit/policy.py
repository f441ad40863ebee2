"""The arithmetic of throttling, as pure functions.

Randomness is passed in (any object with ``uniform(a, b)``) so tests can pin
it, the way Twisted's ``backoffPolicy`` takes its jitter source.
"""

from __future__ import annotations

from typing import Protocol

from slotkit.validation import Jitter

__all__ = ["Uniform", "jitter_factor"]


class Uniform(Protocol):
    """The part of :class:`random.Random` the policies use."""

    def uniform(self, a: float, b: float) -> float: ...


def jitter_factor(jitter: Jitter, rng: Uniform) -> float:
    """Return the factor a delay is multiplied by: ``1 + uniform(low, high)``.

    Never negative, so a jitter wider than ±100% floors at no delay instead
    of producing a negative gap.
    """
    low, high = jitter
    if low == high == 0.0:
        return 1.0
    return max(0.0, 1.0 + rng.uniform(low, high))


def next_backoff(current: float, factor: float, floor: float, cap: float) -> float:
    """One backoff step: ``min(cap, max(floor, current * factor))``.

    >>> next_backoff(current=2.0, factor=2.0, floor=1.0, cap=300.0)
    4.0
    >>> next_backoff(current=0.0, factor=2.0, floor=1.0, cap=300.0)
    1.0
    """
    return min(cap, max(floor, current * factor))


def recover(current: float, factor: float, floor: float, base: float) -> float | None:
    """One recovery step down from *current*; ``None`` once back at *base*.

    The delay drops by one *factor*; a step that would fall below *floor*
    (the first backoff step) or *base* (the configured delay) ends the
    backoff instead, so 8 → 4 → 2 → 1 → base with the defaults.

    >>> recover(current=8.0, factor=2.0, floor=1.0, base=0.0)
    4.0
    >>> recover(current=1.0, factor=2.0, floor=1.0, base=0.0) is None
    True
    """
    lower = current / factor
    if lower < floor or lower <= base:
        return None
    return lower
