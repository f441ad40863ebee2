"""The local gate a worker falls back on while the shared store is away.

:class:`LocalFallback` admits requests through each scope's fallback manager
(1/N of the shared limits, see :meth:`SharedScopeManager.scale`). It keeps
what the store must learn once it answers again: the requests waiting in it
(sent to the store instead, :meth:`LocalFallback.reroute`) and the requests
it admitted that are still in flight (told to the store, :func:`adoption`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from twisted.internet.defer import CancelledError, Deferred

from slotkit.gate import Gate, Waiter
from slotkit.handover import take
from slotkit.registry import Scope
from slotkit.shared.twin import fmt

if TYPE_CHECKING:
    from scrapy import Request
    from twisted.internet.interfaces import IReactorTime

    from slotkit.shared.manager import SharedScopeManager
    from slotkit.shared.options import Pass, ThrottleOptions

__all__ = ["Adoption", "LocalFallback", "adoption"]


class LocalFallback:
    """The fallback gate of one worker, and what it has waiting and in flight."""

    def __init__(self, clock: IReactorTime) -> None:
        self.gate = Gate(clock)
        self._scopes: dict[str, Scope] = {}
        #: Requests waiting in the gate; True once :meth:`reroute` cancelled
        #: their wait so that they ask the store instead.
        self.waits: dict[Deferred[Waiter], bool] = {}
        #: Requests admitted and still in flight, by id().
        self.in_flight: dict[int, Pass] = {}

    def scope_of(self, manager: SharedScopeManager) -> Scope:
        """The fallback scope of *manager* (built again if its fallback manager changed)."""
        scope_id = manager.scope_id or ""
        scope = self._scopes.get(scope_id)
        if scope is None or scope.manager is not manager.fallback:
            scope = Scope(scope_id, manager.fallback)
            self._scopes[scope_id] = scope
        return scope

    async def admit(self, request: Request, ticket: Pass) -> bool:
        """Admit *ticket* through the gate; False if :meth:`reroute` sent it to the store."""
        scopes = [self.scope_of(m) for m in ticket.managers]
        waiter = self.gate.try_acquire(request, scopes, ticket.amounts)
        if waiter is None:
            waiting = self.gate.acquire(request, scopes, ticket.amounts, request.priority)
            ticket.waited = True
            self.waits[waiting] = False
            try:
                # A place the gate gave just before a cancel reached us goes back.
                waiter = await take(waiting, self.gate.release)
            except CancelledError:
                if not self.waits.pop(waiting, False):
                    raise  # the caller cancelled
                return False
            finally:
                rerouted = self.waits.pop(waiting, False)
            if rerouted:
                # Admitted in the very turn the re-sync sent it to the store:
                # the store is not told of it, so give the place back and ask.
                self.gate.release(waiter)
                return False
        ticket.fallback_ticket = waiter
        self.in_flight[id(ticket)] = ticket
        return True

    def reroute(self) -> None:
        """Send the requests waiting in the gate to the store.

        At the fallback's pace they would go on top of what the store hands
        out, and a worker whose share of a small concurrency is 0 would hold
        them for ever.
        """
        for waiting in list(self.waits):
            self.waits[waiting] = True
            waiting.cancel()

    def release(self, ticket: Pass) -> bool:
        """Give back *ticket*'s place if the fallback admitted it; whether it did."""
        if ticket.fallback_ticket is None:
            return False
        waiter, ticket.fallback_ticket = ticket.fallback_ticket, None
        self.in_flight.pop(id(ticket), None)
        self.gate.release(waiter)
        return True

    def poke(self, scope_id: str) -> None:
        """A shared request of *scope_id* ended: a fallback waiter may fit now."""
        scope = self._scopes.get(scope_id)
        if scope is not None:
            self.gate.poke(scope)

    def close(self, reason: str) -> None:
        """Fail every request waiting in the gate (spider closing)."""
        self.gate.close(list(self._scopes.values()), reason)


@dataclass
class Adoption:
    """One ``adopt`` call: what a fallback sent, for the store."""

    scope_ids: list[str]
    args: list[str]
    #: The tickets it tells of, and the quota units per scope: both to restore if it fails.
    told: list[Pass]
    units: dict[str, float]
    managers: dict[str, SharedScopeManager]

    def failed(self, _: object = None) -> None:
        """The call failed: tell the same again next time (same lease ids)."""
        for ticket in self.told:
            ticket.adopted = False
        for scope_id, spent in self.units.items():
            self.managers[scope_id].untold_units += spent
            self.managers[scope_id].told_units -= spent


def adoption(
    now: float,
    tickets: Iterable[Pass],
    managers: Iterable[SharedScopeManager],
    options: ThrottleOptions,
    new_lease: Callable[[], str],
) -> Adoption | None:
    """The ``adopt`` call telling the store what a fallback sent, or None if nothing.

    Each ticket not told yet gets a lease (a retry keeps its id: the store
    may have taken it already); each scope's next dispatch waits for the gap
    left after this worker's last one; quota units spent by the fallback count
    in the store's current window (at most what its sliding window still
    counts). One call, so a request's scopes are told together or not at all.
    """
    told = [ticket for ticket in tickets if not ticket.adopted]
    leases_of: dict[str, list[str]] = {}
    managers_of: dict[str, SharedScopeManager] = {}
    for ticket in told:
        ticket.lease = ticket.lease or new_lease()
        ticket.adopted = True
        for scope_id, manager in zip(ticket.scope_ids, ticket.managers, strict=True):
            leases_of.setdefault(scope_id, []).append(ticket.lease)
            managers_of[scope_id] = manager
    gaps: dict[str, float] = {}
    for manager in [*managers, *managers_of.values()]:
        scope_id = manager.scope_id or ""
        last = manager.fallback.last_sent
        interval = max(manager.delay, manager.crawl_delay)
        gap = 0.0 if last is None else max(0.0, last + interval - now)
        if gap > 0 or manager.untold_units > 0:
            gaps[scope_id] = gap
            managers_of[scope_id] = manager
    if not managers_of:
        return None
    units = {
        scope_id: min(m.untold_units, m.fallback.quota.used(now))
        for scope_id, m in managers_of.items()
        if m.untold_units > 0 and m.fallback.quota is not None
    }
    for scope_id, spent in units.items():
        managers_of[scope_id].untold_units = 0.0
        managers_of[scope_id].told_units += spent
    scope_ids = sorted(managers_of)
    key_ttl = max([options.key_ttl, *(m.window for m in managers_of.values())])
    args = [fmt(options.lease_ttl), fmt(key_ttl), str(len(scope_ids))]
    for scope_id in scope_ids:
        leases = leases_of.get(scope_id, [])
        window = managers_of[scope_id].window
        args += [fmt(gaps.get(scope_id, 0.0)), fmt(units.get(scope_id, 0.0)), fmt(window)]
        args += [str(len(leases)), *leases]
    return Adoption(scope_ids, args, told, units, managers_of)
