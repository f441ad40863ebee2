"""The heartbeat of a :class:`~slotkit.shared.link.StoreLink`: this worker's liveness in the store.

The store counts a worker alive while its ttl is fresh, and answers a call
carrying the ttl with the worker count and this worker's rank. The ttl rides
on the link's ordinary calls now and then (:meth:`Heartbeat.rides_on`); a
``beat`` call of its own goes only when no call did for a while. While the
link falls back, the beat is the probe that finds the store again and learns
when to go back to it (see :meth:`~slotkit.shared.modes.ModeSwitch.resync_in`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from slotkit.shared.modes import FALLBACK, SHARED
from slotkit.shared.twin import fmt

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall

    from slotkit.shared.link import StoreLink

__all__ = ["Heartbeat"]


class Heartbeat:
    """Keeps its link's worker alive in the store, and probes the store while it is away."""

    def __init__(self, link: StoreLink) -> None:
        self.link = link
        #: When a call last proved this worker alive to the store (none yet).
        self.alive_at = -math.inf
        #: When the last call carrying the heartbeat left (see rides_on).
        self.sent_at = -math.inf
        self.next_beat: IDelayedCall | None = None
        self.in_flight = False

    def rides_on(self, op: str) -> bool:
        """Whether the call of *op* leaving now carries the heartbeat (noted as sent if so)."""
        link = self.link
        # The heartbeat (this worker's ttl: the store counts it alive and
        # tells it the worker count and its rank) goes on one call per half
        # heartbeat period, not on every call: it was half of the store's
        # time per acquire with eight workers. Every call while not in
        # shared mode, and beats and leaves, carry it.
        now = link.clock.seconds()
        heartbeat = (
            op in ("beat", "leave")
            or link.mode != SHARED
            or now - self.sent_at >= link.options.beat / 2
        )
        if heartbeat:
            self.sent_at = now
        return heartbeat

    def schedule(self, delay: float) -> None:
        if self.link._closed:
            return
        if self.next_beat is not None and self.next_beat.active():
            self.next_beat.cancel()
        self.next_beat = self.link.clock.callLater(delay, self._beat)

    def _beat(self) -> None:
        link = self.link
        self.next_beat = None
        quiet = link.clock.seconds() - self.alive_at
        if link.mode == SHARED and link._failures == 0 and quiet < link.options.beat * 0.9:
            # Other calls proved this worker alive lately: no heartbeat needed yet.
            link.backend.subscribe(link.channel, link._event)
            self.schedule(link.options.beat - quiet)
            return
        self.in_flight = True
        if link.mode == FALLBACK:
            grace = max(link.options.resync_grace, link.options.probe)
            d = link._call([link.workers_key, link.resync_key], "beat", [fmt(grace)])
        else:
            d = link._call([link.workers_key], "beat", [])

        def ok(reply: list[str]) -> None:
            self.in_flight = False
            if link._closed:
                return  # answered after close: nothing to adopt or resume
            if link.mode == FALLBACK:  # (in shared mode _succeeded renewed the subscription)
                moment = reply[3] if len(reply) > 3 else None
                link.switch.resync_in(float(reply[2]) if len(reply) > 2 else 0.0, moment)
            self.schedule(link.options.beat)

        def failed(_: object) -> None:
            self.in_flight = False
            self.schedule(link.options.probe)

        d.addCallbacks(ok, failed)
