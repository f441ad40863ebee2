"""The twin's backoff and rampup arithmetic, as the script's local functions.

Pure functions of one scope's stored state and the script's ``now``:
:func:`gap_end`, :func:`settle` (backoff recovery), :func:`ramp` (shared
rampup) and :func:`step` (a backoff step) mirror ``gap_end``, ``settle``,
``ramp`` and ``step`` in ``script.lua`` line for line, so that both give the
same replies.
"""

from __future__ import annotations

import math

from slotkit.rampup import lowered_delay
from slotkit.shared.twin_keys import ScopeState

__all__ = ["gap_end", "ramp", "settle", "step"]


def gap_end(st: ScopeState, base: float, now: float) -> float:
    """When the gap after the last slot already taken ends (see the script)."""
    interval = max(base, st.bo)
    if st.tat <= now or interval <= 0:
        return st.tat
    return st.tat - (math.ceil((st.tat - now - 0.000001) / interval) - 1) * interval


def settle(
    st: ScopeState, base: float, factor: float, floor: float, window: float, now: float
) -> None:
    """Backoff recovery due by *now*: one factor step down per quiet window."""
    before = max(base, st.bo)
    while st.bo > 0 and st.rec > 0 and now >= st.rec:
        lower = st.bo / factor
        if lower < floor or lower <= base:
            st.bo = 0.0
            st.rec = 0.0
        else:
            st.bo = lower
            st.rec = st.rec + window
    # The next slot comes back in by what the interval shrank (see the script).
    st.tat = st.tat - (before - max(base, st.bo))


def ramp(st: ScopeState, a: dict[str, float], now: float) -> None:
    """Shared rampup, as the script's ``ramp``: close every ended window, step up if quiet."""
    if st.rc < 1:
        st.rd = max(a["delay"], a["rmin"])  # never faster than its min_delay
        st.rc = a["minc"]
    while st.rwe > 0 and now >= st.rwe:
        if st.rt < a["rlow"] and st.rs > 0 and st.bo == 0:
            if st.rd > a["rmin"]:
                st.rd = lowered_delay(st.rd, a["rfac"], a["rmin"])
            elif st.rc < a["conc"]:
                st.rc = st.rc + 1
        st.rt = 0.0
        st.rs = 0.0
        st.rwe = st.rwe + a["rwin"]
        if now >= st.rwe:
            st.rwe = st.rwe + (math.floor((now - st.rwe) / a["rwin"]) + 1) * a["rwin"]
    if st.rc > a["conc"]:
        st.rc = max(a["minc"], a["conc"])  # a ceiling lowered since (see the script)
    a["delay"] = st.rd
    a["conc"] = st.rc


def step(st: ScopeState, a: dict[str, float], base: float, now: float) -> bool:
    """One backoff step, as the script's ``step``; whether the workers must hear "step"
    (the interval grew: they give back the reservations they wait on)."""
    if a["ron"] > 0 and st.rc > a["minc"]:
        st.rc = st.rc - 1  # rampup's concurrency goes back first
        return False
    before = max(base, st.bo)
    st.bo = min(a["bmax"], max(a["bmin"], before * a["factor"]))
    after = max(base, st.bo)
    if after <= before:
        return False
    st.tat = now + after  # from the trigger (see the script)
    return True
