"""The backoff curve, its settings and the feedback rules, on a fake clock."""

from __future__ import annotations

import math
from typing import Any

import pytest
from scrapy.settings import Settings

from slotkit.backoff import BackoffRules, read_backoff, scope_backoff
from slotkit.policy import next_backoff, recover
from slotkit.scope import ThrottlingScopeManager
from slotkit.settings import SettingsError, ThrottlingSettings

WINDOW = 60.0
NO_JITTER = BackoffRules(jitter=(0.0, 0.0), window=WINDOW)


def make_scope(delay: float = 0.0, backoff: BackoffRules = NO_JITTER) -> ThrottlingScopeManager:
    return ThrottlingScopeManager(concurrency=4, delay=delay, backoff=backoff)


def test_next_backoff_doubles_within_floor_and_cap() -> None:
    """One step multiplies by the factor, floored at min_delay and capped at max_delay."""
    assert next_backoff(current=2.0, factor=2.0, floor=1.0, cap=300.0) == 4.0
    assert next_backoff(current=0.0, factor=2.0, floor=1.0, cap=300.0) == 1.0
    assert next_backoff(current=200.0, factor=2.0, floor=1.0, cap=300.0) == 300.0


def test_recover_steps_down_then_ends() -> None:
    """Recovery divides by the factor and ends below the floor or at the base delay."""
    assert recover(current=8.0, factor=2.0, floor=1.0, base=0.0) == 4.0
    assert recover(current=1.0, factor=2.0, floor=1.0, base=0.0) is None
    assert recover(current=4.0, factor=2.0, floor=1.0, base=2.0) is None


def test_trigger_curve_follows_the_table() -> None:
    """Successive triggers give 1, 2, 4, 8 seconds with the defaults."""
    scope = make_scope()
    seen = []
    for step in range(4):
        scope.record_backoff(None, now=float(step))
        seen.append(scope.backoff_delay)
    assert seen == [1.0, 2.0, 4.0, 8.0]


def test_recovery_one_step_per_quiet_window() -> None:
    """Each quiet window drops the delay one factor step until the configured delay is back."""
    scope = make_scope()
    for step in range(3):
        scope.record_backoff(None, now=0.0 + step * 0.001)
    assert scope.backoff_delay == 4.0
    scope.can_send(WINDOW + 0.01)
    assert scope.backoff_delay == 2.0
    scope.can_send(2 * WINDOW + 0.01)
    assert scope.backoff_delay == 1.0
    scope.can_send(3 * WINDOW + 0.01)
    assert scope.backoff_delay is None
    assert scope.recoveries == 3


def test_new_trigger_restarts_the_countdown() -> None:
    """A trigger during recovery pushes the next recovery a full window away."""
    scope = make_scope()
    scope.record_backoff(None, now=0.0)
    scope.record_backoff(None, now=WINDOW - 1)
    scope.can_send(WINDOW + 1)
    assert scope.backoff_delay == 2.0
    scope.can_send(2 * WINDOW)
    assert scope.backoff_delay == 1.0


def test_backoff_starts_from_the_configured_delay() -> None:
    """A scope with delay 3 backs off to 6, and recovers back to 3."""
    scope = make_scope(delay=3.0)
    scope.record_backoff(None, now=0.0)
    assert scope.current_delay == 6.0
    scope.can_send(WINDOW + 1)
    assert scope.backoff_delay is None
    assert scope.current_delay == 3.0


def test_gap_uses_backoff_delay() -> None:
    """During backoff the gap is the backoff delay: from the trigger, then between dispatches."""
    scope = make_scope()
    scope.record_sent(-5.0)  # the scope's first request (its gap runs from its end)
    scope.record_done(-5.0)
    scope.record_sent(0.0)
    scope.record_done(0.1)
    scope.record_backoff(None, now=0.1)
    assert scope.can_send(0.1) == pytest.approx(1.0)
    assert scope.can_send(1.1) == 0.0
    scope.record_sent(1.1)
    assert scope.can_send(1.1) == pytest.approx(1.0)


def test_a_step_after_a_slow_failure_still_waits_its_delay() -> None:
    """A timeout after 0.25 s with a 0.4 s backoff delay: the next request waits
    0.4 s from the failure (a probe saw it go 0.15 s after, the gap counted from
    the failed request's dispatch)."""
    config = BackoffRules(jitter=(0.0, 0.0), min_delay=0.4)
    scope = make_scope(backoff=config)
    scope.record_sent(-5.0)
    scope.record_done(-5.0)
    scope.record_sent(0.0)
    scope.record_backoff(None, now=0.25)
    scope.record_done(0.25)
    assert scope.can_send(0.25) == pytest.approx(0.4)


def test_wait_never_passes_the_next_recovery() -> None:
    """A backoff gap is re-asked at the recovery time, which may shorten it."""
    config = BackoffRules(jitter=(0.0, 0.0), window=10.0, min_delay=4.0, max_delay=300.0)
    scope = make_scope(backoff=config)
    scope.record_sent(0.0)
    scope.record_done(0.0)  # the gap after a scope's first request runs from its end
    scope.record_backoff(None, now=0.0)
    scope.record_backoff(None, now=0.0)
    assert scope.backoff_delay == 8.0
    assert scope.can_send(1.0) == pytest.approx(7.0)
    scope.can_send(10.0)  # one quiet window: 4 s, whose gap has ended
    assert scope.backoff_delay == 4.0
    assert scope.can_send(10.0) == 0.0


def test_a_gap_longer_than_the_window_is_not_a_quiet_window() -> None:
    """A probe: with window 60 s and max_delay 300 s, an always-503 site was asked
    every 60 s (1, 2 ... 32, 60, 60): each 64 s gap stepped down before it ended.
    A window the scope could not send in does not count as quiet."""
    config = BackoffRules(jitter=(0.0, 0.0), window=60.0, max_delay=300.0)
    scope = make_scope(backoff=config)
    scope.record_sent(-10.0)
    scope.record_done(-10.0)
    now, gaps = 0.0, []
    for _ in range(12):  # every request fails at once
        scope.record_sent(now)
        scope.record_backoff(None, now=now)
        scope.record_done(now)
        sent = now
        wait = scope.can_send(now)
        while wait > 0:  # ask again when told, as the gate does
            now += wait
            wait = scope.can_send(now)
        gaps.append(round(now - sent, 6))
    assert gaps == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0, 300.0, 300.0]


def test_hint_holds_without_stepping() -> None:
    """A hint is a hard minimum: it holds the scope but does not grow the delay."""
    scope = make_scope()
    scope.record_backoff(5.0, now=0.0)
    assert scope.backoff_delay is None
    assert scope.can_send(1.0) == pytest.approx(4.0)
    scope.record_backoff(1.0, now=2.0)  # shorter: never shortens the hold
    assert scope.can_send(2.0) == pytest.approx(3.0)


def test_backing_off_scope_is_never_idle() -> None:
    """Eviction must not forget a scope in backoff."""
    scope = make_scope()
    scope.record_backoff(None, now=0.0)
    assert not scope.is_idle(30.0, 0.0)
    assert scope.is_idle(10 * WINDOW, 0.0)


def test_window_zero_never_recovers() -> None:
    """BACKOFF_WINDOW = 0 keeps the backoff until the crawl ends."""
    scope = make_scope(backoff=BackoffRules(jitter=(0.0, 0.0), window=0.0))
    scope.record_backoff(None, now=0.0)
    scope.can_send(1e9)
    assert scope.backoff_delay == 1.0
    assert scope.recovers_at == math.inf


def test_global_settings_are_read() -> None:
    """BACKOFF_* settings give the crawl-wide rules."""
    config = read_backoff(
        Settings(
            {
                "BACKOFF_HTTP_CODES": [429],
                "BACKOFF_EXCEPTIONS": ["builtins.IOError"],
                "BACKOFF_DELAY_FACTOR": 3,
                "BACKOFF_MAX_DELAY": 60,
                "BACKOFF_MIN_DELAY": 2,
                "BACKOFF_JITTER": [0.0, 0.2],
                "BACKOFF_WINDOW": 30,
            }
        )
    )
    assert config.http_codes == {429}
    assert config.exceptions == (OSError,)
    assert (config.delay_factor, config.max_delay, config.min_delay) == (3.0, 60.0, 2.0)
    assert config.jitter == (0.0, 0.2)
    assert config.window == 30.0


def test_defaults_match_the_spec() -> None:
    """Defaults: factor 2, max 300, min 1, jitter 0.1, window 60, the listed codes."""
    config = read_backoff(Settings())
    assert config.http_codes == {429, 502, 503, 504, 520, 521, 522, 523, 524}
    assert [cls.__name__ for cls in config.exceptions] == [
        "DownloadFailedError",
        "DownloadTimeoutError",
        "ResponseDataLossError",
    ]
    assert (config.delay_factor, config.max_delay, config.min_delay, config.window) == (
        2.0,
        300.0,
        1.0,
        60.0,
    )
    assert config.jitter == (-0.1, 0.1)


def test_scope_overrides_fall_back_to_globals() -> None:
    """A scope's backoff dict overrides only the keys it sets."""
    base = read_backoff(Settings({"BACKOFF_MAX_DELAY": 100}))
    config = scope_backoff(base, "x", {"http_codes": [429, 503], "delay_factor": 1.2})
    assert config.http_codes == {429, 503}
    assert config.delay_factor == 1.2
    assert config.max_delay == 100.0


def test_scope_backoff_reaches_the_scope_config() -> None:
    """THROTTLING_SCOPES backoff dicts resolve per scope."""
    settings = ThrottlingSettings.from_settings(
        Settings({"THROTTLING_SCOPES": {"example.com": {"backoff": {"min_delay": 5.0}}}})
    )
    assert settings.scope_config("example.com", "domain").backoff.min_delay == 5.0
    assert settings.scope_config("other.com", "domain").backoff.min_delay == 1.0


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"delay_factr": 2}, "did you mean 'delay_factor'"),
        ({"delay_factor": 1.0}, "must be a number > 1"),
        ({"http_codes": [99]}, "HTTP status codes from 100 to 599"),
        ({"http_codes": "429"}, "list of HTTP status codes"),
        ({"exceptions": ["no.such.Error"]}, "cannot be imported"),
        ({"exceptions": ["builtins.len"]}, "must contain exception classes"),
        ({"max_delay": -1}, "must be a number >= 0"),
        ("fast", "must be a dict"),
    ],
)
def test_bad_scope_backoff_is_refused(entry: object, message: str) -> None:
    """Bad backoff entries fail at start naming the setting, the scope and the rule."""
    with pytest.raises(SettingsError, match=message) as info:
        ThrottlingSettings.from_settings(
            Settings({"THROTTLING_SCOPES": {"api": {"backoff": entry}}})
        )
    assert "THROTTLING_SCOPES['api']['backoff']" in str(info.value)


def test_bad_global_backoff_names_the_setting() -> None:
    """A bad BACKOFF_* value names the setting."""
    with pytest.raises(SettingsError, match="BACKOFF_WINDOW"):
        ThrottlingSettings.from_settings(Settings({"BACKOFF_WINDOW": "soon"}))


@pytest.mark.parametrize(
    ("values", "accepted"),
    [
        ({"BACKOFF_DELAY_FACTOR": "x"}, "BACKOFF_DELAY_FACTOR must be a number > 1"),
        ({"BACKOFF_DELAY_FACTOR": 1}, "BACKOFF_DELAY_FACTOR must be a number > 1"),
        ({"BACKOFF_WINDOW": "soon"}, "BACKOFF_WINDOW must be 0 (no recovery, no rampup) or"),
        ({"THROTTLING_SCOPES": {"api": {"window": -1}}}, "['window'] must be a number > 0"),
        ({"THROTTLING_SCOPES": {"api": {"quota": "lots"}}}, "['quota'] must be a number > 0"),
        (
            {"THROTTLING_SCOPES": {"api": {"rampup": {"delay_factor": "half"}}}},
            "['delay_factor'] must be a number between 0 and 1, exclusive",
        ),
    ],
)
def test_a_refused_value_is_told_the_range_really_accepted(
    values: dict[str, object], accepted: str
) -> None:
    """Whether the value is no number or a number out of range, the message
    states the one range accepted (a probe saw "x" told ">= 0" where > 1 holds)."""
    with pytest.raises(SettingsError) as info:
        ThrottlingSettings.from_settings(Settings(values))
    assert accepted in str(info.value)


@pytest.mark.parametrize(
    ("codes", "exceptions"),
    [
        # ``-s BACKOFF_HTTP_CODES=429,503`` arrives as a string; it means the list.
        ("429, 503", "builtins.OSError,builtins.TimeoutError"),
        # An acceptance probe: ``explain`` took a JSON list, the crawl refused it
        # ("got '[429'").
        ("[429, 503]", '["builtins.OSError", "builtins.TimeoutError"]'),
        # A probe: ["429"] was refused, where RETRY_HTTP_CODES takes digit strings.
        (["429", " 503"], ["builtins.OSError", "builtins.TimeoutError"]),
    ],
    ids=["comma-separated", "json", "digit-strings"],
)
def test_command_line_lists_are_read(codes: Any, exceptions: Any) -> None:
    config = ThrottlingSettings.from_settings(
        Settings({"BACKOFF_HTTP_CODES": codes, "BACKOFF_EXCEPTIONS": exceptions})
    )
    backoff = config.backoff_config("any.example")
    assert backoff.http_codes == frozenset({429, 503})
    assert backoff.exceptions == (OSError, TimeoutError)


@pytest.mark.parametrize("codes", ["429,soon", "429,²", ["²"]])
def test_command_line_garbage_still_names_the_setting(codes: Any) -> None:
    """A review: "²" passes str.isdigit() but not int(), a ValueError naming nothing."""
    with pytest.raises(SettingsError, match="BACKOFF_HTTP_CODES"):
        ThrottlingSettings.from_settings(Settings({"BACKOFF_HTTP_CODES": codes}))


class LowDraws:
    """Draws every jitter at 80 % of its low end (a backoff factor of 0.92)."""

    def uniform(self, low: float, high: float) -> float:
        return low * 0.8 if low < 0 else low


def test_the_gap_running_when_backoff_ends_keeps_the_configured_floor() -> None:
    """A probe: Crawl-delay 0.5 (jitter floored at 0), one 503, recovery 2 s later.
    The gap drawn in backoff (factor 0.92) ran on after recovery, on the 0.5 s
    delay: the next request went 0.46 s after the last one."""
    scope = ThrottlingScopeManager(
        concurrency=1,
        delay=0.5,
        jitter=(0.0, 0.0),
        rng=LowDraws(),
        backoff=BackoffRules(window=2.39),
    )
    scope.record_sent(0.0)
    scope.record_done(0.01)
    scope.record_backoff(None, now=0.01)
    assert scope.backoff_delay == 1.0
    scope.record_sent(1.0)  # factor 0.92 drawn with the backoff jitter
    scope.record_done(1.01)
    sent = 1.0 + scope.can_send(1.0)
    assert sent == pytest.approx(1.92)
    scope.record_sent(sent)
    scope.record_done(sent + 0.01)
    recovery = scope.recovers_at
    assert sent + 0.5 * 0.92 < recovery < sent + 0.5  # recovers while that gap runs
    assert scope.can_send(recovery) == pytest.approx(sent + 0.5 - recovery)
    assert scope.backoff_delay is None
    assert scope.next_allowed == pytest.approx(sent + 0.5)


def test_a_backoff_delay_near_the_configured_one_never_shortens_its_gap() -> None:
    """Backoff delay 0.525 (factor 1.05) with a 0.92 draw would be 0.483 s: below
    the configured 0.5 s that jitter 0 promises."""
    rules = BackoffRules(delay_factor=1.05, min_delay=0.0)
    scope = ThrottlingScopeManager(
        concurrency=1, delay=0.5, jitter=(0.0, 0.0), rng=LowDraws(), backoff=rules
    )
    scope.record_sent(0.0)
    scope.record_done(0.01)
    scope.record_backoff(None, now=0.01)
    assert scope.backoff_delay == pytest.approx(0.525)
    scope.record_sent(1.0)
    assert scope.next_allowed == pytest.approx(1.5)
