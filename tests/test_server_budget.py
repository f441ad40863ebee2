"""A server's remaining count as a scope's budget until its reset (slotkit.server_budget)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import pytest_twisted
from twisted.web import server

from slotkit.scope import ThrottlingScopeManager
from slotkit.server_budget import ServerBudget
from tests.crawl import ListSpider, run_crawl
from tests.server import MockSite, Reply

HOST = "127.0.0.1"


def test_remaining_requests_go_then_the_scope_waits_for_the_reset() -> None:
    scope = ThrottlingScopeManager(concurrency=8)
    scope.record_sent(0.0)
    scope.record_server_budget(remaining=2, reset=5.0, sent_at=0.0, now=0.5)
    scope.record_done(0.5)
    for _ in range(2):
        assert scope.can_send(0.5) == 0.0
        scope.record_sent(0.5)
    assert scope.can_send(0.5) == pytest.approx(5.0)
    assert scope.can_send(5.5) == 0.0  # past the reset the budget is unknown again


def test_requests_sent_after_the_answered_one_come_off_the_count() -> None:
    budget = ServerBudget()
    budget.learn(remaining=10, reset=10.0, sent_at=0.0, now=0.1, active=1)
    for at in (1.0, 2.0, 3.0):
        budget.record_sent(at)
    # The answer to the request sent at 1.0: the two sent after it are not in it.
    budget.learn(remaining=5, reset=9.0, sent_at=1.0, now=3.5, active=3)
    assert budget.left == 3
    assert budget.wait(3.5) == 0.0


def test_an_answered_request_of_the_same_turn_is_not_counted_again() -> None:
    """A probe: counting every request of the answered one's turn as sent after it
    halved a crawl's rate. One already answered was counted before it, or gave
    the tighter figure itself; only those still in flight may be missing."""
    budget = ServerBudget()
    budget.learn(remaining=19, reset=10.0, sent_at=0.0, now=0.0, active=1)
    for _ in range(4):
        budget.record_sent(1.0)
    budget.record_ended(1.0)  # two of the turn answered already
    budget.record_ended(1.0)
    budget.learn(remaining=12, reset=9.0, sent_at=1.0, now=1.2, active=2)
    assert budget.left == 11  # the other one in flight may still be counted after it


def test_a_first_budget_counts_every_other_request_in_flight() -> None:
    """No history yet: the others in flight may have left after it (safe side)."""
    budget = ServerBudget()
    budget.learn(remaining=3, reset=10.0, sent_at=0.0, now=0.2, active=4)
    assert budget.left == 0
    assert budget.wait(0.2) == pytest.approx(10.0)


def test_requests_that_left_in_the_same_turn_count_as_later() -> None:
    budget = ServerBudget()
    budget.learn(remaining=9, reset=10.0, sent_at=0.0, now=0.0, active=1)
    for _ in range(3):
        budget.record_sent(1.0)
    budget.learn(remaining=5, reset=9.0, sent_at=1.0, now=1.5, active=3)
    assert budget.left == 3  # 5 minus the two others of that turn


def test_a_late_answer_from_an_ended_window_changes_nothing() -> None:
    budget = ServerBudget()
    budget.learn(remaining=1, reset=10.0, sent_at=0.0, now=0.0, active=1)
    budget.learn(remaining=50, reset=20.0, sent_at=10.5, now=11.0, active=1)
    assert (budget.left, budget.until) == (50, 31.0)
    budget.learn(remaining=0, reset=1.0, sent_at=5.0, now=12.0, active=1)  # sent before
    assert budget.left == 50


def test_a_later_answer_ends_a_long_reset_early() -> None:
    """Review: a one-off 10 s penalty kept the scope at its limit per 10 s for good,
    the server's later, shorter resets thrown away as stale."""
    budget = ServerBudget()
    budget.learn(remaining=0, reset=10.0, sent_at=0.0, now=0.0, active=1, limit=5)
    budget.learn(remaining=4, reset=1.0, sent_at=0.5, now=0.6, active=1, limit=5)
    assert (budget.left, budget.until, budget.span) == (4, 1.6, 1.0)
    assert budget.wait(0.6) == 0.0


@pytest.mark.parametrize("reset", [0.0, -1.0, math.inf, math.nan])
def test_a_reset_that_names_no_window_is_ignored(reset: float) -> None:
    """Review: a reset of 0 with a stated limit divided by zero on every request."""
    budget = ServerBudget()
    budget.learn(remaining=9, reset=reset, sent_at=0.0, now=0.0, active=1, limit=10)
    budget.record_sent(0.1)
    assert budget.wait(0.1) == 0.0


def test_a_stated_limit_starts_each_window_after_the_reset() -> None:
    """Past the reset a known window size is budgeted, not a burst of the concurrency."""
    budget = ServerBudget()
    budget.learn(remaining=0, reset=2.0, sent_at=0.0, now=0.0, active=1, limit=3)
    assert budget.wait(1.0) == pytest.approx(1.0)
    for _ in range(3):
        assert budget.wait(2.0) == 0.0
        budget.record_sent(2.0)
    assert budget.wait(2.0) == pytest.approx(2.0)
    assert budget.wait(9.5) == 0.0  # windows missed while idle are skipped
    assert budget.until == pytest.approx(10.0)


def test_a_probes_short_reset_does_not_roll_a_whole_limit_in() -> None:
    """An acceptance probe: a sliding log's answer to a probe said 2 left and its
    next entry expires in 12 ms; rolling the whole limit in then met 429s."""
    budget = ServerBudget()
    budget.learn(remaining=0, reset=1.0, sent_at=0.0, now=0.1, active=1, limit=10)
    budget.learn(remaining=0, reset=1.0, sent_at=0.3, now=0.4, active=1, limit=10)
    budget.record_sent(1.1)  # asks at the earliest bound
    budget.learn(remaining=2, reset=0.012, sent_at=1.1, now=1.2, active=1, limit=10)
    for _ in range(2):
        assert budget.wait(1.2) == 0.0
        budget.record_sent(1.2)
    assert budget.until == pytest.approx(1.4)  # the latest bound stands
    budget.record_sent(1.25)  # one asks again past the short reset
    assert budget.wait(1.25) > 0


def test_a_spent_budget_asks_from_the_earliest_possible_reset() -> None:
    """Resets in whole seconds: each answer bounds the window's end from above.

    A probe: waiting for the latest bound, an API allowing 10 requests per 1 s
    window with 0.2 s answers got 6.2 requests per second.
    """
    budget = ServerBudget()
    budget.learn(remaining=6, reset=1.0, sent_at=0.0, now=0.2, active=1, limit=10)
    for _ in range(6):
        budget.record_sent(0.4)
    budget.learn(remaining=0, reset=1.0, sent_at=0.4, now=0.6, active=6, limit=10)
    assert budget.wait(0.6) == pytest.approx(0.6)  # the earliest bound, 1.2
    budget.record_sent(1.2)  # one asks
    assert budget.wait(1.2) == pytest.approx(0.4)  # the others wait for its answer
    budget.learn(remaining=9, reset=1.0, sent_at=1.2, now=1.4, active=1, limit=10)
    assert budget.left == 9
    assert budget.wait(1.4) == 0.0
    # No bound carried one window on: a window may begin with its first request.
    assert budget.early == pytest.approx(2.4)


def test_a_probe_sent_too_early_waits_for_the_latest_bound() -> None:
    budget = ServerBudget()
    budget.learn(remaining=0, reset=1.0, sent_at=0.0, now=0.2, active=1, limit=10)
    budget.learn(remaining=0, reset=1.0, sent_at=0.3, now=0.5, active=1, limit=10)
    budget.record_sent(1.2)
    budget.learn(remaining=0, reset=1.0, sent_at=1.2, now=1.4, active=1, limit=10)
    assert budget.wait(1.4) == pytest.approx(1.0)  # until 2.4: no second probe
    assert budget.early == budget.until


def test_a_probe_still_out_at_the_reset_counts_in_the_new_window() -> None:
    """Review of a crawl: the probe and a whole limit after the reset made one too many."""
    budget = ServerBudget()
    budget.learn(remaining=0, reset=1.0, sent_at=0.0, now=0.2, active=1, limit=3)
    budget.learn(remaining=0, reset=1.0, sent_at=0.3, now=0.5, active=1, limit=3)
    budget.record_sent(1.2)  # a probe
    for _ in range(2):
        assert budget.wait(1.5) == 0.0
        budget.record_sent(1.5)
    assert budget.wait(1.5) > 0


def test_fractional_resets_bound_a_window_by_its_answers() -> None:
    """Past a reset, only answers bound when the new window ends (exact resets
    may fall short of the window's length)."""
    budget = ServerBudget()
    budget.learn(remaining=0, reset=0.8, sent_at=0.0, now=0.2, active=1, limit=10)
    budget.record_sent(1.0)
    budget.learn(remaining=9, reset=0.95, sent_at=1.0, now=1.05, active=1, limit=10)
    assert budget.early == pytest.approx(2.0)


def test_an_answer_after_the_probes_is_not_taken_for_the_probes() -> None:
    """Review: a probe answered after the reset left its mark, and a later answer of
    the new window replaced what was left instead of taking the tighter figure."""
    budget = ServerBudget()
    budget.learn(remaining=0, reset=1.0, sent_at=0.0, now=0.2, active=1, limit=10)
    budget.learn(remaining=0, reset=1.0, sent_at=0.1, now=0.5, active=1, limit=10)
    budget.record_sent(1.2)  # the probe
    budget.learn(remaining=9, reset=1.0, sent_at=1.2, now=1.6, active=1, limit=10)
    sends = [1.60 + i * 0.01 for i in range(9)]
    for at in sends:
        assert budget.wait(at) == 0.0
        budget.record_sent(at)
    budget.record_ended(1.62)
    budget.learn(remaining=8, reset=1.0, sent_at=1.62, now=1.75, active=8, limit=10)
    assert budget.left == 0
    assert budget.wait(1.75) > 0


def test_a_probe_answered_after_the_reset_does_not_replace_the_new_window() -> None:
    """Review: the reset came before the probe's answer, which then replaced the
    rolled window with its own short reset as the window's length; a sliding log
    allowing 10 per 2 s got a whole limit every second (227 429s against 6)."""
    budget = ServerBudget()
    for _ in range(10):
        budget.record_sent(0.0)
    budget.learn(remaining=0, reset=3, sent_at=0.0, now=0.2, active=1, limit=10)
    budget.learn(remaining=0, reset=3, sent_at=0.0, now=0.4, active=1, limit=10)
    assert budget.wait(3.2) == 0.0
    budget.record_sent(3.2)  # the probe, at the earliest bound
    budget.wait(3.4)  # the reset, at the latest bound
    budget.learn(remaining=0, reset=1, sent_at=3.2, now=3.45, active=1, limit=10)
    assert budget.span == 3
    assert budget.left <= 0


def test_without_a_stated_limit_no_request_asks_early() -> None:
    """An acceptance probe: a sliding log that states no limit answered 8 of 120
    requests 429, the askers' entries still in its log at the latest bound."""
    budget = ServerBudget()
    budget.learn(remaining=0, reset=1.0, sent_at=0.0, now=0.2, active=1)
    budget.learn(remaining=0, reset=1.0, sent_at=0.3, now=0.5, active=1)
    assert budget.wait(1.2) == pytest.approx(0.3)  # the latest bound, 1.5


def test_an_answer_from_before_a_reset_does_not_bound_the_new_window() -> None:
    """Review: a slow answer from the window before a reset bounded the new
    window's end by the old one's, and a probe went before the server's reset."""
    budget = ServerBudget()
    budget.record_sent(9.2)
    budget.learn(remaining=1, reset=1.0, sent_at=9.2, now=9.35, active=1, limit=4)
    budget.record_sent(9.4)  # the last of the window; its answer will be slow
    rolled = budget.until  # 10.35
    for _ in range(4):
        assert budget.wait(rolled) == 0.0
        budget.record_sent(rolled)
    budget.learn(remaining=0, reset=1.0, sent_at=9.4, now=10.45, active=5, limit=4)
    assert math.isinf(budget.early)  # no probe before the rolled window can have ended
    assert budget.wait(10.45) == pytest.approx(11.45 - 10.45)  # the later bound holds


def test_the_next_window_is_bounded_by_its_own_answers() -> None:
    """Review: seen only late in a window, the resets fell short of its length, and
    the last window's bound carried one of them on put the next probe 0.85 s
    before the end. (A window may also begin with its first request: no bound
    is carried.)"""
    budget = ServerBudget()
    for at in (9.0, 9.1, 9.2, 9.3):
        budget.record_sent(at)
    for at, remaining in ((9.0, 3), (9.1, 2), (9.2, 1), (9.3, 0)):
        budget.record_ended(at)
        budget.learn(remaining, 1.0, sent_at=at, now=at + 0.15, active=1, limit=4)
    probe = 10.15
    assert budget.wait(probe) == 0.0
    budget.record_sent(probe)
    budget.learn(remaining=3, reset=2.0, sent_at=probe, now=probe + 0.15, active=1, limit=4)
    assert budget.early >= 12.0  # the server's window ends at 12.0


def test_a_stale_answer_is_not_taken() -> None:
    """Review: the feedback skipped the hold of a spent count when the budget had
    thrown the answer away; it now skips it only when the budget took it."""
    scope = ThrottlingScopeManager(concurrency=8)
    scope.record_sent(0.00)
    scope.record_sent(0.01)
    scope.record_ending(0.01, None)
    scope.record_done(0.10)
    assert scope.record_server_budget(remaining=1, reset=10.0, sent_at=0.01, now=0.10)
    scope.record_ending(0.00, None)
    scope.record_done(2.0)
    assert not scope.record_server_budget(remaining=0, reset=10.0, sent_at=0.00, now=2.0)


def test_a_scope_is_not_idle_while_its_budget_runs() -> None:
    """Evicted, the scope would forget what the server said and send into 429s."""
    scope = ThrottlingScopeManager(concurrency=8)
    scope.record_sent(0.0)
    scope.record_server_budget(remaining=0, reset=30.0, sent_at=0.0, now=0.5)
    scope.record_done(0.5)
    assert not scope.is_idle(20.0, max_idle=1.0)
    assert scope.is_idle(31.0, max_idle=1.0)


def test_a_budget_survives_a_pause() -> None:
    """Review: JOBDIR kept a spent quota but not a spent budget; the resumed crawl burst."""
    scope = ThrottlingScopeManager(concurrency=8)
    scope.record_sent(0.0)
    scope.record_server_budget(remaining=0, reset=30.0, sent_at=0.0, now=0.5)
    scope.record_done(0.5)
    state = scope.export_state(1.0)
    assert state is not None
    resumed = ThrottlingScopeManager(concurrency=8)
    resumed.import_state(state, 2.0)
    assert resumed.can_send(2.0) == pytest.approx(28.5)
    assert resumed.can_send(31.0) == 0.0


def test_without_a_reset_nothing_is_learnt() -> None:
    scope = ThrottlingScopeManager(concurrency=8)
    assert scope.server_budget is None
    assert scope.can_send(0.0) == 0.0
    assert math.isinf(ServerBudget().until)


class FixedWindow:
    """An API allowing *limit* requests per fixed *window*, saying so in its headers."""

    def __init__(self, limit: int, window: float) -> None:
        from twisted.internet import reactor

        self.clock: Any = reactor
        self.limit, self.window = limit, window
        self.start: float | None = None
        self.counts: dict[int, int] = {}
        self.rejected = 0

    def __call__(self, request: server.Request, n: int) -> Reply:
        now = self.clock.seconds()
        if self.start is None:
            self.start = now
        index = int((now - self.start) // self.window)
        used = self.counts.get(index, 0)
        reset = math.ceil(self.start + (index + 1) * self.window - now)
        if used >= self.limit:
            self.rejected += 1
            headers = {"Retry-After": str(reset)}
            return Reply(429, headers, b"slow down", 0.0)
        self.counts[index] = used + 1
        headers = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.limit - used - 1),
            "RateLimit-Reset": str(reset),
        }
        return Reply(200, headers, b"ok", 0.05)


@pytest_twisted.ensureDeferred
async def test_headers_alone_keep_a_crawl_under_the_servers_limit(mock_site: MockSite) -> None:
    """Acceptance probe: with no quota configured, every server window cost about
    concurrency - 1 429s (29 of 149 requests at concurrency 8). The remaining
    count now budgets the scope until the reset: only the opening burst, sent
    before any answer, can overshoot."""
    api = FixedWindow(limit=5, window=1.0)
    mock_site.set_behaviour(HOST, api)
    urls = [mock_site.url(HOST, f"/item/{i}") for i in range(20)]
    settings = {
        "DOWNLOADER": "slotkit.Downloader",
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        "RETRY_TIMES": 5,
    }
    result = await run_crawl(ListSpider, settings, urls=urls, crawl_timeout=60)
    assert len(result.responses) == 20
    assert api.rejected <= 3  # 8 sent at once into a window of 5


def test_the_budget_is_told_the_dispatch_time_it_recorded() -> None:
    """Review: the probe's answer is known by its dispatch time, but the feedback
    passed ``left_at``, which the shared downloader stamps later; a probe that
    found 9 left went unrecognised and the scope waited a whole window more."""
    from types import SimpleNamespace

    from twisted.internet.task import Clock

    from slotkit.backoff import BackoffRules
    from slotkit.feedback import Feedback
    from slotkit.outcomes import ScopeBackoff
    from slotkit.registry import Scope

    manager = ThrottlingScopeManager(concurrency=16)
    scope = Scope("api.example", manager)
    clock = Clock()
    feedback = Feedback(
        SimpleNamespace(backoff_config=lambda _: BackoffRules()),  # type: ignore[arg-type]
        SimpleNamespace(get=lambda _: scope),  # type: ignore[arg-type]
        SimpleNamespace(poke=lambda _: None),  # type: ignore[arg-type]
        clock,
        SimpleNamespace(inc=lambda *_: None),  # type: ignore[arg-type]
    )

    def answer(sent_at: float, now: float, remaining: int) -> None:
        clock.advance(now - clock.seconds())
        manager.record_ending(sent_at, None)
        manager.record_done(now)
        # The shared downloader's left_at comes after the reservation: 2 ms later.
        ticket = SimpleNamespace(sent_at=sent_at, left_at=sent_at + 0.002)
        record = ScopeBackoff(remaining=remaining, reset=1.0, limit=10)
        feedback.apply(ticket, {"api.example": record}, "response")  # type: ignore[arg-type]

    manager.record_sent(0.0)
    answer(0.0, 0.3, remaining=9)
    for _ in range(9):
        manager.record_sent(0.3)
    for _ in range(8):  # the others of the turn answered already
        manager.record_ending(0.3, None)
        manager.record_done(0.6)
    answer(0.3, 0.6, remaining=0)  # ends between 1.3 and 1.6
    probe = 1.3
    assert manager.can_send(probe) == 0.0
    manager.record_sent(probe)
    answer(probe, 1.45, remaining=9)
    assert manager.can_send(1.45) == 0.0
