"""A ``Downloader.slots`` that behaves like Scrapy's, backed by scopes.

Scrapy components read the stock downloader's slots: the default priority
queue counts ``len(slots[key].active)``, AutoThrottle reads and writes
``slots[key].delay``, the telnet console prints them, and plugins such as
scrapy-zyte-api call ``_get_slot(request)`` and set ``slot.delay = 0``. The
views below answer those reads from the live scopes and turn writes into
scope-manager calls, so the scope stays the one source of truth.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from slotkit import clock

if TYPE_CHECKING:
    from scrapy import Request

    from slotkit.gate import Gate
    from slotkit.registry import Scope, ScopeRegistry

__all__ = ["SlotView", "SlotsView"]


class SlotView:
    """One scope seen through ``scrapy.core.downloader.Slot``'s attributes."""

    __slots__ = ("_gate", "_scope", "written")

    def __init__(self, scope: Scope, gate: Gate) -> None:
        self._scope = scope
        self._gate = gate
        #: What was set through this view (attribute -> value), newest last: a
        #: robots.txt Crawl-delay arriving later must not undo it (see reapply).
        self.written: dict[str, float] = {}

    @property
    def key(self) -> str:
        return self._scope.id

    @property
    def active(self) -> AbstractSet[Request]:
        """Requests of the scope waiting at the gate or in flight (live; read-only)."""
        scope = self._scope
        scope.keep_sets()  # the caller may keep it: it must stay the scope's set
        return scope.requests

    @property
    def transferring(self) -> AbstractSet[Request]:
        """Requests of the scope in flight (live and read-only, like :attr:`active`)."""
        scope = self._scope
        scope.keep_sets()
        return scope.in_flight

    @property
    def queue(self) -> deque[tuple[Request, None]]:
        """Requests of the scope still waiting (a snapshot; Scrapy pairs them with Deferreds)."""
        scope = self._scope
        return deque((request, None) for request in scope.requests - scope.in_flight)

    @property
    def delay(self) -> float:
        return float(getattr(self._scope.manager, "delay", 0.0))

    @delay.setter
    def delay(self, value: float) -> None:
        self.written["delay"] = float(value)
        self._scope.manager.set_base_delay(float(value))
        self._gate.poke(self._scope)

    @property
    def concurrency(self) -> int:
        return int(getattr(self._scope.manager, "concurrency", 0))

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        self.written["concurrency"] = int(value)
        self._scope.manager.set_concurrency(int(value))
        self._gate.poke(self._scope)

    @property
    def jitter(self) -> float:
        low, high = getattr(self._scope.manager, "jitter", (0.0, 0.0))
        return float(max(-low, high))

    @jitter.setter
    def jitter(self, value: float) -> None:
        # set_jitter is optional for a scope manager (as robots.txt uses it).
        set_jitter = getattr(self._scope.manager, "set_jitter", None)
        if callable(set_jitter):
            magnitude = abs(float(value))
            self.written["jitter"] = magnitude
            set_jitter((-magnitude, magnitude))
            self._gate.poke(self._scope)

    @property
    def randomize_delay(self) -> bool:
        return bool(self.jitter)

    def reapply(self) -> None:
        """Set again what was written through this view.

        With Scrapy's downloader a plugin's ``slot.delay = 0`` or
        ``slots[key] = Slot(...)`` holds until the slot goes; slotkit's
        robots.txt support would otherwise reset it when the site's
        Crawl-delay arrives, after the plugin had spoken.
        """
        for name, value in list(self.written.items()):
            setattr(self, name, value)

    @property
    def lastseen(self) -> float:
        """When the scope last dispatched, on stock Scrapy's clock; 0: never.

        Plugins take a stock ``Slot.lastseen`` as a reading of
        :data:`slotkit.clock.stock_clock` and compute ages against it, so the
        last dispatch (on the reactor's clock) is translated onto that one.
        """
        last_sent = getattr(self._scope.manager, "last_sent", None)
        if not last_sent:
            return 0.0
        age = self._gate.clock.seconds() - float(last_sent)
        return clock.stock_clock() - age

    @property
    def latercall(self) -> Any:
        return self._scope.timer

    def free_transfer_slots(self) -> int:
        return self.concurrency - len(self._scope.in_flight)

    def download_delay(self) -> float:
        sample = getattr(self._scope.manager, "sample_delay", None)
        return float(sample()) if callable(sample) else self.delay

    def close(self) -> None:
        """Nothing to do: the downloader closes the scopes."""

    def __repr__(self) -> str:
        return repr(self._scope)

    __str__ = __repr__


class SlotsView(Mapping[str, SlotView]):
    """``Downloader.slots``: live scopes by id, as :class:`SlotView` objects."""

    def __init__(self, registry: ScopeRegistry, gate: Gate) -> None:
        # Scrapy's default priority queue reads every slot on every pop, so
        # lookups go straight to the registry's dict and views are cached.
        self._scopes = registry.live
        self._registry = registry
        self._gate = gate

    def __getitem__(self, key: str) -> SlotView:
        scope = self._scopes.get(key)
        if scope is None:
            raise KeyError(key)
        return view_of(scope, self._gate)

    def __setitem__(self, key: str, slot: Any) -> None:
        """``slots[key] = Slot(concurrency, delay, jitter)``, as older plugins do.

        The scope *key* (created if need be) takes the slot's concurrency,
        delay and jitter; the scope stays the one that throttles, so the
        object assigned is not kept.
        """
        view = view_of(self._registry.get(key), self._gate)
        view.concurrency = slot.concurrency
        view.delay = slot.delay
        jitter = getattr(slot, "jitter", None)
        if jitter is None:  # an older Scrapy's Slot has randomize_delay only
            jitter = 0.5 if getattr(slot, "randomize_delay", False) else 0.0
        view.jitter = jitter

    def __contains__(self, key: object) -> bool:
        return key in self._scopes

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._scopes))

    def __len__(self) -> int:
        return len(self._scopes)

    def __repr__(self) -> str:
        # Printed like the stock downloader's dict of slots (telnet, shell).
        return repr(dict(self.items()))


def view_of(scope: Scope, gate: Gate) -> SlotView:
    """The (cached) :class:`SlotView` of *scope*."""
    view = scope.view
    if view is None:
        view = scope.view = SlotView(scope, gate)
    return view  # type: ignore[no-any-return]
