"""Small statistics helpers (no third-party dependencies)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    """Return the median of *values* (``nan`` if empty)."""
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], pct: float) -> float:
    """Return the *pct*-th percentile of *values*, linearly interpolated.

    ``pct`` is in ``[0, 100]``; returns ``nan`` for an empty sequence.
    """
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * pct / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
