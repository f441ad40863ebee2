"""Tunables of the shared throttle and what a request holds in it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slotkit.gate import Waiter
    from slotkit.shared.manager import SharedScopeManager

__all__ = ["Pass", "ThrottleOptions"]


@dataclass(frozen=True)
class ThrottleOptions:
    """Tunables of the shared throttle (seconds unless said otherwise)."""

    namespace: str = "slotkit"
    #: How long one store call may take before it counts as a failure.
    timeout: float = 0.25
    #: Failures in a row that switch every request to the local fallback.
    failures: int = 3
    #: Any failure this long after the last success also switches.
    fallback_after: float = 0.5
    #: Heartbeat period in shared mode (skipped while other calls prove the
    #: worker alive), and probe period while falling back.
    beat: float = 1.0
    probe: float = 0.5
    #: After an outage every worker goes back to the store at one moment, this
    #: long after the first one found it back: longer than ``probe`` plus
    #: ``timeout`` (a frozen store is found back only after both), so the
    #: others have found it too and told it of their fallbacks' requests.
    resync_grace: float = 1.0
    #: A worker not heard of for this long no longer counts in N.
    worker_ttl: float = 5.0
    #: A lease not given back (a worker died) frees its slot after this long.
    lease_ttl: float = 190.0
    #: Never reserve further ahead than this; ask again instead.
    horizon: float = 30.0
    #: Minimum lifetime of a scope's keys after their last use.
    key_ttl: float = 600.0
    #: Longest wait for a ``free`` message before asking again when a scope is full.
    full_poll: float = 1.0
    #: A finished request's lease waits this long for a call to ride on before
    #: it is given back on its own (at once if its scope was full).
    release_linger: float = 0.25
    #: A reserved request waits this much longer than its reserved time, still
    #: listening for holds: a "hold" message racing the reservation's timer
    #: (another worker just got a 429) then stops it instead of following it.
    #: Shifts every reserved request alike, so rates do not change.
    hold_guard: float = 0.01
    #: A reservation used later than this fraction of its scope's interval (a
    #: busy reactor) is given back and asked for again: going that late would
    #: crowd the next worker's slot. Smaller lateness is tolerated.
    late_fraction: float = 0.5
    #: ... but never less than this many seconds.
    late_min: float = 0.02


@dataclass(eq=False)
class Pass:
    """What a request holds in the shared layer between reserve and release."""

    scope_ids: list[str]
    managers: list[SharedScopeManager]
    amounts: list[float | None]
    lease: str | None = None
    fallback_ticket: Waiter | None = None
    sent_at: float = 0.0
    #: Give the lease back at once: its scope had no free slot left.
    urgent: bool = False
    #: A fallback request the store has been told of (see ModeSwitch.adopt).
    adopted: bool = False
    #: It waited in the shared layer (its reserved time, a full scope, a quota).
    waited: bool = False
