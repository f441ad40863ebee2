"""Rampup steps and quota windows, pinned on explicit times."""

from __future__ import annotations

import math
import random

import pytest
from scrapy.settings import Settings

from slotkit.backoff import BackoffRules
from slotkit.quota import Quota
from slotkit.rampup import RampupConfig
from slotkit.scope import ThrottlingScopeManager
from slotkit.settings import SettingsError, ThrottlingSettings

WINDOW = 10.0
QUIET = BackoffRules(jitter=(0.0, 0.0), window=WINDOW, min_delay=0.1, max_delay=10.0)


def rampup_scope(
    delay: float = 1.0,
    concurrency: int = 4,
    min_concurrency: int = 1,
    target: tuple[int, int] = (1, 1),
    min_delay: float = 0.25,
    window: float = WINDOW,
) -> ThrottlingScopeManager:
    return ThrottlingScopeManager(
        concurrency=concurrency,
        delay=delay,
        min_concurrency=min_concurrency,
        backoff=BackoffRules(jitter=(0.0, 0.0), window=window, min_delay=0.1, max_delay=10.0),
        rampup=RampupConfig(target=target, delay_factor=0.5, min_delay=min_delay, window=window),
    )


def send(scope: ThrottlingScopeManager, now: float) -> None:
    scope.record_sent(now)
    scope.record_done(now)


def test_rampup_starts_at_the_concurrency_floor() -> None:
    """Rampup probes upwards from min_concurrency."""
    assert rampup_scope(min_concurrency=2).concurrency == 2


def test_quiet_window_lowers_the_delay_first() -> None:
    """A window with no trigger halves the delay."""
    scope = rampup_scope()
    send(scope, 0.0)
    scope.can_send(WINDOW)
    assert scope.delay == 0.5
    send(scope, WINDOW + 1)
    scope.can_send(2 * WINDOW + 1)
    assert scope.delay == 0.25


def test_at_min_delay_concurrency_rises() -> None:
    """Once the delay is at its minimum, each quiet window adds one concurrency."""
    scope = rampup_scope(delay=0.25)
    send(scope, 0.0)
    scope.can_send(WINDOW)
    assert (scope.delay, scope.concurrency) == (0.25, 2)


def test_concurrency_never_passes_the_configured_maximum() -> None:
    """Rampup stops at the configured concurrency."""
    scope = rampup_scope(delay=0.25, concurrency=2)
    for window in range(5):
        send(scope, window * WINDOW + 1)
    scope.can_send(6 * WINDOW)
    assert scope.concurrency == 2


def test_window_at_target_holds() -> None:
    """A window with as many triggers as the target holds the rate."""
    scope = rampup_scope(target=(1, 1))
    send(scope, 0.0)
    scope.record_backoff(0.001, now=1.0)  # a hint: counts as a trigger, no step
    scope.can_send(WINDOW)
    assert scope.delay == 1.0


def test_target_range_holds_inside_it() -> None:
    """A [low, high] target holds for any trigger count inside the range."""
    scope = rampup_scope(target=(1, 3))
    send(scope, 0.0)
    for t in (1.0, 2.0):
        scope.record_backoff(0.001, now=t)
    scope.can_send(WINDOW)
    assert scope.delay == 1.0


def test_a_target_of_zero_steps_up_after_clean_windows_and_backs_off_at_once() -> None:
    """Target 0: aim for no rate-limit response. Taken literally, no window could step up."""
    scope = rampup_scope(target=(0, 0))
    send(scope, 0.0)
    scope.can_send(WINDOW)
    assert scope.delay == 0.5  # a window with no trigger stepped up
    scope.record_backoff(None, now=WINDOW + 1)
    assert scope.backoff_delay is not None  # and the first trigger backs off


def test_no_step_during_backoff() -> None:
    """While a backoff is active, quiet windows do not ramp up."""
    scope = rampup_scope(window=WINDOW)
    send(scope, 0.0)
    scope.record_backoff(None, now=0.4)  # at the target (1): holds, no step
    scope.record_backoff(None, now=0.5)  # beyond it: backoff 2.0, recovers at 10.5
    send(scope, 5.0)
    scope.can_send(WINDOW + 0.1)  # window [0, 10) had a trigger: hold; still backing off
    assert scope.delay == 1.0
    assert scope.backoff_delay == 2.0


def test_triggers_within_the_target_do_not_back_off() -> None:
    """Up to the target's high end a window's triggers hold the rate; the next one backs off."""
    scope = rampup_scope(target=(1, 3))
    send(scope, 0.0)
    for t in (1.0, 2.0, 3.0):
        scope.record_backoff(None, now=t)
        assert scope.backoff_delay is None
        assert scope.current_delay == 1.0
    scope.record_backoff(None, now=4.0)
    assert scope.backoff_delay == 2.0


def test_a_step_beyond_the_target_first_takes_back_raised_concurrency() -> None:
    """Backoff undoes rampup's concurrency one at a time, down to the floor, before the delay.

    A site limiting concurrent requests answers each extra one at once; a
    longer delay alone would let the extra requests go on failing.
    """
    scope = rampup_scope(delay=0.25, min_concurrency=1)
    for window in range(2):  # two quiet windows at the minimum delay: concurrency 3
        send(scope, window * WINDOW + 1.5)
    scope.can_send(2 * WINDOW + 2.0)
    assert scope.concurrency == 3
    scope.record_backoff(None, now=2 * WINDOW + 2.1)  # at the target (1): holds
    assert scope.concurrency == 3
    scope.record_backoff(None, now=2 * WINDOW + 2.2)
    assert (scope.concurrency, scope.backoff_delay) == (2, None)
    scope.record_backoff(None, now=2 * WINDOW + 2.3)
    assert (scope.concurrency, scope.backoff_delay) == (1, None)
    scope.record_backoff(None, now=2 * WINDOW + 2.4)  # at the floor: now the delay
    assert scope.concurrency == 1
    assert scope.backoff_delay == 0.5


def test_each_window_gets_its_own_target() -> None:
    """The count starts again in the next window: one trigger there holds again."""
    scope = rampup_scope(target=(1, 1))
    send(scope, 0.0)
    scope.record_backoff(None, now=1.0)
    send(scope, WINDOW + 1.0)
    scope.record_backoff(None, now=WINDOW + 2.0)
    assert scope.backoff_delay is None


def test_idle_window_teaches_nothing() -> None:
    """A window in which nothing was sent does not ramp up."""
    scope = rampup_scope()
    send(scope, 0.0)
    scope.can_send(5 * WINDOW)  # one active window then idle ones: one step only
    assert scope.delay == 0.5


def test_window_zero_disables_rampup() -> None:
    """BACKOFF_WINDOW = 0 disables rampup: the scope runs at its configured rate.

    An acceptance probe: it stayed at rampup's starting floor of 1 for good
    (1 in flight of 8 configured, 16 requests in 4.9 s instead of 0.6 s)."""
    scope = rampup_scope(window=0.0)
    assert scope.rampup is None
    send(scope, 0.0)
    scope.can_send(1000.0)
    assert (scope.delay, scope.concurrency) == (1.0, 4)


def test_backoff_window_zero_builds_a_scope_without_rampup() -> None:
    """Through the settings, as a crawl builds it: BACKOFF_WINDOW = 0 means no rampup."""
    from slotkit.settings import DOMAIN

    settings = ThrottlingSettings.from_settings(
        Settings({"BACKOFF_WINDOW": 0, "THROTTLING_SCOPES": {"a.test": {"rampup": True}}})
    )
    config = settings.scope_config("a.test", DOMAIN).as_dict()
    scope = ThrottlingScopeManager.from_crawler(None, config)  # type: ignore[arg-type]
    assert scope.rampup is None
    assert scope.concurrency == 8


def test_rampup_never_goes_faster_than_its_min_delay() -> None:
    """An acceptance probe: "min_delay": 0.1 with DOWNLOAD_DELAY's 0 ran at up to
    185 requests a second; the delay stayed 0 while the concurrency climbed."""
    scope = rampup_scope(delay=0.0, min_delay=0.1)
    assert scope.delay == 0.1
    for window in range(5):
        send(scope, window * WINDOW)
        scope.can_send((window + 1) * WINDOW)
    assert (scope.delay, scope.concurrency) == (0.1, 4)


def test_set_concurrency_of_a_rampup_scope_sets_its_ceiling() -> None:
    """robots.txt's concurrency of 1 (or a slot's concurrency written by an
    extension) is where rampup may climb to, not where it jumps."""
    scope = rampup_scope(delay=0.25, concurrency=8)
    scope.set_concurrency(4)
    assert (scope.concurrency, scope.max_concurrency) == (1, 4)
    for window in range(6):
        send(scope, window * WINDOW)
        scope.can_send((window + 1) * WINDOW)
    assert scope.concurrency == 4
    scope.set_concurrency(1)
    assert (scope.concurrency, scope.max_concurrency) == (1, 1)


def test_a_learnt_crawl_delay_is_a_floor_for_rampup() -> None:
    """An acceptance probe: rampup took a robots.txt Crawl-delay of 0.5 s down to 0 in
    six windows (shortest gap 4 ms), without a word."""
    scope = rampup_scope(delay=0.0, min_delay=0.0)
    scope.set_base_delay(0.5)
    scope.set_rampup_min_delay(0.5)
    for window in range(5):
        send(scope, window * WINDOW)
        scope.can_send((window + 1) * WINDOW)
    assert scope.delay == 0.5
    scope.set_rampup_min_delay(0.2)  # a smaller floor never lowers a larger one
    assert scope.rampup is not None
    assert scope.rampup.config.min_delay == 0.5


def test_a_shorter_crawl_delay_keeps_the_users_rampup_min_delay() -> None:
    """A review: robots.txt sets the Crawl-delay as the base delay first (0.2 s),
    then its floor; the user's higher min_delay (0.5 s) must stay the pace."""
    scope = rampup_scope(delay=0.0, min_delay=0.5)
    scope.set_base_delay(0.2)
    scope.set_rampup_min_delay(0.2)
    assert scope.delay == 0.5


def test_min_concurrency_floors_set_concurrency() -> None:
    """set_concurrency never goes below min_concurrency."""
    scope = ThrottlingScopeManager(concurrency=8, min_concurrency=3)
    scope.set_concurrency(1)
    assert scope.concurrency == 3


def test_rampup_settings_are_validated() -> None:
    """Rampup dicts are checked key by key, with suggestions."""
    with pytest.raises(SettingsError, match="did you mean 'backoff_target'"):
        ThrottlingSettings.from_settings(
            Settings({"THROTTLING_SCOPES": {"api": {"rampup": {"backof_target": 1}}}})
        )
    with pytest.raises(SettingsError, match="between 0 and 1"):
        ThrottlingSettings.from_settings(
            Settings({"THROTTLING_SCOPES": {"api": {"rampup": {"delay_factor": 2}}}})
        )
    config = ThrottlingSettings.from_settings(
        Settings({"RAMPUP_BACKOFF_TARGET": [1, 3], "THROTTLING_SCOPES": {"api": {"rampup": True}}})
    ).scope_config("api", "custom")
    assert config.rampup is not None
    assert config.rampup.target == (1, 3)


# Quotas


def test_quota_blocks_until_the_oldest_units_expire() -> None:
    """Over quota, the wait ends when enough of the window's spend expires."""
    quota = Quota(limit=3, window=WINDOW)
    for t in (0.0, 1.0, 2.0):
        quota.spend(t, 1.0)
    assert quota.wait(2.5, 1.0) == pytest.approx(WINDOW - 2.5)
    assert quota.wait(WINDOW, 1.0) == 0.0


def test_quota_never_exceeds_limit_in_any_window() -> None:
    """Sending whenever allowed never puts more than the quota in any window."""
    quota = Quota(limit=5, window=WINDOW)
    now, sent = 0.0, []
    while now < 5 * WINDOW:
        wait = quota.wait(now, 1.0)
        now += wait
        quota.spend(now, 1.0)
        sent.append(now)
    for start in sent:
        assert sum(1 for t in sent if start <= t < start + WINDOW) <= 5
    assert len(sent) >= 5 * 5


def test_oversized_request_goes_alone() -> None:
    """A request larger than the whole quota is sent once the window is empty."""
    quota = Quota(limit=3, window=WINDOW)
    assert quota.wait(0.0, 10.0) == 0.0
    quota.spend(0.0, 10.0)
    assert quota.wait(1.0, 1.0) == pytest.approx(WINDOW - 1.0)


def test_oversized_request_waits_for_units_whose_sum_rounds_differently() -> None:
    """Acceptance probe: the running count (1.0) and the sum of the units counted
    (0.9999999999999999) differed by rounding, and a request larger than the
    whole quota went while every unit was still counted (53.4 units in a window
    of 20). It waits until the last of them expires."""
    quota = Quota(limit=1.0, window=WINDOW)
    amounts = (0.1, 0.2, 0.7)
    for index, amount in enumerate(amounts):
        quota.start(index * 0.01, amount)
    for ended, index in enumerate((1, 2, 0)):
        quota.finish(1.0 + ended * 0.01, index * 0.01, amounts[index])
    assert quota.wait(1.1, 5.0) == pytest.approx(1.02 + WINDOW - 1.1)


def test_scope_quota_uses_request_amounts() -> None:
    """can_send and record_sent take the request's amount."""
    scope = ThrottlingScopeManager(concurrency=10, quota=10.0, window=WINDOW)
    assert scope.can_send(0.0, 6.0) == 0.0
    scope.record_sent(0.0, 6.0)
    assert scope.can_send(0.0, 4.0) == 0.0
    # In flight, the 6 units have no expiry yet: only the request's end can tell.
    assert scope.can_send(0.0, 5.0) == math.inf
    scope.record_done(2.0)
    assert scope.can_send(2.0, 5.0) == pytest.approx(WINDOW)


def test_units_count_until_a_window_after_their_request_ended() -> None:
    """A server counts a request on arrival, between dispatch and response: the
    unit stays counted a whole window after the response, so no window at the
    server holds more than the quota however slow the request was to arrive."""
    scope = ThrottlingScopeManager(concurrency=10, quota=6.0, window=WINDOW)
    scope.record_sent(0.0, 5.0)  # slow (say, it opens the connection)
    scope.record_sent(1.0, 1.0)
    # The later, cheaper request ends first: its own unit starts to expire.
    scope.record_ending(sent_at=1.0, amount=1.0)
    scope.record_done(2.0)
    assert scope.can_send(2.0, 1.0) == pytest.approx(WINDOW)  # when that unit expires
    assert scope.can_send(2.0, 2.0) == math.inf  # the 5 units are still in flight
    scope.record_ending(sent_at=0.0, amount=5.0)
    scope.record_done(3.0)
    assert scope.can_send(3.0, 1.0) == pytest.approx(WINDOW - 1.0)
    assert scope.can_send(3.0, 2.0) == pytest.approx(WINDOW)


def test_reconcile_consumed_and_remaining() -> None:
    """consumed adjusts the count; the server's remaining replaces it."""
    scope = ThrottlingScopeManager(concurrency=10, quota=10.0, window=WINDOW)
    scope.record_sent(0.0, 2.0)
    scope.reconcile_quota(consumed=3.0, now=0.0)
    assert scope.quota is not None
    assert scope.quota.used(0.0) == 5.0
    scope.reconcile_quota(remaining=1.0, now=0.0)
    assert scope.quota.used(0.0) == 9.0
    scope.reconcile_quota(consumed=-4.0, now=0.0)
    assert scope.quota.used(0.0) == 5.0


def test_a_refund_gives_back_no_more_than_is_counted() -> None:
    """A review: consumed = -100 took the count to -95, and a count below zero
    admitted any amount, ten requests of 10 units against a quota of 10."""
    scope = ThrottlingScopeManager(concurrency=10, quota=10.0, window=WINDOW)
    scope.record_sent(0.0, 5.0)
    scope.reconcile_quota(consumed=-100.0, now=0.0)
    assert scope.quota is not None
    assert scope.quota.used(0.0) == 0.0
    scope.record_sent(0.0, 10.0)
    assert scope.can_send(0.0, 10.0) == math.inf  # the quota is spent until it ends


def test_a_refund_expires_with_the_units_it_gave_back() -> None:
    """A review: a refund counted as a negative entry expiring a window after it,
    so once the units it cancelled expired the count went below zero again, and
    20 units went at once against a limit of 10."""
    quota = Quota(limit=10.0, window=60.0)
    for _ in range(10):
        quota.start(0.0, 1.0)
        quota.finish(0.0, 0.0, 1.0)  # ten units, expiring at t=60
    quota.reconcile(30.0, consumed=-100.0, remaining=None)
    assert quota.used(30.0) == 0.0
    admitted = 0
    while quota.wait(61.0, 1.0) == 0.0 and admitted < 100:
        quota.start(61.0, 1.0)
        admitted += 1
    assert admitted == 10


@pytest.mark.parametrize("seed", range(20))
def test_refunds_never_take_the_count_below_zero(seed: int) -> None:
    """Starts, ends, charges and refunds in any order: the count stays >= 0."""
    rng = random.Random(seed)
    quota, now, flying = Quota(limit=10.0, window=5.0), 0.0, []
    for _ in range(300):
        now += rng.choice([0.0, 0.5, 2.0, 6.0])
        action = rng.random()
        if action < 0.35:
            amount = rng.choice([1.0, 2.5])
            quota.start(now, amount)
            flying.append((now, amount))
        elif action < 0.6 and flying:
            sent_at, amount = flying.pop(rng.randrange(len(flying)))
            quota.finish(now, sent_at, amount)
        else:
            quota.reconcile(now, consumed=rng.choice([-100.0, -3.0, -1.0, 2.0]), remaining=None)
        quota.wait(now, 1.0)  # expires what is due
        assert quota._used >= -1e-9


def test_a_spent_server_quota_expires_at_its_reset_after_older_units() -> None:
    """Units the server reports spent, held by its 2 s reset, come back at the
    reset even when units of requests that ended earlier expire a window later."""
    scope = ThrottlingScopeManager(concurrency=10, quota=10.0, window=WINDOW)
    for sent in (0.0, 1.0):
        send(scope, sent)
    scope.record_quota_reset(2.0, now=1.0)  # what the feedback says first
    scope.reconcile_quota(remaining=0.0, now=1.0)
    assert scope.can_send(1.0) == pytest.approx(2.0)
    assert scope.can_send(3.0) == 0.0


def test_a_spent_server_quota_lasts_until_its_reset_beyond_max_delay() -> None:
    """A review: tied to the hold, which max_delay caps (300 s), an hourly quota
    reported spent with a 2,400 s reset reopened after 300 s, into more 429s."""
    scope = ThrottlingScopeManager(concurrency=10, quota=5000.0, window=3600.0)
    send(scope, 0.0)
    scope.record_backoff(300.0, now=1.0)  # the capped hold
    scope.record_quota_reset(2400.0, now=1.0)
    scope.reconcile_quota(remaining=0.0, now=1.0)
    assert scope.can_send(302.0) == pytest.approx(2401.0 - 302.0)


def test_a_spent_server_quota_without_a_reset_lasts_a_window_whatever_holds() -> None:
    """A review: a report without a reset, landing during an unrelated hold (a
    Retry-After, delay_scope), took the hold's end for the server's reset."""
    scope = ThrottlingScopeManager(concurrency=10, quota=10.0, window=WINDOW)
    send(scope, 0.0)
    scope.record_backoff(2.0, now=1.0)
    scope.reconcile_quota(remaining=0.0, now=1.0)
    assert scope.can_send(3.5) == pytest.approx(WINDOW - 3.5)  # the local unit, sent at 0


def test_scope_with_quota_spent_is_not_idle() -> None:
    """A scope is kept while its window still counts spent quota."""
    scope = ThrottlingScopeManager(concurrency=10, quota=10.0, window=WINDOW)
    send(scope, 0.0)
    assert not scope.is_idle(1.0, 0.0)
    assert scope.is_idle(WINDOW + 1.0, 0.0)


def test_bad_quota_is_refused() -> None:
    """quota and window must be positive numbers."""
    for entry in ({"quota": 0}, {"quota": "lots"}, {"window": -1}):
        with pytest.raises(SettingsError, match="THROTTLING_SCOPES\\['api'\\]"):
            ThrottlingSettings.from_settings(Settings({"THROTTLING_SCOPES": {"api": entry}}))
    with pytest.raises(SettingsError, match="THROTTLING_WINDOW"):
        ThrottlingSettings.from_settings(Settings({"THROTTLING_WINDOW": 0}))


def test_delay_reaches_a_zero_minimum_then_concurrency_rises() -> None:
    """Halving never gets to 0: within 10 ms of the minimum counts as there.

    An acceptance probe found a scope starting at a 0.4 s delay (rampup's
    default minimum is 0) halving its delay for ever at concurrency 1.
    """
    scope = rampup_scope(delay=0.4, min_delay=0.0)
    now = 0.0
    delays = []
    while scope.concurrency == 1 and now < 100 * WINDOW:
        send(scope, now)
        now += WINDOW
        scope.can_send(now)
        delays.append(scope.delay)
    assert delays == [0.2, 0.1, 0.05, 0.025, 0.0125, 0.0, 0.0]
    assert scope.concurrency == 2


def test_quota_available_is_what_is_left_of_the_quota() -> None:
    """The default manager tells schedulers how much of its quota is left."""
    manager = ThrottlingScopeManager(concurrency=10, quota=10.0, window=60.0)
    assert manager.quota_available(0.0) == 10.0
    manager.record_sent(0.0, 3.0)
    assert manager.quota_available(1.0) == 7.0
    assert ThrottlingScopeManager(concurrency=10).quota_available(0.0) is None


def _simulate_rampup(
    settings: dict[str, object], seconds: float = 80.0, hint: float | None = None
) -> tuple[float, float]:
    """A rampup scope against a server allowing 10 requests a second (token bucket,
    burst 2, 50 ms answers), on virtual time, with the gate's burst rule (a response
    to a request sent before the last step is not a new trigger). Returns the 200s
    per second and the 429s per window over the second half. With *hint*, each 429
    says ``Retry-After: hint``."""
    import heapq
    import random
    from unittest import mock

    from slotkit.settings import DOMAIN

    config = ThrottlingSettings.from_settings(Settings(settings)).scope_config("api.test", DOMAIN)
    # The manager draws its jitter from slotkit's own generator, not random's.
    with mock.patch("slotkit.scope.SHARED_RNG", random.Random(7)):
        scope = ThrottlingScopeManager.from_crawler(None, config.as_dict())  # type: ignore[arg-type]
    rate, burst, latency, window = 10.0, 2.0, 0.05, config.backoff.window
    now, tokens, refilled, step_started = 0.0, burst, 0.0, -math.inf
    pending: list[tuple[float, float, int]] = []  # (answered at, sent at, status)
    answered: list[tuple[float, int]] = []
    while now < seconds:
        while pending and pending[0][0] <= now:
            at, sent, status = heapq.heappop(pending)
            if status == 429 and sent >= step_started:
                scope.record_backoff(hint, at)
                step_started = at
            scope.record_done(at)
            answered.append((at, status))
        wait = scope.can_send(now)
        if wait <= 0:
            tokens = min(burst, tokens + (now - refilled) * rate)
            refilled = now
            status = 200 if tokens >= 1.0 else 429
            tokens -= status == 200
            scope.record_sent(now)
            heapq.heappush(pending, (now + latency, now, status))
            continue
        now = min(pending[0][0] if pending else math.inf, now + wait)
    half = [(at, status) for at, status in answered if at >= seconds / 2]
    ok = sum(status == 200 for _, status in half) / (seconds / 2)
    limited = sum(status == 429 for _, status in half) / ((seconds / 2) / window)
    return ok, limited


def test_rampup_alone_finds_the_rate_a_server_allows() -> None:
    """A polite-crawler probe: "rampup": True with everything else default reached 2.3
    of 10 requests a second allowed: a trigger beyond the target dropped the scope to
    BACKOFF_MIN_DELAY's 1 s and one quiet window took it back to full speed. A rampup
    scope now steps from where it is (floor 10 ms, factor 1.25) unless the user set
    those: about the allowed rate, about its target of 429s per window."""
    ramp = {"BACKOFF_WINDOW": 2.0, "THROTTLING_SCOPES": {"api.test": {"rampup": True}}}
    ok, limited = _simulate_rampup(ramp)
    assert ok >= 9.0
    assert limited <= 4.0
    # BACKOFF_MIN_DELAY set by the user is kept, and so is its swing.
    chosen, _ = _simulate_rampup({**ramp, "BACKOFF_MIN_DELAY": 1.0, "BACKOFF_DELAY_FACTOR": 2})
    assert chosen < 6.0


def test_rampup_settles_at_its_target_when_429s_carry_retry_after() -> None:
    """An acceptance probe: a token bucket answering 429 with ``Retry-After: 1`` got
    3.5 of them per 4 s window (target 1) and 18% of its rate: hints only held the
    scope, and after each hold the same rate ran into the limit again. Beyond the
    target a hint now also takes a step (simulated: 2.0 -> 6.8 a second of 10)."""
    ramp = {"BACKOFF_WINDOW": 4.0, "THROTTLING_SCOPES": {"api.test": {"rampup": True}}}
    ok, limited = _simulate_rampup(ramp, seconds=160.0, hint=1.0)
    assert ok >= 6.0
    assert limited <= 2.0


def test_hinted_triggers_beyond_the_target_take_one_step_per_hold() -> None:
    """Beyond the target a hint steps the rate back once; the rest of its burst
    (answered while the scope is held) only holds, and within the target a hint
    never steps (the specification's rule for hints)."""
    scope = rampup_scope(delay=0.25, concurrency=4, target=(1, 1))
    scope.concurrency = 3
    scope.record_backoff(1.0, 0.0)  # within the target: held, no step
    assert (scope.concurrency, scope.steps, scope.hold_until) == (3, 0, 1.0)
    scope.record_backoff(1.0, 2.0)  # beyond it, and the hold had ended: one step
    scope.record_backoff(1.0, 2.01)  # the same burst
    scope.record_backoff(1.0, 2.02)
    assert (scope.concurrency, scope.steps, scope.hold_until) == (2, 1, 3.02)
    # A review: answers of one burst that come after a short hold ended (slow
    # responses) stepped each; sent before the hold began, they only hold.
    scope.record_stale_hint(1.0, 3.5)
    scope.record_stale_hint(1.0, 3.6)
    assert (scope.concurrency, scope.steps, scope.hold_until) == (2, 1, 4.6)
    plain = ThrottlingScopeManager(concurrency=4, backoff=QUIET)
    for now in (0.0, 2.0, 4.0):
        plain.record_backoff(1.0, now)
    assert (plain.steps, plain.backoff_delay) == (0, None)


def test_smaller_rampup_steps_only_where_the_user_asked_for_rampup() -> None:
    """A review: the AutoThrottle mapping turns rampup on for every site of a crawl
    that may not own them; those keep the configured backoff steps."""
    from slotkit.settings import DOMAIN

    asked = ThrottlingSettings.from_settings(
        Settings({"THROTTLING_SCOPES": {"api.test": {"rampup": True}}})
    ).scope_config("api.test", DOMAIN)
    assert (asked.backoff.min_delay, asked.backoff.delay_factor) == (0.01, 1.25)
    mapped = ThrottlingSettings.from_settings(
        Settings({"AUTOTHROTTLE_ENABLED": True})
    ).scope_config("site.test", DOMAIN)
    assert mapped.rampup is not None
    assert (mapped.backoff.min_delay, mapped.backoff.delay_factor) == (1.0, 2.0)
    own = ThrottlingSettings.from_settings(
        Settings(
            {
                "THROTTLING_SCOPES": {"api.test": {"rampup": {"min_delay": 0.2}}},
                "BACKOFF_DELAY_FACTOR": 3.0,
            }
        )
    ).scope_config("api.test", DOMAIN)
    assert (own.backoff.min_delay, own.backoff.delay_factor) == (0.2, 3.0)


def _dead_site(settings: dict[str, object], seconds: float) -> list[float]:
    """When a scope sends to a site that answers 429 to everything (virtual time,
    50 ms answers, the gate's burst rule)."""
    import heapq

    from slotkit.settings import DOMAIN

    config = ThrottlingSettings.from_settings(Settings(settings)).scope_config("api.test", DOMAIN)
    scope = ThrottlingScopeManager.from_crawler(None, config.as_dict())  # type: ignore[arg-type]
    now, step_started = 0.0, -math.inf
    pending: list[tuple[float, float]] = []
    sends: list[float] = []
    while now < seconds:
        while pending and pending[0][0] <= now:
            at, sent = heapq.heappop(pending)
            if sent >= step_started:
                scope.record_backoff(None, at)
                step_started = at
            scope.record_done(at)
        wait = scope.can_send(now)
        if wait <= 0:
            scope.record_sent(now)
            sends.append(now)
            heapq.heappush(pending, (now + 0.05, now))
            continue
        now = min(pending[0][0] if pending else math.inf, now + wait)
    return sends


@pytest.mark.parametrize("window", [2.0, 60.0])
def test_a_rampup_scope_keeps_backing_off_from_a_dead_site(window: float) -> None:
    """A re-probe: once a rampup scope's gap was about a window long, each window
    held one trigger, "within" the target of 1, so no step followed: a dead site
    was asked once a window for good (325 times in 10 min with 2 s windows).
    Triggers are within the target only while a window can hold more of them."""
    settings = {"BACKOFF_WINDOW": window, "THROTTLING_SCOPES": {"api.test": {"rampup": True}}}
    sends = _dead_site(settings, 600.0)
    assert len(sends) < 60
    assert sends[-1] - sends[-2] > 60.0  # still growing towards BACKOFF_MAX_DELAY
