"""Re-sending rate-limited requests inside the downloader.

With Scrapy's defaults a page answered 429 three times is dropped by
RetryMiddleware, and every 429 it retries counts against ``RETRY_TIMES``
although the server only said "later". slotkit treats a rate-limit signal
(a 429, or an error response carrying a wait hint) as exactly that: the
scope backs off, and the same request goes back through the gate, so it is
sent again once the backoff allows. The response never reaches the
middlewares and costs no retry.

Limits, so that a site that never recovers cannot keep a crawl alive:

* ``BACKOFF_RESEND = False`` turns it off; ``RETRY_ENABLED = False`` or the
  ``dont_retry`` meta also hand the response on at once (the scope still
  backs off).
* A request stops being re-sent once ``BACKOFF_RESEND_TIMEOUT`` seconds have
  passed since it first reached the downloader; the last response then goes
  on as usual, logged and counted (``throttling/backoff/stalled``).
* A scope where a request stalled is marked stalled: its next signals are
  handed on at once, until one of its responses is not a signal.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response
    from twisted.internet.interfaces import IReactorTime

    from slotkit.registry import Scope
    from slotkit.stats import ThrottlingStats

logger = logging.getLogger("slotkit")

__all__ = ["Resender"]


class Resender:
    """Decides whether a rate-limited response is replaced by a new attempt."""

    def __init__(
        self,
        clock: IReactorTime,
        stats: ThrottlingStats,
        *,
        enabled: bool,
        timeout: float,
        retry_enabled: bool,
    ) -> None:
        self._clock = clock
        self._stats = stats
        self.enabled = enabled and retry_enabled
        self.timeout = timeout

    def should_resend(
        self, request: Request, response: Response, scopes: list[Scope], started: float
    ) -> bool:
        """True to send *request* again; False to hand *response* on."""
        if not self.enabled or request.meta.get("dont_retry"):
            return False
        if any(scope.stalled for scope in scopes):
            self._stats.inc("backoff/handed_on_stalled")
            return False
        waited = self._clock.seconds() - started
        if waited >= self.timeout:
            for scope in scopes:
                scope.stalled = True
            self._stats.inc("backoff/stalled")
            logger.warning(
                "slotkit: giving up re-sending %s after %.1fs of rate limiting "
                "(BACKOFF_RESEND_TIMEOUT=%gs); handing on its %d response. Scopes %s stay "
                "throttled.",
                request,
                waited,
                self.timeout,
                response.status,
                [scope.id for scope in scopes],
            )
            return False
        self._stats.inc("backoff/resent")
        return True

    @staticmethod
    def recovered(scopes: list[Scope]) -> None:
        """A response that was not a signal: the scopes are healthy again."""
        for scope in scopes:
            scope.stalled = False
