"""The pluggable parts of slotkit, as zope interfaces.

Two components can be replaced by users:

* the *throttling manager* (``THROTTLING_MANAGER``) decides which scopes a
  request belongs to and what a response or a download error says about them;
* a *scope manager* (``THROTTLING_SCOPE_MANAGER`` or a scope's ``"manager"``
  key) keeps the state of one scope and answers "may a request go now?".

slotkit drives both; neither reads a clock or arms a timer itself. Every
method that depends on time receives ``now`` (seconds, from the crawl's
``IReactorTime``), so a scope manager stays a pure state machine that tests
drive with :class:`twisted.internet.task.Clock`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["IThrottlingManager", "IThrottlingScopeManager"]


class IThrottlingScopeManager(Interface):
    """The state of one throttling scope: concurrency, delay, backoff, quota.

    A request may be sent when :meth:`can_send` answers ``0.0`` for every
    scope it belongs to. slotkit then calls :meth:`record_sent` on each of
    them, and :meth:`record_done` once the download has ended, whatever the
    outcome. It re-asks :meth:`can_send` when the wait it was given has
    elapsed and whenever the scope's state changed through one of the
    methods below, so an implementation never needs a timer of its own.
    """

    def from_crawler(crawler: Crawler, config: Any) -> IThrottlingScopeManager:
        """Build a scope manager (a class method).

        *config* is the scope's entry of ``THROTTLING_SCOPES`` merged with
        the defaults that apply to the scope, as a dict.
        """

    def can_send(now: float, amount: float | None) -> float:
        """Return how many seconds to wait before a request may be sent.

        ``0.0`` means "now". A positive finite number is a time-based wait
        (delay, backoff, quota window); slotkit asks again once it has passed.
        ``math.inf`` means the scope is full (for example every concurrency
        slot is taken) and only a state change, such as :meth:`record_done`,
        can free it. *amount* is the share of the scope's quota the request
        would consume; a request that names no amount counts as ``1.0``, so
        a ``quota`` is a number of requests unless amounts say otherwise.
        (slotkit passes ``1.0`` then; ``None`` only comes from other callers.)
        """

    def record_sent(now: float, amount: float | None) -> None:
        """Record that a request of this scope was dispatched at *now*, spending *amount*."""

    def record_done(now: float) -> None:
        """Record that a dispatched request of this scope has finished."""

    def record_backoff(delay: float | None, now: float) -> None:
        """Record a backoff trigger (a rate-limit response or a failure).

        With *delay* ``None`` the scope slows down by its own policy (one
        exponential backoff step for the default manager). With a number,
        nothing is sent for the scope until *delay* seconds after *now*, a
        hard hold that is never shortened by a later, smaller value.
        """

    def reconcile_quota(consumed: float | None, remaining: float | None, now: float) -> None:
        """Correct the quota used in the current window.

        *consumed* adds to (or, when negative, subtracts from) what was
        recorded; *remaining* says how much the server reports is left.
        """

    def set_base_delay(delay: float) -> None:
        """Change the configured delay of the scope at run time."""

    def set_concurrency(concurrency: int) -> None:
        """Change the concurrency limit of the scope at run time."""

    def is_idle(now: float, max_idle: float) -> bool:
        """Whether the scope's state may be forgotten.

        True only when nothing is in flight, no delay, hold or backoff is
        still running, and the scope has seen no dispatch for at least
        *max_idle* seconds. A forgotten scope is rebuilt from its
        configuration the next time a request needs it.
        """


class IThrottlingManager(Interface):
    """Maps requests to scopes and outcomes to scope updates (``THROTTLING_MANAGER``)."""

    def get_scopes(request: Request) -> Any:
        """Return the scopes of *request*.

        The result (or, for a coroutine or Deferred, what it resolves to) is
        ``None`` for no scope, a scope id, an iterable of scope ids, or a dict
        mapping scope ids to the quota amount the request consumes.
        """

    def get_response_backoff(response: Response) -> Any:
        """Return what *response* says about the scopes of its request.

        ``None`` when it says nothing; otherwise a dict mapping scope ids to
        :class:`slotkit.ScopeBackoff` records. May be a coroutine. The shapes
        of the upstream draft are read too: a scope id or an iterable of them
        (each backs off), and dict values that are ``None``, ``{}`` or plain
        dicts with ``"delay"``, ``"consumed"``, ``"remaining"`` (or
        ``"quota"``) and ``"trigger"`` keys (see :func:`slotkit.outcomes.as_backoff`).
        """

    def get_exception_backoff(request: Request, exception: BaseException) -> Any:
        """Like :meth:`get_response_backoff`, for a download that raised *exception*."""

    def delay_scope(scope: str, seconds: float) -> None:
        """Hold every request of *scope* for at least *seconds* from now.

        Counts as a backoff trigger and is not capped by ``BACKOFF_MAX_DELAY``.
        """

    crawler = Attribute("The crawler this manager throttles.")
