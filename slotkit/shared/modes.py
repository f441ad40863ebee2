"""The two modes of a :class:`~slotkit.shared.link.StoreLink` and the switch between them.

* ``shared``: requests ask the store;
* ``fallback``: the store failed, and requests go through the worker's
  local fallback at 1/N of the shared limits.

:class:`ModeSwitch` enters the fallback when calls keep failing and goes
back to the store once the heartbeat finds it answering again: at a moment
the store sets, the same for every worker, after telling it what the
fallback still has in flight (:meth:`ModeSwitch.adopt`) and writing back the
holds this worker knows (:meth:`ModeSwitch.resync`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from slotkit.shared.fallback import adoption

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall
    from twisted.python.failure import Failure

    from slotkit.shared.link import StoreLink
    from slotkit.shared.manager import SharedScopeManager
    from slotkit.shared.options import Pass

logger = logging.getLogger("slotkit")

__all__ = ["FALLBACK", "SHARED", "ModeSwitch"]

SHARED = "shared"
FALLBACK = "fallback"


class ModeSwitch:
    """Takes its link to the local fallback, and back to the store (the re-sync).

    The link's :attr:`~slotkit.shared.link.StoreLink.mode` and its
    fallback/re-sync counters stay on the link, which everything else reads;
    this is what changes them.
    """

    def __init__(self, link: StoreLink, on_mode: Callable[[str], Any] | None = None) -> None:
        self.link = link
        self._on_mode = on_mode
        #: In fallback, but the store answers: its requests are told to it as they go.
        self.store_back = False
        #: The switch-back moment as the store stored it (it tells a new store apart).
        self.moment: str | None = None
        self.resync_call: IDelayedCall | None = None

    def enter_fallback(self, now: float, failure: Failure) -> None:
        link = self.link
        link.mode = FALLBACK
        self.store_back = False
        self.moment = None
        self.cancel_resync()
        link.fallbacks += 1
        link.fell_back_at = now
        logger.warning(
            "slotkit: the shared throttling store failed (%s); throttling locally at 1/%d "
            "of the shared limits until it answers again",
            failure.getErrorMessage() or type(failure.value).__name__,
            link.workers,
        )
        for manager in link._managers.values():
            manager.scale(link.workers, link.rank)
            manager.told_units = 0.0
        # Requests waiting on the store move to the fallback now.
        link.sleeps.end_all("fallback")
        if self._on_mode is not None:
            self._on_mode(FALLBACK)
        link.heartbeat.schedule(link.options.probe)

    def resync_in(self, wait: float, moment: str | None = None) -> None:
        """Go back to the store after *wait* seconds, the moment every worker does.

        Meanwhile the fallback goes on, and the store is told of each of its
        requests as it goes (see :meth:`adopt`): when the workers switch,
        the store knows what all of their fallbacks have in flight.
        """
        link = self.link
        if link._closed:
            return
        if moment is not None:
            if self.store_back and self.moment is not None and moment != self.moment:
                self.forget_adoptions()
            self.moment = moment
        if wait <= 0:
            self.resync()
            return
        if not self.store_back:
            self.store_back = True
            self.adopt(link.clock.seconds(), link.local.in_flight.values(), link._managers.values())
        if self.resync_call is None or not self.resync_call.active():
            self.resync_call = link.clock.callLater(wait, self._resync_when_due)

    def forget_adoptions(self) -> None:
        """The store that set our moment is gone (restarted empty): tell the new one all again.

        Lease ids are kept, so a store that did take them counts each once;
        quota units told twice only make the quota stricter.
        """
        self.store_back = False
        for ticket in self.link.local.in_flight.values():
            ticket.adopted = False
        for manager in self.link._managers.values():
            manager.untold_units += manager.told_units
            manager.told_units = 0.0

    def _resync_when_due(self) -> None:
        link = self.link
        self.resync_call = None
        # Ask once more rather than switch: a store that restarted since it
        # set the moment knows neither it nor what the other workers'
        # fallbacks sent, and going back to it alone would exceed the limits
        # beside them. It sets a new moment instead; the same store answers
        # that the moment has come (see the beat reply). A beat in flight
        # already asks.
        due = link.mode == FALLBACK and link._failures == 0 and not link._closed
        if due and not link.heartbeat.in_flight:
            link.heartbeat.schedule(0.0)

    def cancel_resync(self) -> None:
        if self.resync_call is not None and self.resync_call.active():
            self.resync_call.cancel()
        self.resync_call = None

    def resync(self) -> None:
        """The store answered again: write back known holds, free leftovers, go shared."""
        link = self.link
        if link._closed:
            return
        self.cancel_resync()
        now = link.clock.seconds()
        link.mode = SHARED
        link.resyncs += 1
        link.resynced_at = now
        for scope_id, manager in link._managers.items():
            if manager.fallback.hold_until > now:
                link._send_backoff([scope_id], [manager], manager.fallback.hold_until - now, 0.0)
            # The fallback stays at 1/N: requests it admitted may still be in
            # flight, and it also admits a request whose call fails later on.
            manager.scale(link.workers, link.rank)
        if link._releases:
            link._flush()
        self.adopt(now, link.local.in_flight.values(), link._managers.values())
        self.store_back = False
        self.moment = None
        link.local.reroute()
        link.backend.subscribe(link.channel, link._event)
        logger.info("slotkit: the shared throttling store is back; throttling is shared again")
        if self._on_mode is not None:
            self._on_mode(SHARED)

    def adopt(
        self, now: float, tickets: Iterable[Pass], managers: Iterable[SharedScopeManager]
    ) -> None:
        """Tell the store what this worker's fallback sent while the store was away.

        A restarted store knows nothing, and a thawed one never saw these
        requests: without this, the store would hand out every slot and an
        immediate dispatch while the fallback's requests are still in flight
        (see :func:`slotkit.shared.fallback.adoption`).
        """
        link = self.link
        call = adoption(
            now, tickets, managers, link.options, lambda: f"{link.worker_id}:{next(link._leases)}"
        )
        if call is not None:
            link._call(link._keys(call.scope_ids), "adopt", call.args).addErrback(call.failed)
