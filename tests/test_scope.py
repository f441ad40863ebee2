"""Tests for slotkit.scope: the default scope manager's pure state machine."""

from __future__ import annotations

import math
import random

import pytest
from zope.interface.verify import verifyClass, verifyObject

from slotkit.interfaces import IThrottlingScopeManager
from slotkit.scope import OPENING_ALLOWANCE, ThrottlingScopeManager
from slotkit.settings import NO_JITTER, Jitter

ONE_DELAY = 1.0
HALF_DELAY = 0.5
HOLD = 5.0
SHORT_HOLD = 2.0
LONG_HOLD = 10.0
MAX_IDLE = 60.0


class FakeRandom:
    """An ``rng`` that answers ``uniform()`` from a script and records every call."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)
        self.calls: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.calls.append((a, b))
        return self.values.pop(0) if self.values else 0.0


def make_scope(
    concurrency: int = 1,
    delay: float = 0.0,
    jitter: Jitter = NO_JITTER,
    min_concurrency: int = 1,
    rng: FakeRandom | random.Random | None = None,
) -> ThrottlingScopeManager:
    return ThrottlingScopeManager(
        concurrency=concurrency,
        delay=delay,
        jitter=jitter,
        min_concurrency=min_concurrency,
        rng=rng if rng is not None else FakeRandom(),
    )


# ----------------------------------------------------------------- interface


def test_provides_interface():
    """The default scope manager provides every member of IThrottlingScopeManager."""
    assert verifyObject(IThrottlingScopeManager, make_scope())
    assert verifyClass(IThrottlingScopeManager, ThrottlingScopeManager)


def test_from_crawler_reads_config_dict():
    """from_crawler builds the manager from the plain config dict a ScopeConfig produces."""
    manager = ThrottlingScopeManager.from_crawler(
        None, {"concurrency": 4, "min_concurrency": 2, "delay": 1.5, "jitter": [-0.1, 0.3]}
    )
    assert verifyObject(IThrottlingScopeManager, manager)
    assert manager.concurrency == 4
    assert manager.min_concurrency == 2
    assert manager.delay == 1.5
    assert manager.jitter == (-0.1, 0.3)


def test_from_crawler_defaults():
    """A config dict with no keys gives concurrency 1, no delay and no jitter."""
    manager = ThrottlingScopeManager.from_crawler(None, {})
    assert (manager.concurrency, manager.delay, manager.jitter) == (1, 0.0, NO_JITTER)


# ----------------------------------------------------------------- concurrency


def test_fresh_scope_sends_now():
    """A scope that has sent nothing answers 0.0: send now."""
    assert make_scope().can_send(0.0, None) == 0.0


def test_full_scope_waits_forever_until_done():
    """When every slot is taken can_send is math.inf; record_done frees it at once."""
    scope = make_scope(concurrency=2)
    scope.record_sent(0.0, None)
    assert scope.can_send(0.0, None) == 0.0
    scope.record_sent(0.0, None)
    assert scope.can_send(0.0, None) == math.inf
    assert scope.can_send(1_000_000.0, None) == math.inf
    scope.record_done(3.0)
    assert scope.can_send(3.0, None) == 0.0
    assert scope.active == 1


def test_full_beats_delay():
    """A full scope answers math.inf even while its delay is running."""
    scope = make_scope(concurrency=1, delay=ONE_DELAY)
    scope.record_sent(0.0, None)
    assert scope.can_send(HALF_DELAY, None) == math.inf


def test_record_done_never_goes_negative():
    """An extra record_done leaves active at 0 instead of creating a spare slot."""
    scope = make_scope(concurrency=1)
    scope.record_done(0.0)
    assert scope.active == 0
    scope.record_sent(0.0, None)
    assert scope.can_send(0.0, None) == math.inf


def test_amount_is_ignored_without_quota():
    """This release has no quota: the amount changes neither the answer nor the state."""
    scope = make_scope(concurrency=2)
    assert scope.can_send(0.0, 1e9) == 0.0
    scope.record_sent(0.0, 1e9)
    assert scope.can_send(0.0, 1e9) == 0.0
    scope.reconcile_quota(5.0, 1.0, 0.0)
    assert scope.can_send(0.0, None) == 0.0


# ----------------------------------------------------------------- delay


def test_delay_gap_is_exact():
    """After a dispatch the next one may go exactly `delay` seconds later, not before."""
    scope = make_scope(concurrency=8, delay=ONE_DELAY)
    scope.record_sent(0.0, None)  # the scope's first request: see below
    scope.record_done(0.0)
    scope.record_sent(10.0, None)
    assert scope.can_send(10.0, None) == ONE_DELAY
    assert scope.can_send(10.25, None) == pytest.approx(0.75)
    assert scope.can_send(10.0 + ONE_DELAY, None) == 0.0
    assert scope.can_send(50.0, None) == 0.0


def test_delay_counts_from_the_last_dispatch_not_the_last_response():
    """The gap is measured between dispatches, whatever happened to the responses."""
    scope = make_scope(concurrency=8, delay=ONE_DELAY)
    scope.record_sent(-5.0, None)  # the scope's first request: see the next test
    scope.record_done(-5.0)
    scope.record_sent(0.0, None)
    scope.record_done(0.9)
    assert scope.can_send(0.9, None) == pytest.approx(0.1)


def test_the_gap_after_a_scopes_first_request_runs_from_its_end():
    """The first request also resolves the host and opens the connection, so it
    reaches the server late: the next gap counts from its end, once per scope."""
    scope = make_scope(concurrency=8, delay=ONE_DELAY)
    scope.record_sent(0.0, None)
    scope.record_done(0.3)
    assert scope.can_send(0.3, None) == pytest.approx(ONE_DELAY)
    scope.record_sent(1.3, None)
    scope.record_done(1.8)
    assert scope.can_send(1.8, None) == pytest.approx(0.5)  # from the dispatch again


def test_a_slow_first_request_holds_the_second_until_it_ends():
    """Acceptance probe: with a response slower than the delay, the second request
    went a delay after the first's send and reached the server 4-7 ms short of
    the delay after it (the first also opened the connection). It waits for the
    first's end now, then the delay, as documented."""
    scope = make_scope(concurrency=8, delay=0.3)
    scope.record_sent(0.0, None)
    # Still in flight: its end is not known; asked again a second past the delay.
    assert scope.can_send(0.3, None) == pytest.approx(OPENING_ALLOWANCE)
    scope.record_done(0.4)
    assert scope.can_send(0.4, None) == pytest.approx(0.3)
    scope.record_sent(0.7, None)
    assert scope.can_send(0.7, None) == pytest.approx(0.3)  # from dispatches again
    scope.record_sent(1.0, None)  # both in flight: the gap no longer waits for ends
    assert scope.can_send(1.0, None) == pytest.approx(0.3)


def test_a_first_request_that_hangs_holds_its_scope_a_second_past_the_delay():
    """Not until its DOWNLOAD_TIMEOUT: its connection is long open by then."""
    scope = make_scope(concurrency=8, delay=0.3)
    scope.record_sent(0.0, None)
    assert scope.can_send(0.0, None) == pytest.approx(0.3)  # the gap from its send first
    assert scope.can_send(1.0, None) == pytest.approx(0.3 + OPENING_ALLOWANCE - 1.0)
    assert scope.can_send(0.3 + OPENING_ALLOWANCE, None) == 0.0


def test_without_a_delay_the_first_request_holds_nothing():
    """Only a delay has a gap to protect: concurrency alone sends in parallel at once."""
    scope = make_scope(concurrency=8, delay=0.0)
    scope.record_sent(0.0, None)
    assert scope.can_send(0.0, None) == 0.0


def test_first_dispatch_has_no_delay():
    """A delay only separates two dispatches: the first one goes at once."""
    scope = make_scope(delay=LONG_HOLD)
    assert scope.can_send(0.0, None) == 0.0


def test_set_base_delay_applies_to_the_running_gap():
    """Changing the delay at run time moves the end of the current gap."""
    scope = make_scope(concurrency=8, delay=ONE_DELAY)
    scope.record_sent(0.0, None)
    scope.record_done(0.0)  # a first request that ended at once (see above)
    scope.set_base_delay(3.0)
    assert scope.delay == 3.0
    assert scope.can_send(1.0, None) == 2.0
    scope.set_base_delay(0.0)
    assert scope.can_send(0.0, None) == 0.0


def test_set_base_delay_floors_at_zero():
    """A negative delay written at run time becomes no delay rather than a negative gap."""
    scope = make_scope(delay=ONE_DELAY)
    scope.set_base_delay(-5)
    assert scope.delay == 0.0


# ----------------------------------------------------------------- jitter


def test_jitter_factor_drawn_once_per_dispatch():
    """The jitter factor is drawn at record_sent, so repeated can_send calls agree."""
    rng = FakeRandom(0.25, -0.5)
    scope = make_scope(concurrency=8, delay=ONE_DELAY, jitter=(-0.5, 0.5), rng=rng)
    scope.record_sent(0.0, None)
    scope.record_done(0.0)  # a first request that ended at once (see above)
    assert rng.calls == [(-0.5, 0.5)]
    answers = {scope.can_send(0.0, None) for _ in range(10)}
    assert answers == {1.25}
    assert len(rng.calls) == 1
    scope.record_sent(1.25, None)
    assert len(rng.calls) == 2
    assert scope.can_send(1.25, None) == 0.5


def test_jitter_gap_is_a_float_within_bounds():
    """With a seeded rng every gap lies in [delay*(1+low), delay*(1+high)] and they vary."""
    low, high = -0.1, 0.3
    scope = make_scope(concurrency=1, delay=ONE_DELAY, jitter=(low, high), rng=random.Random(7))
    now = 0.0
    gaps = []
    for _ in range(200):
        scope.record_sent(now, None)
        scope.record_done(now)
        gap = scope.can_send(now, None)
        assert isinstance(gap, float)
        assert ONE_DELAY * (1 + low) <= gap <= ONE_DELAY * (1 + high)
        gaps.append(gap)
        now += gap
    assert len(set(gaps)) > 100  # really random, not a constant
    assert min(gaps) < ONE_DELAY < max(gaps)


def test_no_jitter_draws_nothing():
    """Without jitter the rng is never consulted and the gap is the delay itself."""
    rng = FakeRandom()
    scope = make_scope(concurrency=8, delay=ONE_DELAY, rng=rng)
    scope.record_sent(0.0, None)
    scope.record_done(0.0)  # a first request that ended at once (see above)
    assert scope.can_send(0.0, None) == ONE_DELAY
    assert rng.calls == []


def test_jitter_never_makes_a_negative_gap():
    """A factor below zero is floored: the gap is 0, never negative."""
    scope = make_scope(delay=ONE_DELAY, jitter=(-3.0, -2.0), rng=FakeRandom(-2.5))
    scope.record_sent(0.0, None)
    scope.record_done(0.0)
    assert scope.can_send(0.0, None) == 0.0


def test_sample_delay_uses_jitter():
    """sample_delay (Slot.download_delay) draws a fresh jittered delay each call."""
    rng = FakeRandom(0.5, -0.5)
    scope = make_scope(delay=2.0, jitter=(-0.5, 0.5), rng=rng)
    assert scope.sample_delay() == 3.0
    assert scope.sample_delay() == 1.0


# ----------------------------------------------------------------- hold (record_backoff)


def test_hold_blocks_until_deadline():
    """record_backoff(delay=x) forbids dispatches until now + x."""
    scope = make_scope(concurrency=8)
    scope.record_backoff(HOLD, 1.0)
    assert scope.can_send(1.0, None) == HOLD
    assert scope.can_send(4.0, None) == 2.0
    assert scope.can_send(1.0 + HOLD, None) == 0.0


def test_hold_is_never_shortened():
    """A later, shorter hold leaves the earlier deadline in place; a longer one extends it."""
    scope = make_scope(concurrency=8)
    scope.record_backoff(HOLD, 0.0)
    scope.record_backoff(SHORT_HOLD, 1.0)
    assert scope.hold_until == HOLD
    scope.record_backoff(LONG_HOLD, 1.0)
    assert scope.hold_until == 11.0
    assert scope.can_send(6.0, None) == 5.0


def test_hold_ignores_zero_and_negative_delays():
    """A hold of 0 or a negative hold sets no deadline; a bare trigger (None) is no hold either."""
    scope = make_scope(concurrency=8, delay=ONE_DELAY)
    scope.record_backoff(0.0, 0.0)
    scope.record_backoff(-3.0, 0.0)
    assert scope.hold_until == -math.inf
    assert scope.can_send(0.0, None) == 0.0
    scope.record_backoff(None, 0.0)
    assert scope.hold_until == -math.inf


def test_hold_and_delay_combine_as_the_later_deadline():
    """The next dispatch waits for whichever ends later, the delay gap or the hold."""
    scope = make_scope(concurrency=8, delay=3.0)
    scope.record_sent(0.0, None)
    scope.record_done(0.0)  # a first request that ended at once (see above)
    scope.record_backoff(1.0, 0.0)
    assert scope.can_send(0.0, None) == 3.0
    scope.record_backoff(LONG_HOLD, 0.0)
    assert scope.can_send(0.0, None) == LONG_HOLD


def test_full_scope_during_hold_is_inf():
    """A full scope answers math.inf even while held: only record_done can help first."""
    scope = make_scope(concurrency=1)
    scope.record_sent(0.0, None)
    scope.record_backoff(HOLD, 0.0)
    assert scope.can_send(0.0, None) == math.inf
    scope.record_done(1.0)
    assert scope.can_send(1.0, None) == HOLD - 1.0


# ----------------------------------------------------------------- concurrency at run time


def test_set_concurrency_raises_and_lowers_the_limit():
    """Raising the limit frees a slot at once; lowering it below active blocks until some finish."""
    scope = make_scope(concurrency=2)
    scope.record_sent(0.0, None)
    scope.record_sent(0.0, None)
    scope.set_concurrency(3)
    assert scope.can_send(0.0, None) == 0.0
    scope.set_concurrency(1)
    assert scope.can_send(0.0, None) == math.inf
    scope.record_done(0.0)
    assert scope.can_send(0.0, None) == math.inf
    scope.record_done(0.0)
    assert scope.can_send(0.0, None) == 0.0


def test_min_concurrency_floors_set_concurrency():
    """set_concurrency never drops below min_concurrency (nor below 1)."""
    scope = make_scope(concurrency=4, min_concurrency=2)
    scope.set_concurrency(1)
    assert scope.concurrency == 2
    scope.set_concurrency(0)
    assert scope.concurrency == 2
    unfloored = make_scope(concurrency=4)
    unfloored.set_concurrency(0)
    assert unfloored.concurrency == 1


def test_constructor_lifts_concurrency_to_min_concurrency():
    """A concurrency below min_concurrency is lifted to the floor; a floor below 1 becomes 1."""
    assert make_scope(concurrency=1, min_concurrency=3).concurrency == 3
    scope = make_scope(concurrency=0, min_concurrency=0)
    assert (scope.min_concurrency, scope.concurrency) == (1, 1)


# ----------------------------------------------------------------- idleness


def test_fresh_scope_is_idle():
    """A scope that never sent anything may be forgotten, whatever max_idle is."""
    assert make_scope().is_idle(0.0, MAX_IDLE)


def test_scope_with_requests_in_flight_is_not_idle():
    """A request in flight keeps the scope alive however long it takes."""
    scope = make_scope()
    scope.record_sent(0.0, None)
    assert not scope.is_idle(10 * MAX_IDLE, MAX_IDLE)
    assert not scope.is_idle(10 * MAX_IDLE, 0.0)


def test_scope_is_idle_max_idle_after_its_last_activity():
    """Idle means nothing sent or finished for at least max_idle seconds."""
    scope = make_scope(concurrency=2)
    scope.record_sent(0.0, None)
    scope.record_done(10.0)
    assert not scope.is_idle(10.0 + MAX_IDLE - 0.001, MAX_IDLE)
    assert scope.is_idle(10.0 + MAX_IDLE, MAX_IDLE)
    assert scope.is_idle(10.0, 0.0)


def test_running_delay_or_hold_is_not_idle():
    """A scope whose delay gap or hold is still running keeps its state, even with max_idle 0."""
    delayed = make_scope(delay=LONG_HOLD)
    delayed.record_sent(0.0, None)
    delayed.record_done(0.0)
    assert not delayed.is_idle(1.0, 0.0)
    assert delayed.is_idle(LONG_HOLD, 0.0)
    held = make_scope()
    held.record_backoff(LONG_HOLD, 0.0)
    assert not held.is_idle(1.0, 0.0)
    assert held.is_idle(LONG_HOLD, 0.0)


# ----------------------------------------------------------------- repr


def test_repr_shows_live_state():
    """repr shows the active count against the limit, the delay and the hold."""
    scope = make_scope(concurrency=4, delay=1.5)
    assert "active=0/4" in repr(scope)
    assert "delay=1.50s" in repr(scope)
    scope.record_sent(0.0, None)
    scope.record_sent(0.0, None)
    scope.set_base_delay(2.25)
    scope.record_backoff(HOLD, 1.0)
    text = repr(scope)
    assert text.startswith("<ThrottlingScopeManager ")
    assert "active=2/4" in text
    assert "delay=2.25s" in text
    assert "hold_until=6.00" in text


def _reference_is_idle(manager: ThrottlingScopeManager, now: float, max_idle: float) -> bool:
    """is_idle as first written, through the public properties (its fast path must agree)."""
    manager._settle(now)
    if manager.active or manager.backoff_delay is not None or now < manager.next_allowed:
        return False
    if manager.quota is not None and manager.quota.used(now) > 0:
        return False
    last = max(manager.last_sent or -math.inf, manager.last_done or -math.inf)
    return now - last >= max_idle


def _scenario(kind: str) -> ThrottlingScopeManager:
    """A manager in one of several states, built the same way each call."""
    from slotkit.rampup import RampupConfig

    rampup = RampupConfig(target=(1, 1), delay_factor=0.5, min_delay=0.0, window=5.0)
    manager = ThrottlingScopeManager(
        concurrency=2,
        delay=1.0,
        jitter=(-0.5, 0.5),
        rng=random.Random(7),
        quota=3.0 if kind == "quota" else None,
        window=10.0,
        rampup=rampup if kind == "rampup" else None,
    )
    if kind == "fresh":
        return manager
    manager.record_sent(1.0)
    if kind != "in_flight":
        manager.record_done(1.5)
    if kind == "backoff":
        manager.record_backoff(None, 2.0)
    elif kind == "hold":
        manager.record_backoff(30.0, 2.0)
    return manager


@pytest.mark.parametrize(
    "kind", ["fresh", "sent", "in_flight", "backoff", "hold", "quota", "rampup"]
)
def test_is_idle_agrees_with_its_reference(kind: str):
    """The shortcut is_idle gives the same answer as the plain formula, at any time."""
    for now in [0.0, 1.0, 1.2, 1.5, 1.9, 2.5, 3.0, 11.0, 40.0, 100.0, 500.0, 5000.0]:
        for max_idle in (0.0, 10.0, 3600.0):
            fast, slow = _scenario(kind), _scenario(kind)
            assert fast.is_idle(now, max_idle) == _reference_is_idle(slow, now, max_idle), (
                kind,
                now,
                max_idle,
            )
