"""Feeding the outcome of a download back into its scopes.

The throttling manager says what a response or an exception means
(:class:`~slotkit.manager.ScopeBackoff` per scope); this module applies it:

* a server hint (``Retry-After``, ``RateLimit-Reset`` ...) becomes a hard hold,
  capped at the scope's ``max_delay`` with one log line per capped episode;
* a trigger advances the scope's backoff one step, except for a response to
  a request dispatched before the scope's current step began: N requests in
  flight answered 429 together are one signal, not N;
* quota corrections go to ``reconcile_quota``;
* a server's remaining count with its reset becomes the scope's budget
  until then (:mod:`slotkit.server_budget`).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from slotkit.backoff import capped

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response
    from twisted.internet.interfaces import IReactorTime

    from slotkit.gate import Gate, Waiter
    from slotkit.manager import ScopeBackoff
    from slotkit.registry import Scope, ScopeRegistry
    from slotkit.settings import ThrottlingSettings
    from slotkit.stats import ThrottlingStats

logger = logging.getLogger("slotkit")

__all__ = ["Feedback", "current_request"]

#: The request whose outcome is being judged. A manager that builds a new
#: Response (the spec's "upstream status" recipe) loses ``response.request``;
#: the default manager falls back to this.
current_request: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "slotkit_current_request", default=None
)

RATE_LIMITED = 429


# Occasional 5xx and timeouts from a healthy site keep it backed off for good
# (a probe: 12 times slower than stock); the first step's line names the way out.
_NOT_ABOUT_LOAD = (
    "; if the site's errors are not about load, BACKOFF_HTTP_CODES = [429] and "
    "BACKOFF_EXCEPTIONS = [] (or the scope's 'backoff' key) leave them to retries"
)


class Feedback:
    """Applies :class:`~slotkit.manager.ScopeBackoff` records to live scopes."""

    def __init__(
        self,
        config: ThrottlingSettings,
        registry: ScopeRegistry,
        gate: Gate,
        clock: IReactorTime,
        stats: ThrottlingStats,
    ) -> None:
        self._config = config
        self._registry = registry
        self._gate = gate
        self._clock = clock
        self._stats = stats

    def apply(
        self, ticket: Waiter, backoff: Mapping[str, ScopeBackoff] | None, reason: str
    ) -> None:
        """Apply *backoff* (what the manager made of an outcome) to the scopes it names."""
        if not backoff:
            return
        now = self._clock.seconds()
        for scope_id, record in backoff.items():
            scope = self._registry.get(scope_id)
            changed = False
            budgeted = False
            if record.remaining is not None and record.reset is not None:
                budgeted = self._learn_budget(
                    scope, ticket, record.remaining, record.reset, record.limit, now
                )
            if record.delay is not None and record.delay > 0:
                if budgeted and _spent_count_only(record):
                    # The budget holds a spent count itself, until the earliest
                    # moment the server's window can end: not a whole second late.
                    # Requests in flight answered 429 meanwhile are this signal.
                    self._stats.inc("backoff/header_hints")
                    scope.step_started_at = now
                else:
                    self._hold(scope, ticket, record.delay, now)
                changed = True
            if record.trigger:
                changed |= self._trigger(
                    scope, ticket, now, reason, hinted=record.delay is not None
                )
            if record.consumed is not None or record.remaining is not None:
                # An optional hook (the interface's reconcile_quota takes no
                # reset): a spent count lasts until the server's reset.
                resets = getattr(scope.manager, "record_quota_reset", None)
                if record.reset is not None and resets is not None:
                    resets(record.reset, now)
                scope.manager.reconcile_quota(record.consumed, record.remaining, now)
                changed = True
            if changed:
                self._gate.poke(scope)

    def _learn_budget(
        self,
        scope: Scope,
        ticket: Waiter,
        remaining: float,
        reset: float,
        limit: float | None,
        now: float,
    ) -> bool:
        """The server takes *remaining* more requests until its reset (an optional hook).

        The reset is a server's figure like any wait hint: capped at the
        scope's ``max_delay``, as the hold of a spent count is. Returns
        whether the scope's budget took the answer (so it holds a spent
        count itself): a hook that returns anything but ``True`` does not.
        """
        learns = getattr(scope.manager, "record_server_budget", None)
        if learns is None:
            return False
        reset, _ = capped(reset, self._config.backoff_config(scope.id))
        # The dispatch time the scope recorded (record_sent), which the
        # shared downloader's later left_at is not: a probe is told by it.
        return learns(remaining, reset, ticket.sent_at, now, limit) is True

    def _hold(self, scope: Scope, ticket: Waiter, delay: float, now: float) -> None:
        config = self._config.backoff_config(scope.id)
        delay, was_capped = capped(delay, config)
        self._stats.inc("backoff/header_hints")
        if was_capped:
            self._stats.inc("backoff/capped")
            if not scope.capped_logged:
                scope.capped_logged = True
                logger.info(
                    "slotkit: scope %r was asked to wait longer than its max_delay; "
                    "waiting %.1fs (BACKOFF_MAX_DELAY or the scope's backoff max_delay)",
                    scope.id,
                    delay,
                )
        # An answer to a request that left before the current step or hold
        # began is part of the burst that caused it: it holds, never steps.
        stale_hint = (
            getattr(scope.manager, "record_stale_hint", None)
            if ticket.left_at < scope.step_started_at
            else None
        )
        if stale_hint is not None:
            stale_hint(delay, now)
        else:
            scope.manager.record_backoff(delay, now)
        scope.step_started_at = now

    def _trigger(
        self, scope: Scope, ticket: Waiter, now: float, reason: str, *, hinted: bool
    ) -> bool:
        self._stats.inc(f"backoff/triggers/{reason}")
        if hinted:
            return False  # the hint already held the scope: a hard minimum, not a step
        # A response to a request that left before the current step began is
        # part of the burst that caused it.
        if ticket.left_at < scope.step_started_at:
            self._stats.inc("backoff/deduplicated")
            return False
        manager = scope.manager
        steps_before = getattr(manager, "steps", None)
        manager.record_backoff(None, now)
        scope.step_started_at = now
        scope.capped_logged = False
        # A rampup scope within its target takes the trigger without a step;
        # managers that keep no step count (the shared one, most custom ones)
        # are taken to have stepped.
        stepped = (
            not isinstance(steps_before, int) or getattr(manager, "steps", None) != steps_before
        )
        if stepped:
            self._stats.inc("backoff/steps")
            if not scope.backoff_logged:
                # Once per scope: a newcomer saw a site go 16 times slower with
                # nothing above DEBUG; the status line and stats follow it on.
                scope.backoff_logged = True
                delay = getattr(manager, "current_delay", None)
                logger.info(
                    "slotkit: scope %r backs off after %s%s; it steps back one level per "
                    "quiet BACKOFF_WINDOW (this is logged once per scope; the "
                    "throttling/backoff/* stats count every step)%s",
                    scope.id,
                    reason,
                    f" to {delay:.3g} s between requests" if isinstance(delay, float) else "",
                    "" if reason == "429" else _NOT_ABOUT_LOAD,
                )
        if self._config.debug:
            logger.info(
                "slotkit: scope %r %s after %s: %r",
                scope.id,
                "backs off" if stepped else "takes a trigger without a backoff step",
                reason,
                scope.manager,
            )
        return True

    def is_signal(self, response: Response, backoff: Mapping[str, ScopeBackoff] | None) -> bool:
        """Whether *response* asks the client to slow down and come back.

        A 429, or an error response that carried a wait hint. Such responses
        are what slotkit may re-send instead of handing on (where
        RetryMiddleware would retry them, see :mod:`slotkit.resend`).
        Only when the outcome made some scope wait, though: a 429 that
        triggers nothing (``throttling_dont_track``, a cached response, 429
        left out of ``BACKOFF_HTTP_CODES``) would be re-sent at once, over
        and over, so it is handed on like any other response.
        """
        if response.status < 400 or not backoff:
            return False
        if response.status == RATE_LIMITED:
            return any(record.trigger or record.delay for record in backoff.values())
        return any(record.delay is not None for record in backoff.values())


def _spent_count_only(record: ScopeBackoff) -> bool:
    """Whether *record*'s hold is just the server's spent count until its reset.

    Not a trigger, and no longer wait (a ``Retry-After`` beyond the reset)
    asked for: a budget keeps exactly that hold.
    """
    return (
        not record.trigger
        and record.remaining is not None
        and record.remaining < 1
        and record.reset is not None
        and record.delay is not None
        and record.delay <= record.reset
    )
