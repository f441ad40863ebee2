"""Tests for slotkit.status: scope snapshots, the periodic status line, the telnet report."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request
from twisted.internet.task import Clock

from slotkit.backoff import BackoffRules
from slotkit.downloader import Downloader
from slotkit.registry import Scope
from slotkit.scope import ThrottlingScopeManager
from slotkit.status import (
    StatusReporter,
    format_status,
    install_telnet_vars,
    scope_state,
    summarize,
)
from slotkit.validation import SettingsError
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite

INTERVAL = 60.0
ONE_DELAY = 1.0
HOLD = 5.0
WINDOW = 10.0


def make_scope(
    scope_id: str,
    concurrency: int = 2,
    delay: float = 0.0,
    backoff: BackoffRules | None = None,
) -> Scope:
    manager = ThrottlingScopeManager(concurrency=concurrency, delay=delay, backoff=backoff)
    return Scope(scope_id, manager, "domain")


def occupy(scope: Scope, in_flight: int = 0, waiting: int = 0) -> None:
    """Fill the gate's bookkeeping of *scope* as if requests were there."""
    for index in range(in_flight + waiting):
        request = Request(f"https://{scope.id}/{index}")
        scope.add_request(request)
        if index < in_flight:
            scope.add_in_flight(request)


class CaptureLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def captured():
    log = logging.getLogger("slotkit.test_status")
    handler = CaptureLog()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    yield log, handler.messages
    log.removeHandler(handler)


# ----------------------------------------------------------------- snapshots


def test_state_of_an_idle_scope():
    """A fresh scope reads as alive, not backing off, nothing in flight or waiting."""
    state = scope_state(make_scope("a.example", concurrency=4, delay=ONE_DELAY), now=0.0)
    assert (state.id, state.concurrency, state.delay, state.current_delay) == (
        "a.example",
        4,
        ONE_DELAY,
        ONE_DELAY,
    )
    assert (state.in_flight, state.waiting, state.backoff_level, state.hold_remaining) == (
        0,
        0,
        0,
        0.0,
    )
    assert not state.backing_off


def test_state_counts_in_flight_and_waiting_requests():
    """In flight and waiting come from the gate's sets on the scope."""
    scope = make_scope("a.example")
    occupy(scope, in_flight=2, waiting=3)
    state = scope_state(scope, now=0.0)
    assert (state.in_flight, state.waiting) == (2, 3)


def test_state_shows_a_hold_and_its_remaining_time():
    """A hard hold (a Retry-After hint) shows as backing off, with the seconds left."""
    scope = make_scope("a.example")
    scope.manager.record_backoff(HOLD, now=0.0)
    state = scope_state(scope, now=2.0)
    assert state.backing_off
    assert state.hold_remaining == pytest.approx(HOLD - 2.0)
    assert state.backoff_delay is None
    assert scope_state(scope, now=HOLD + 1).hold_remaining == 0.0


def test_state_shows_backoff_levels():
    """Each backoff step raises the level; the delay in force follows the backoff delay."""
    scope = make_scope("a.example", backoff=BackoffRules(window=WINDOW))
    manager = scope.manager
    manager.record_backoff(None, now=0.0)
    first = scope_state(scope, now=0.0)
    manager.record_backoff(None, now=1.0)
    second = scope_state(scope, now=1.0)
    assert (first.backoff_level, first.current_delay) == (1, 1.0)
    assert (second.backoff_level, second.current_delay) == (2, 2.0)
    assert second.steps == 2


def test_state_applies_due_recovery_without_touching_the_scope():
    """Recovery that is due is shown, while the scope manager itself stays unchanged."""
    scope = make_scope("a.example", backoff=BackoffRules(window=WINDOW))
    manager = scope.manager
    manager.record_backoff(None, now=0.0)
    manager.record_backoff(None, now=0.0)  # 2 s
    assert scope_state(scope, now=WINDOW + 0.1).backoff_delay == 1.0
    assert scope_state(scope, now=2 * WINDOW + 0.1).backoff_delay is None
    assert manager.backoff_delay == 2.0
    assert manager.recovers_at == WINDOW


def test_state_of_a_custom_scope_manager_without_the_attributes():
    """A scope manager exposing none of the default one's attributes still yields a state."""

    class Bare:
        pass

    scope = Scope("cost", Bare(), "custom")  # type: ignore[arg-type]
    state = scope_state(scope, now=0.0)
    assert (state.concurrency, state.delay, state.backoff_delay, state.hold_remaining) == (
        None,
        0.0,
        None,
        0.0,
    )


# ----------------------------------------------------------------- the line


def test_summary_picks_the_slowest_scopes_by_delay_or_hold():
    """The slowest are ordered by the larger of delay and hold; fast idle scopes are left out."""
    fast = make_scope("fast.example")
    slow = make_scope("slow.example", delay=2.0)
    held = make_scope("held.example", delay=0.5)
    held.manager.record_backoff(HOLD, now=0.0)
    medium = make_scope("medium.example", delay=ONE_DELAY)
    other = make_scope("other.example", delay=0.25)
    states = [scope_state(s, 0.0) for s in (fast, slow, held, medium, other)]
    summary = summarize(states)
    assert [state.id for state in summary.slowest] == [
        "held.example",
        "slow.example",
        "medium.example",
    ]
    assert summary.alive == 5
    assert summary.backing_off == 1


def test_format_status_line():
    """The line names counts and the slowest scopes with their delays."""
    scope = make_scope("slow.example", delay=2.0)
    occupy(scope, in_flight=1, waiting=4)
    held = make_scope("held.example")
    held.manager.record_backoff(3.0, now=0.0)
    line = format_status([scope_state(scope, 0.0), scope_state(held, 0.0)])
    assert line == (
        "Throttling: 2 scopes alive, 1 backing off, 4 requests waiting, 1 in flight; "
        "slowest: held.example 0.00s (hold 3.0s), slow.example 2.00s"
    )


def test_format_status_line_without_slow_scopes():
    """With no delay anywhere there is no "slowest" part."""
    assert format_status([scope_state(make_scope("a.example"), 0.0)]) == (
        "Throttling: 1 scope alive, 0 backing off, 0 requests waiting, 0 in flight"
    )


def test_format_status_line_counts_what_slotkits_scheduler_queues():
    """With slotkit's scheduler, requests waiting for their scopes wait there, not
    in the downloader: an acceptance probe read '0 requests waiting, 0 in
    flight' for two minutes while 882 hand-outs were held back, a stalled crawl."""
    from types import SimpleNamespace

    from slotkit.scheduler import ThrottlingAwareScheduler
    from slotkit.status import _queued_in_slotkits_scheduler

    line = format_status([scope_state(make_scope("a.example"), 0.0)], queued=12)
    assert line.endswith("0 requests waiting, 0 in flight, 12 queued in the scheduler")

    class Holding(ThrottlingAwareScheduler):
        def __init__(self) -> None:
            pass

        def __len__(self) -> int:
            return 12

    aware = SimpleNamespace(engine=SimpleNamespace(scheduler=Holding()))
    stock = SimpleNamespace(engine=SimpleNamespace(scheduler=object()))
    assert _queued_in_slotkits_scheduler(aware) == 12  # type: ignore[arg-type]
    assert _queued_in_slotkits_scheduler(stock) is None  # type: ignore[arg-type]


# ----------------------------------------------------------------- the reporter


def test_reporter_logs_every_interval(captured):
    """One line per interval, the first one interval after start()."""
    log, messages = captured
    clock = Clock()
    scopes = [make_scope("a.example", delay=ONE_DELAY)]
    reporter = StatusReporter(clock, lambda: scopes, INTERVAL, log=log)
    reporter.start()
    clock.advance(INTERVAL - 1)
    assert messages == []
    clock.advance(1)
    assert len(messages) == 1
    assert messages[0].startswith("Throttling: 1 scope alive")
    clock.advance(INTERVAL)
    assert len(messages) == 2
    reporter.stop()
    assert clock.getDelayedCalls() == []


def test_reporter_reads_the_scopes_anew_each_time(captured):
    """Scopes created after start() appear in later lines."""
    log, messages = captured
    clock = Clock()
    scopes: list[Scope] = []
    reporter = StatusReporter(clock, lambda: scopes, INTERVAL, log=log)
    reporter.start()
    clock.advance(INTERVAL)
    scopes.append(make_scope("b.example"))
    clock.advance(INTERVAL)
    assert messages[0].startswith("Throttling: 0 scopes alive")
    assert messages[1].startswith("Throttling: 1 scope alive")
    reporter.stop()
    assert clock.getDelayedCalls() == []


def test_interval_zero_disables(captured):
    """THROTTLING_STATS_INTERVAL = 0: start() arms nothing, nothing is logged."""
    log, messages = captured
    clock = Clock()
    reporter = StatusReporter(clock, list, 0.0, log=log)
    reporter.start()
    assert clock.getDelayedCalls() == []
    clock.advance(3600)
    assert messages == []
    reporter.stop()


def test_stop_before_start_and_twice_is_harmless():
    """stop() is idempotent, and start() after stop() does nothing."""
    clock = Clock()
    reporter = StatusReporter(clock, list, INTERVAL)
    reporter.stop()
    reporter.stop()
    reporter.start()
    assert clock.getDelayedCalls() == []


def test_start_twice_keeps_one_timer():
    """Calling start() again while running does not add a second timer."""
    clock = Clock()
    reporter = StatusReporter(clock, list, INTERVAL)
    reporter.start()
    reporter.start()
    assert len(clock.getDelayedCalls()) == 1
    reporter.stop()
    assert clock.getDelayedCalls() == []


def test_a_failing_scope_source_does_not_stop_the_timer(captured):
    """An exception while building the line is raised, but the next tick is still armed."""
    log, _ = captured
    clock = Clock()
    calls = []

    def broken() -> list[Scope]:
        calls.append(1)
        raise RuntimeError("boom")

    reporter = StatusReporter(clock, broken, INTERVAL, log=log)
    reporter.start()
    with pytest.raises(RuntimeError):
        clock.advance(INTERVAL)
    assert len(clock.getDelayedCalls()) == 1
    reporter.stop()
    assert clock.getDelayedCalls() == []


def test_report_lists_every_scope():
    """The telnet report is the status line plus one line per scope."""
    clock = Clock()
    busy = make_scope("busy.example", concurrency=3, delay=ONE_DELAY)
    occupy(busy, in_flight=2, waiting=1)
    busy.manager.record_backoff(None, now=0.0)
    reporter = StatusReporter(clock, lambda: [busy], INTERVAL)
    lines = reporter.report().splitlines()
    assert lines[0].startswith("Throttling: 1 scope alive, 1 backing off")
    assert lines[2].split() == ["scope", "in", "flight", "waiting", "delay", "backoff"]
    assert lines[3].split()[:4] == ["busy.example", "2/3", "1", "2.00s"]  # backed off from 1 s
    assert "level 1" in lines[3]


# ----------------------------------------------------------------- attach / telnet


class FakeSignals:
    def __init__(self) -> None:
        self.connected: list[tuple[Any, Any]] = []

    def connect(self, receiver: Any, signal: Any) -> None:
        self.connected.append((receiver, signal))


class FakeCrawler:
    def __init__(self) -> None:
        self.signals = FakeSignals()


class FakeDownloader:
    def __init__(self, settings: dict[str, Any]) -> None:
        from scrapy.settings import Settings

        from slotkit.registry import ScopeRegistry

        self.settings = Settings(settings)
        self.crawler = FakeCrawler()
        self._clock = Clock()
        self.registry = ScopeRegistry(lambda scope_id: make_scope(scope_id), self._clock)


def test_attach_reads_the_interval_and_connects_signals():
    """attach() takes THROTTLING_STATS_INTERVAL and hooks engine start/stop and telnet."""
    from scrapy import signals
    from scrapy.extensions.telnet import update_telnet_vars

    downloader = FakeDownloader({"THROTTLING_STATS_INTERVAL": "30"})
    reporter = StatusReporter.attach(downloader)
    assert reporter.interval == 30.0
    connected = {signal for _, signal in downloader.crawler.signals.connected}
    assert {signals.engine_started, signals.engine_stopped, update_telnet_vars} <= connected
    downloader.registry.get("a.example")
    assert [state.id for state in reporter.states()] == ["a.example"]
    reporter.start()
    reporter.stop()
    assert downloader._clock.getDelayedCalls() == []


def test_attach_defaults_to_sixty_seconds():
    """Without the setting the interval is 60 s."""
    assert StatusReporter.attach(FakeDownloader({})).interval == 60.0


def test_attach_refuses_a_bad_interval():
    """A value that is not a number >= 0 fails with a message naming the setting."""
    with pytest.raises(SettingsError, match="THROTTLING_STATS_INTERVAL"):
        StatusReporter.attach(FakeDownloader({"THROTTLING_STATS_INTERVAL": "soon"}))


def test_telnet_vars_get_tst_and_est_shows_throttling(capsys):
    """The telnet console's est() prints the engine status, then the throttling report."""
    crawler = FakeCrawler()
    clock = Clock()
    reporter = StatusReporter(clock, lambda: [make_scope("a.example", delay=2.0)], INTERVAL)
    install_telnet_vars(crawler, reporter)  # type: ignore[arg-type]
    ((receiver, _),) = crawler.signals.connected
    printed = []
    telnet_vars: dict[str, Any] = {"est": lambda: printed.append("engine status")}
    receiver(telnet_vars=telnet_vars)
    assert telnet_vars["throttling"] is reporter
    telnet_vars["est"]()
    assert printed == ["engine status"]
    assert "Throttling: 1 scope alive" in capsys.readouterr().out
    telnet_vars["tst"]()
    assert "a.example" in capsys.readouterr().out


def test_no_math_inf_in_hold_of_fresh_scope():
    """A scope that was never held reports a hold of exactly 0, not a negative infinity."""
    state = scope_state(make_scope("a.example"), now=1e9)
    assert state.hold_remaining == 0.0
    assert not math.isinf(state.wait_hint)


# ----------------------------------------------------------------- in a real crawl


class WiredDownloader(Downloader):
    """slotkit's downloader with the status reporter wired the way the lead adds it."""

    def __init__(self, crawler: Any, clock: Any = None) -> None:
        super().__init__(crawler, clock)
        if not hasattr(self, "status"):  # once downloader.py wires it, use that one
            self.status = StatusReporter.attach(self)

    def close(self) -> None:
        super().close()
        self.status.stop()


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_status_line_is_logged_during_a_crawl(mock_site: MockSite):
    """With THROTTLING_STATS_INTERVAL set, the line shows up in the crawl's log, naming
    the slow scope."""
    urls = [mock_site.url("127.0.0.2", f"/page/{i}", delay=0.2) for i in range(6)]
    result = await run_crawl(
        ListSpider,
        {
            "DOWNLOADER": f"{__name__}.WiredDownloader",
            "THROTTLING_STATS_INTERVAL": 0.3,
            "DOWNLOAD_DELAY": 0.25,
            "DOWNLOAD_DELAY_JITTER": 0,
        },
        urls=urls,
    )
    result.assert_no_unhandled_errors()
    lines = [r.getMessage() for r in result.log_records if r.getMessage().startswith("Throttling:")]
    assert lines
    assert any("slowest: 127.0.0.2 0.25s" in line for line in lines)
    assert not result.crawler.engine.downloader.status.running
