"""Re-sending rate-limited requests inside the downloader.

With Scrapy's defaults a page answered 429 three times is dropped by
RetryMiddleware, and every 429 it retries counts against ``RETRY_TIMES``
although the server only said "later". slotkit treats a rate-limit signal
(a 429, or an error response carrying a wait hint) as exactly that: the
scope backs off, and the same request goes back through the gate, so it is
sent again once the backoff allows. The response is not handed to the
middlewares (only ``DownloaderStats`` counts it, see below) and costs no
retry.

Limits, so that a site that never recovers cannot keep a crawl alive:

* A response is re-sent only where Scrapy's ``RetryMiddleware`` (or a
  subclass keeping its ``process_response`` and ``_retry``) would have
  retried it: the middleware is enabled, the status is
  in its ``RETRY_HTTP_CODES``, the request has no ``dont_retry`` meta and
  its ``retry_times`` is still below ``max_retry_times`` (meta) or
  ``RETRY_TIMES``. So every way a project switches retrying off for a
  response switches re-sending off too; ``BACKOFF_RESEND = False`` turns it
  off alone. The scope backs off either way.
* A request stops being re-sent once ``BACKOFF_RESEND_TIMEOUT`` seconds have
  passed since its first rate-limited response (the time it queued before
  that is not rate limiting); the last response then goes on as usual,
  logged and counted (``throttling/backoff/stalled``).
* A re-sent request keeps its place among the scope's waiting requests:
  queued behind newcomers, it would take the 429s for all of them.
* A scope where a request stalled is marked stalled: its next signals are
  handed on at once, until one of its responses is not a signal.
* After three re-sends in a row that went out quickly (each waited less
  than ``QUICK_RESEND``, 0.1 s: a custom scope manager that takes no
  backoff, such as the spec's fixed-window one, or a server's reset of a
  few milliseconds), the next rate-limited answer is handed on
  (``throttling/backoff/handed_on_unheld``): re-sent again and again the
  request would ask as fast as the server answers.
* Cookies follow the re-send as they follow a retry: a re-send goes out
  below the middlewares, so slotkit hands the answer to the crawl's
  ``CookiesMiddleware`` (its jar keeps what ``Set-Cookie`` set) and lets it
  write the re-sent request's ``Cookie`` header again. A 429 that sets a
  cookie is often a challenge the next attempt must answer with it.

Any other middleware that changes each attempt in ``process_request``
(rotating user agents or proxies) does not see the re-sends either; such a
project sets ``BACKOFF_RESEND = False``, or does its rotation in a
``RetryMiddleware`` subclass, to whose rules slotkit leaves every response.

The attempt that was answered still went over the wire, so it is counted
in Scrapy's ``downloader/request_count``, ``downloader/response_status_count/...``
and byte stats (through ``DownloaderStats`` itself, when enabled), though
no retry is counted.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.downloadermiddlewares.stats import DownloaderStats
from scrapy.utils.request import request_httprepr

if TYPE_CHECKING:
    from collections.abc import Iterable

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
        middlewares: Iterable[Any] = (),
        retry_enabled: bool = True,
    ) -> None:
        self._clock = clock
        self._stats = stats
        self.timeout = timeout
        middlewares = list(middlewares)
        retries = [mw for mw in middlewares if isinstance(mw, RetryMiddleware)]
        #: The crawl's RetryMiddleware (None: retrying is off, so is re-sending).
        self._retry: RetryMiddleware | None = retries[0] if retries else None
        #: The crawl's CookiesMiddleware, which a re-send must pass as a retry would.
        self._cookies: CookiesMiddleware | None = next(
            (mw for mw in middlewares if isinstance(mw, CookiesMiddleware)), None
        )
        self._downloader_stats: DownloaderStats | None = next(
            (mw for mw in middlewares if isinstance(mw, DownloaderStats)), None
        )
        # A subclass that decides for itself (never retry a 429, rotate a proxy
        # first): re-sending behind its back would skip its rules. Any of them
        # (one added beside the stock middleware sees the responses too).
        own = next(
            ((type(mw), rules) for mw in retries if (rules := _custom_retry_rules(type(mw)))),
            None,
        )
        if own is not None and enabled:
            cls, rules = own
            logger.info(
                "slotkit: %s.%s overrides RetryMiddleware's %s, so rate-limited "
                "responses are handed to it, not re-sent (BACKOFF_RESEND)",
                cls.__module__,
                cls.__qualname__,
                " and ".join(rules),
            )
        self.enabled = enabled and self._retry is not None and own is None
        if self.enabled:
            _name_unseeing_middlewares(middlewares)
        if enabled and retry_enabled and self._retry is None:
            # A project that replaced RetryMiddleware by a class of its own:
            # slotkit cannot know its rules, so it leaves every response to it.
            logger.info(
                "slotkit: no RetryMiddleware (or subclass) among the downloader "
                "middlewares, so rate-limited responses are handed on, not re-sent "
                "(BACKOFF_RESEND)"
            )

    def should_resend(
        self, request: Request, response: Response, scopes: list[Scope], limited_since: float
    ) -> bool:
        """True to send *request* again; False to hand *response* on.

        *limited_since*: when the first rate-limit signal for this request came.
        """
        if not self.enabled or not self._retry_would_take(request, response):
            return False
        if any(scope.stalled for scope in scopes):
            self._stats.inc("backoff/handed_on_stalled")
            return False
        waited = self._clock.seconds() - limited_since
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
        self._carry_cookies(request, response)
        logger.debug(
            "slotkit: %s answered %d (rate limited); sending it again once %s allow "
            "(BACKOFF_RESEND; not counted as a retry)",
            request,
            response.status,
            [scope.id for scope in scopes],
        )
        return True

    def unheld(self, request: Request, response: Response, scopes: list[Scope]) -> None:
        """*request*'s last re-sends went out quickly and it was rate limited
        again: its *response* is handed on (see the module's limits)."""
        self._stats.inc("backoff/handed_on_unheld")
        logger.debug(
            "slotkit: %s answered %d again, and nothing in %s held its re-sends back "
            "(a scope manager that takes no backoff, or a server's wait of "
            "milliseconds?); handing it on to the retry middleware",
            request,
            response.status,
            [scope.id for scope in scopes],
        )

    def _retry_would_take(self, request: Request, response: Response) -> bool:
        """Whether RetryMiddleware would retry *response* now (its own rules)."""
        retry = self._retry
        meta = request.meta
        if retry is None or meta.get("dont_retry", False):
            return False
        if response.status not in getattr(retry, "retry_http_codes", ()):
            return False
        max_times = meta.get("max_retry_times")
        if max_times is None:
            max_times = getattr(retry, "max_retry_times", 0)
        return bool(meta.get("retry_times", 0) + 1 <= max_times)

    def _carry_cookies(self, request: Request, response: Response) -> None:
        """Do for the re-send what CookiesMiddleware does for a retry.

        Its ``process_response`` keeps the cookies *response* set in the jar,
        and its ``process_request`` writes the request's ``Cookie`` header
        from the jar again (both honour ``dont_merge_cookies``).
        """
        cookies = self._cookies
        if cookies is None:
            return
        cookies.process_response(request, response)
        cookies.process_request(request)

    def count_answer(self, request: Request, response: Response, *, resent: bool) -> None:
        """Count an answer that never reaches the middlewares in Scrapy's downloader stats.

        *resent*: the attempt replacing it is about to be sent, and is counted too.
        """
        counter = self._downloader_stats
        if counter is None:
            return
        counter.process_response(request, response)
        if resent:
            counter.process_request(request)

    def uncount_unsent(self, request: Request) -> None:
        """Take back what Scrapy's downloader stats counted of a request that never went.

        Put back in the scheduler at a pause, it is counted when the resumed
        crawl sends it; counted now too, ``downloader/request_count`` would
        exceed the responses and exceptions by every request put back.
        """
        counter = self._downloader_stats
        if counter is None:
            return
        stats = counter.stats
        stats.inc_value("downloader/request_count", -1)
        stats.inc_value(f"downloader/request_method_count/{request.method}", -1)
        stats.inc_value("downloader/request_bytes", -len(request_httprepr(request)))

    @staticmethod
    def recovered(scopes: list[Scope]) -> None:
        """A response that was not a signal: the scopes are healthy again."""
        for scope in scopes:
            scope.stalled = False


#: RetryMiddleware's methods that decide whether and how a response is retried.
RETRY_DECISIONS = ("process_response", "_retry")


def _custom_retry_rules(cls: type) -> tuple[str, ...]:
    """The deciding methods *cls*, a RetryMiddleware subclass, defines itself."""
    return tuple(
        name
        for name in RETRY_DECISIONS
        if getattr(cls, name, None) is not getattr(RetryMiddleware, name, None)
    )


def _name_unseeing_middlewares(middlewares: Iterable[Any]) -> None:
    """Say at start which of the project's middlewares will not see re-sent attempts.

    Rotating user agents or proxies, or detecting bans, in
    ``process_request``/``process_response`` is common, and with Scrapy's
    downloader each retry of a 429 passes through them. A re-send does not,
    so a project relying on that learns it here, with the switch to use.
    """
    own = [
        f"{type(mw).__module__}.{type(mw).__qualname__}"
        for mw in middlewares
        if not type(mw).__module__.startswith(("scrapy.", "slotkit."))
        and not isinstance(mw, RetryMiddleware)
        and (hasattr(mw, "process_request") or hasattr(mw, "process_response"))
    ]
    if own:
        logger.info(
            "slotkit: rate-limited responses are re-sent below the downloader "
            "middlewares, so %s will not see the re-sent attempts or their 429s; "
            "set BACKOFF_RESEND = False if they rotate user agents or proxies, or "
            "detect bans, per attempt",
            ", ".join(own),
        )
