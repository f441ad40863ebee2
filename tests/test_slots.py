"""Tests for slotkit.slots: Scrapy's Slot/slots API answered from live scopes."""

from __future__ import annotations

from collections import deque

import pytest
from scrapy import Request
from scrapy.core.downloader import Slot
from twisted.internet.task import Clock

from slotkit.gate import Gate
from slotkit.registry import Scope, ScopeRegistry
from slotkit.scope import ThrottlingScopeManager
from slotkit.slots import SlotsView, SlotView

TEN_DELAY = 10.0
TWO_DELAY = 2.0
ONE_DELAY = 1.0


class FixedRandom:
    def __init__(self, value: float) -> None:
        self.value = value

    def uniform(self, a: float, b: float) -> float:
        return self.value


def make_slot(
    clock: Clock | None = None,
    concurrency: int = 2,
    delay: float = 0.0,
    jitter: tuple[float, float] = (0.0, 0.0),
    *,
    opened: bool = True,
) -> tuple[SlotView, Scope, Gate, Clock]:
    clock = clock if clock is not None else Clock()
    gate = Gate(clock)
    manager = ThrottlingScopeManager(concurrency, delay, jitter, rng=FixedRandom(0.25))
    # A request long finished: the gap after a scope's first request runs from
    # its end (see test_scope); these tests are about the Slot view.
    if opened:
        manager.record_sent(-1000.0)
        manager.record_done(-1000.0)
    scope = Scope("example.com", manager)
    return SlotView(scope, gate), scope, gate, clock


def acquire(gate: Gate, scope: Scope, name: str):
    request = Request(f"https://example.com/{name}")
    return request, gate.acquire(request, [scope], [None])


# ----------------------------------------------------------------- SlotView


def test_active_transferring_and_queue():
    """active = waiting + in flight, transferring = in flight, queue = the waiting ones."""
    slot, scope, gate, _ = make_slot(concurrency=1)
    running, _ = acquire(gate, scope, "running")
    waiting, _ = acquire(gate, scope, "waiting")
    assert slot.active == {running, waiting}
    assert slot.transferring == {running}
    assert isinstance(slot.queue, deque)
    assert list(slot.queue) == [(waiting, None)]
    assert len(slot.queue) == 1


def test_active_is_live_not_a_copy():
    """slot.active is the scope's own set: len() follows the gate, as the priority queue needs."""
    slot, scope, gate, _ = make_slot()
    active = slot.active
    request, deferred = acquire(gate, scope, "a")
    assert request in active
    gate.release(deferred.result)
    assert len(active) == 0


def test_active_stays_live_across_idle_periods():
    """Once handed out, slot.active and slot.transferring follow every later request too."""
    slot, scope, gate, _ = make_slot()
    active, transferring = slot.active, slot.transferring
    for name in ("a", "b"):
        request, deferred = acquire(gate, scope, name)
        assert request in active
        assert request in transferring
        gate.release(deferred.result)
        assert len(active) == len(transferring) == 0
    assert scope.requests is active
    assert scope.in_flight is transferring


def test_delay_get_and_set_repokes_the_scope():
    """Writing slot.delay (as AutoThrottle does) changes the scope's delay and re-arms its timer."""
    slot, scope, gate, clock = make_slot(delay=TEN_DELAY)
    assert slot.delay == TEN_DELAY
    acquire(gate, scope, "first")
    _, second = acquire(gate, scope, "second")
    assert [call.getTime() for call in clock.getDelayedCalls()] == [TEN_DELAY]
    slot.delay = TWO_DELAY
    assert scope.manager.delay == TWO_DELAY
    assert slot.delay == TWO_DELAY
    assert [call.getTime() for call in clock.getDelayedCalls()] == [TWO_DELAY]
    clock.advance(TWO_DELAY)
    assert second.called
    assert clock.getDelayedCalls() == []


def test_setting_delay_to_zero_dispatches_at_once():
    """slot.delay = 0 (what scrapy-zyte-api does) lets a waiting request go immediately."""
    slot, scope, gate, _ = make_slot(delay=TEN_DELAY)
    acquire(gate, scope, "first")
    _, second = acquire(gate, scope, "second")
    slot.delay = 0
    assert second.called
    assert isinstance(slot.delay, float)


def test_concurrency_get_and_set_repokes_the_scope():
    """Raising slot.concurrency admits a waiting request at once."""
    slot, scope, gate, _ = make_slot(concurrency=1)
    acquire(gate, scope, "first")
    _, second = acquire(gate, scope, "second")
    assert slot.concurrency == 1
    slot.concurrency = 2
    assert scope.manager.concurrency == 2
    assert second.called


def test_lastseen_is_the_last_dispatch_on_stocks_clock(monkeypatch: pytest.MonkeyPatch):
    """lastseen is 0 before any dispatch, then the latest one on stock's monotonic clock.

    Plugins written for the stock Slot compute ``monotonic() - lastseen``.
    """
    import slotkit.clock

    clock = Clock()
    clock.advance(100.0)
    monotonic = [7.0]
    monkeypatch.setattr(slotkit.clock, "stock_clock", lambda: monotonic[0])
    slot, scope, gate, _ = make_slot(clock=clock, opened=False)
    assert slot.lastseen == 0.0
    acquire(gate, scope, "a")
    assert slot.lastseen == 7.0
    clock.advance(5.0)
    monotonic[0] += 5.0
    assert slot.lastseen == 7.0  # still the first dispatch, 5 s ago on both clocks
    acquire(gate, scope, "b")
    assert slot.lastseen == 12.0


def test_free_transfer_slots():
    """free_transfer_slots is the concurrency minus the requests in flight."""
    slot, scope, gate, _ = make_slot(concurrency=3)
    assert slot.free_transfer_slots() == 3
    _, deferred = acquire(gate, scope, "a")
    acquire(gate, scope, "b")
    assert slot.free_transfer_slots() == 1
    gate.release(deferred.result)
    assert slot.free_transfer_slots() == 2


def test_download_delay_draws_with_jitter():
    """download_delay() samples the delay with the scope's jitter, like Slot.download_delay()."""
    plain, *_ = make_slot(delay=TWO_DELAY)
    assert plain.download_delay() == TWO_DELAY
    jittered, *_ = make_slot(delay=TWO_DELAY, jitter=(-0.5, 0.5))
    assert jittered.download_delay() == TWO_DELAY * 1.25


def test_download_delay_of_a_duck_typed_manager_is_its_delay():
    """A manager without sample_delay reports its plain delay."""

    class Plain:
        delay = 3.0

    slot = SlotView(Scope("x", Plain()), Gate(Clock()))  # type: ignore[arg-type]
    assert slot.download_delay() == 3.0
    assert slot.delay == 3.0


def test_jitter_and_randomize_delay():
    """jitter reports the larger bound as a magnitude; randomize_delay is whether there is any."""
    slot, *_ = make_slot(jitter=(-0.1, 0.3))
    assert slot.jitter == pytest.approx(0.3)
    assert slot.randomize_delay is True
    plain, *_ = make_slot()
    assert plain.jitter == 0.0
    assert plain.randomize_delay is False


def test_key_latercall_and_repr():
    """key is the scope id, latercall the scope's pending timer, repr the scope's live repr."""
    slot, scope, gate, clock = make_slot(concurrency=4, delay=ONE_DELAY)
    assert slot.key == "example.com"
    assert slot.latercall is None
    acquire(gate, scope, "a")
    acquire(gate, scope, "b")
    assert slot.latercall is scope.timer
    assert slot.latercall.getTime() == ONE_DELAY
    assert repr(slot) == repr(scope)
    assert str(slot) == repr(scope)
    slot.close()  # a no-op kept for Scrapy's API
    clock.advance(ONE_DELAY)
    assert clock.getDelayedCalls() == []


# ----------------------------------------------------------------- SlotsView


def make_slots() -> tuple[SlotsView, ScopeRegistry, Gate]:
    clock = Clock()
    gate = Gate(clock)
    registry = ScopeRegistry(lambda scope_id: Scope(scope_id, ThrottlingScopeManager(2)), clock)
    return SlotsView(registry, gate), registry, gate


def test_slots_unknown_key_raises_key_error_and_creates_nothing():
    """slots[unknown] raises KeyError, .get() returns the default, and no scope is created."""
    slots, registry, _ = make_slots()
    with pytest.raises(KeyError):
        slots["nope.example"]
    assert slots.get("nope.example") is None
    assert "nope.example" not in registry


def test_slots_mapping_behaviour():
    """`in`, len, iteration, keys/values/items follow the live scopes."""
    slots, registry, _ = make_slots()
    assert len(slots) == 0
    assert list(slots) == []
    registry.get("a.example")
    registry.get("b.example")
    assert "a.example" in slots
    assert "c.example" not in slots
    assert 42 not in slots
    assert len(slots) == 2
    assert sorted(slots) == ["a.example", "b.example"]
    assert sorted(slots.keys()) == ["a.example", "b.example"]
    assert all(isinstance(view, SlotView) for view in slots.values())
    assert {key: view.key for key, view in slots.items()} == {
        "a.example": "a.example",
        "b.example": "b.example",
    }


def test_slots_print_like_the_stock_dict_of_slots():
    """repr(downloader.slots) (telnet, shell) lists the scopes, as the stock dict does."""
    slots, registry, _ = make_slots()
    assert repr(slots) == "{}"
    scope = registry.get("a.example")
    assert repr(slots) == f"{{'a.example': {scope!r}}}"


def test_slots_item_reads_the_live_scope():
    """slots[key] is a view of the scope: its active set and delay writes go to the scope."""
    slots, registry, gate = make_slots()
    scope = registry.get("a.example")
    request = Request("https://a.example/")
    gate.acquire(request, [scope], [None])
    assert slots["a.example"].active == {request}
    slots["a.example"].delay = 4.0
    assert scope.manager.delay == 4.0


def test_assigning_a_stock_slot_configures_the_scope():
    """``slots[key] = Slot(1, 0.6, 0)`` (older plugins, at engine start) paces the scope."""
    slots, registry, gate = make_slots()
    slots["a.example"] = Slot(1, 0.6, 0.25)
    scope = registry.get("a.example")
    assert (scope.manager.concurrency, scope.manager.delay) == (1, 0.6)
    assert scope.manager.jitter == (-0.25, 0.25)
    assert slots["a.example"].jitter == 0.25
    request = Request("https://a.example/")
    gate.acquire(request, [scope], [None])
    slots["a.example"] = Slot(3, 0.0, 0)  # a live scope is reconfigured too
    assert (scope.manager.concurrency, scope.manager.delay) == (3, 0.0)
    assert slots["a.example"].active == {request}


def test_slots_iteration_survives_changes():
    """Iterating slots while scopes are created does not raise."""
    slots, registry, _ = make_slots()
    registry.get("a.example")
    for key in slots:
        registry.get(key + ".more")
    assert len(slots) == 2
