"""Rampup: probe for the fastest rate a scope tolerates.

Time is cut into ``window``-second windows (``BACKOFF_WINDOW``). At the end
of each window in which the scope sent something:

* fewer backoff triggers than the target's low end (none, for a target of
  0: a window can hold no fewer than 0) → one step up: lower the
  delay by ``delay_factor`` down to ``min_delay`` (within 10 ms of it counts
  as there); once there, raise the concurrency by one up to the configured
  maximum;
* within the target → hold: triggers up to the target's high end do not
  back the scope off (:meth:`ThrottlingScopeManager.record_backoff` asks
  :meth:`Rampup.within_target`);
* above it → each further trigger takes a normal backoff step.

No step is taken while the scope is backing off. The arithmetic is pure:
:meth:`Rampup.settle` is told the time and reports what changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slotkit.backoff import BackoffRules

__all__ = [
    "NEGLIGIBLE_DELAY",
    "Rampup",
    "RampupConfig",
    "RampupStep",
    "lowered_delay",
    "rampup_backoff",
    "rampup_from_dict",
    "window_holds_more",
]

#: A delay this close to the minimum counts as there. Halving never reaches a
#: minimum of 0, so without this a scope that started with a delay would
#: never get to raise its concurrency; 10 ms is below what a loaded event
#: loop keeps anyway.
NEGLIGIBLE_DELAY = 0.01


def lowered_delay(delay: float, factor: float, min_delay: float) -> float:
    """One rampup step down from *delay*: times *factor*, snapped to *min_delay* when close."""
    lowered = delay * factor
    return min_delay if lowered < min_delay + NEGLIGIBLE_DELAY else lowered


@dataclass(frozen=True, slots=True)
class RampupConfig:
    """Rampup settings of one scope (``"rampup"`` in ``THROTTLING_SCOPES``)."""

    target: tuple[int, int] = (1, 1)
    delay_factor: float = 0.5
    min_delay: float = 0.0
    window: float = 60.0

    @property
    def steps_up_below(self) -> int:
        """A window with fewer triggers than this steps up.

        The target's low end, but at least 1: with a target of 0 ("aim for no
        rate-limit response at all") a window with none steps up and every
        trigger backs off; taken literally, no window could ever step up.
        """
        return max(self.target[0], 1)


@dataclass(frozen=True, slots=True)
class RampupStep:
    """What one window decided: the new delay and concurrency (unchanged if held)."""

    delay: float
    concurrency: int
    changed: bool


class Rampup:
    """Counts triggers per window and decides steps."""

    __slots__ = ("config", "window_end", "triggers", "sent", "steps")

    def __init__(self, config: RampupConfig) -> None:
        self.config = config
        self.window_end = math.inf  # starts with the first dispatch
        self.triggers = 0
        self.sent = 0
        self.steps = 0

    def record_sent(self, now: float) -> None:
        if self.window_end == math.inf and self.config.window > 0:
            self.window_end = now + self.config.window
        self.sent += 1

    def record_trigger(self) -> None:
        self.triggers += 1

    def within_target(self) -> bool:
        """Whether this window's triggers are still no more than the target's high end.

        Up to there the scope holds its rate; only triggers beyond the target
        let normal backoff slow it down.
        """
        return self.triggers <= self.config.target[1]

    def settle(
        self,
        now: float,
        delay: float,
        concurrency: int,
        max_concurrency: int,
        backing_off: bool,
    ) -> RampupStep:
        """Close every window that ended by *now*; return the resulting rate."""
        config = self.config
        changed = False
        while now >= self.window_end:
            quiet = self.triggers < config.steps_up_below
            if quiet and self.sent and not backing_off:
                if delay > config.min_delay:
                    delay = lowered_delay(delay, config.delay_factor, config.min_delay)
                    changed = True
                elif concurrency < max_concurrency:
                    concurrency += 1
                    changed = True
                self.steps += changed
            self.triggers = 0
            self.sent = 0
            self.window_end += config.window
            if now >= self.window_end:
                # Idle windows teach nothing: skip them in one go.
                idle = math.floor((now - self.window_end) / config.window) + 1
                self.window_end += idle * config.window
        return RampupStep(delay, concurrency, changed)


def rampup_from_dict(raw: Any) -> RampupConfig | None:
    """Rebuild a :class:`RampupConfig` from the dict a scope config carries (``None``: off)."""
    if not raw:
        return None
    target = raw.get("backoff_target", (1, 1))
    return RampupConfig(
        target=(int(target[0]), int(target[1])),
        delay_factor=float(raw.get("delay_factor", 0.5)),
        min_delay=float(raw.get("min_delay", 0.0)),
        window=float(raw.get("window", 60.0)),
    )


def window_holds_more(gap: float, target_high: float, window: float) -> bool:
    """Whether a window can hold more triggers than the target's high end at *gap*.

    Only then are triggers up to the target the price of probing; with a
    longer gap every trigger was "within" the target, and a probe's dead site
    was asked once a window for good (325 requests in 10 min, not 48).
    """
    return gap * (target_high + 1) < window


#: The backoff ``min_delay`` of a rampup scope whose rampup has none and that
#: chose none (seconds): steps start near the rate rampup reached.
RAMPUP_BACKOFF_FLOOR = 0.01
#: The backoff ``delay_factor`` of a rampup scope that chose none.
RAMPUP_BACKOFF_FACTOR = 1.25


def rampup_backoff(
    backoff: BackoffRules,
    rampup: RampupConfig,
    *,
    min_delay_chosen: bool,
    factor_chosen: bool,
) -> BackoffRules:
    """The backoff rules of a rampup scope: small steps around the rate it found.

    Rampup probes for the rate itself, so a step goes from where it is:
    falling to ``BACKOFF_MIN_DELAY``'s 1 s and back by halves made a probe's
    scope swing between 1 request a second and full speed (2.3 of 10 allowed
    per second; 9.9 with these steps). What the user chose, globally or for
    the scope, stays.
    """
    min_delay, factor = backoff.min_delay, backoff.delay_factor
    if not min_delay_chosen:
        floor = rampup.min_delay if rampup.min_delay > 0 else RAMPUP_BACKOFF_FLOOR
        min_delay = min(min_delay, floor)
    if not factor_chosen:
        factor = min(factor, RAMPUP_BACKOFF_FACTOR)
    if (min_delay, factor) == (backoff.min_delay, backoff.delay_factor):
        return backoff
    return replace(backoff, min_delay=min_delay, delay_factor=factor)
