"""Waits on the crawl's clock that a store event (or the store going down) ends early."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from twisted.internet.defer import Deferred

from slotkit.gate import GateClosedError

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall, IReactorTime

__all__ = ["Sleep", "Sleeps"]


@dataclass(eq=False)
class Sleep:
    """One wait: fires with ``"timer"``, an event kind, or ``"fallback"``."""

    deferred: Deferred[str]
    scopes: frozenset[str]
    kinds: frozenset[str]
    call: IDelayedCall | None = None
    events: list[str] = field(default_factory=list)


class Sleeps:
    """Every wait of one throttle, so events and closing can reach them."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._sleeps: set[Sleep] = set()

    def __len__(self) -> int:
        return len(self._sleeps)

    def sleep(self, seconds: float, scopes: Iterable[str], kinds: Iterable[str]) -> Sleep:
        """Wait *seconds* (forever if infinite) or until an event of *kinds* for *scopes*."""
        sleep = Sleep(Deferred(), frozenset(scopes), frozenset(kinds))
        # A cancelled request (its crawl closing) stops waiting and forgets the timer.
        sleep.deferred = Deferred(lambda _: self._forget(sleep))
        if math.isfinite(seconds):
            sleep.call = self._clock.callLater(max(0.0, seconds), self.end, sleep, "timer")
        self._sleeps.add(sleep)
        return sleep

    def _forget(self, sleep: Sleep) -> None:
        self._sleeps.discard(sleep)
        if sleep.call is not None and sleep.call.active():
            sleep.call.cancel()

    def end(self, sleep: Sleep, outcome: str | None) -> None:
        """End *sleep* with *outcome*; ``None`` fails it (the downloader closed)."""
        if sleep not in self._sleeps:
            return
        self._forget(sleep)
        if sleep.deferred.called:
            return
        if outcome is None:
            sleep.deferred.errback(GateClosedError("the downloader closed during a shared wait"))
        else:
            sleep.deferred.callback(outcome)

    def event(self, kind: str, scope_id: str) -> None:
        """A store event: wake every wait that listens for it."""
        for sleep in list(self._sleeps):
            if kind in sleep.kinds and scope_id in sleep.scopes:
                self.end(sleep, kind)

    def listening(self, kind: str, scope_id: str) -> bool:
        """Whether a wait would end on an event of *kind* for *scope_id*."""
        return any(kind in sleep.kinds and scope_id in sleep.scopes for sleep in self._sleeps)

    def end_all(self, outcome: str | None) -> None:
        for sleep in list(self._sleeps):
            self.end(sleep, outcome)
