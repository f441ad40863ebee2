"""Which scopes a request belongs to, and what its outcome says about them.

:class:`ThrottlingManager` is the default ``THROTTLING_MANAGER``. Subclass it
and override :meth:`~ThrottlingManager.get_scopes` (sync or ``async``) to
group requests differently; the helpers :func:`scope_cache`,
:func:`add_scope` and :func:`update_scope_backoff` keep such overrides short.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Collection, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from scrapy.utils.httpobj import urlparse_cached
from zope.interface import implementer

from slotkit.awaitables import AwaitableDict, awaitable
from slotkit.clock import default_clock
from slotkit.dns import cached_ip
from slotkit.domains import registrable_domain
from slotkit.feedback import current_request
from slotkit.headers import RateLimitHint, parse_rate_limit_headers
from slotkit.interfaces import IThrottlingManager
from slotkit.outcomes import Backoff, ScopeBackoff, update_scope_backoff
from slotkit.scope_ids import (
    AUTO_SLOT,
    DOWNLOAD_SLOT,
    Scopes,
    add_scope,
    netloc_keys,
    netloc_of,
    normalize_scopes,
    scope_cache,
    scope_kind,
)
from slotkit.validation import finite_seconds, per_ip_limit

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from slotkit.backoff import BackoffRules

__all__ = [
    "ScopeBackoff",
    "Scopes",
    "ThrottlingManager",
    "add_scope",
    "normalize_scopes",
    "scope_cache",
    "scope_kind",
    "update_scope_backoff",
]

#: An outcome that says nothing about a scope; such records are left out.
_NOTHING = ScopeBackoff()


class _ScopeController(Protocol):
    """What the manager needs from the downloader that owns the scopes."""

    def hold_scope(self, scope: str, seconds: float) -> None: ...

    def scope_ids(self, request: Request) -> list[str]: ...

    def backoff_config(self, scope_id: str) -> BackoffRules: ...

    def now(self) -> float: ...

    def has_quota(self, scope_id: str) -> bool: ...

    def counts_requests(self, request: Request, scope_id: str) -> bool: ...

    def is_address_of_host(self, request: Request, scope_id: str) -> bool: ...


@implementer(IThrottlingManager)
class ThrottlingManager:
    """The default throttling manager: one scope per host name.

    In order, the scopes of a request are: the ``throttling_scopes`` meta if
    set (an empty set, list or dict counts as unset); else a ``download_slot``
    meta set by the user (Scrapy's way of naming a slot); else the request's
    host name, so every subdomain is its own scope (or its ``host:port`` when
    ``THROTTLING_SCOPES`` or ``DOWNLOAD_SLOTS`` has an entry named so).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._controller: _ScopeController | None = None
        settings = crawler.settings
        self._per_ip = per_ip_limit(settings) > 0
        self._registrable = settings.get("THROTTLING_DOMAIN_GROUPING") == "registrable_domain"
        self._netloc_sites = netloc_keys(settings)
        # One response is judged at a time; keeping its parsed headers lets
        # get_response_delay() and the quota bookkeeping share one parse.
        self._last_hint: tuple[Response, RateLimitHint] | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ThrottlingManager:
        return cls(crawler)

    def attach(self, controller: _ScopeController) -> None:
        """Connect the manager to the downloader that owns the scopes.

        slotkit's downloader calls it once, when it is built, before any
        request; :meth:`delay_scope` needs it. A manager of your own that
        does not subclass this one gets this method from it.
        """
        self._controller = controller

    def get_scopes(self, request: Request) -> Scopes:
        """Return the scopes of *request* (see the class docstring for the rules).

        The result can also be awaited (see :mod:`slotkit.awaitables`), so an
        ``async`` override may ``await super().get_scopes(request)``.

        With ``CONCURRENT_REQUESTS_PER_IP`` the address from Scrapy's DNS cache
        is a second scope; with ``THROTTLING_DOMAIN_GROUPING =
        "registrable_domain"`` the site scope is the registrable domain.
        """
        return awaitable(self._default_scopes(request))

    def _default_scopes(self, request: Request) -> Scopes:
        meta = request.meta
        scopes = meta.get("throttling_scopes")
        if isinstance(scopes, Iterator):
            # A generator or map() would be used up by its first reader (the
            # priority queue, say) and leave the download with no scope.
            scopes = meta["throttling_scopes"] = list(scopes)
        if scopes is not None and not _empty_collection(scopes):
            return scopes
        slot = meta.get(DOWNLOAD_SLOT)
        if slot is not None and slot != meta.get(AUTO_SLOT):
            return str(slot)
        parsed = urlparse_cached(request)
        host = parsed.hostname or ""
        netloc_site = (
            self._netloc_sites.get(netloc_of(parsed.netloc)) if self._netloc_sites else None
        )
        if netloc_site is not None:
            # A THROTTLING_SCOPES / DOWNLOAD_SLOTS entry named "host:port" (the
            # spec's recipes name sites by netloc): that port's requests get it.
            site = netloc_site
        else:
            site = registrable_domain(host) if self._registrable else host
        if self._per_ip:
            address = cached_ip(host)
            if address is not None and address != site:
                return [site, address]
        return site

    def get_response_backoff(self, response: Response) -> Backoff:
        """What *response* says about its request's scopes (empty: nothing).

        The result is a dict that can also be awaited, so ``async`` overrides
        may ``await super().get_response_backoff(response)``.

        * Every scope whose backoff ``http_codes`` contain the status is
          triggered; a wait hint in the headers (``Retry-After``,
          ``RateLimit``, ``X-RateLimit-*`` ...) becomes its hard minimum. Not
          the IP scope of a host name: other sites share that address.
        * Every scope with a quota takes the server's remaining count
          (``RateLimit`` / ``X-RateLimit-Remaining``) as the truth, and every
          scope the request spends one unit in sends no more than that count
          (less what left since) until the server's reset.
        * A server that says its quota is spent (remaining ``0``) and when it
          resets holds every scope the request spends one unit in until
          then, with or without a quota configured: the next request would
          only be answered 429. Not the IP scope of a host name (unless it
          counts a quota): other sites on that address have quotas of their own.
        * Responses served from HttpCacheMiddleware's cache and requests with
          the ``throttling_dont_track`` meta never change anything.
        """
        controller = self._controller
        request = _request_of(response)
        if (
            controller is None
            or request is None
            or _dont_track(request)
            or "cached" in response.flags
        ):
            return AwaitableDict()
        result: dict[str, ScopeBackoff] = {}
        hint: RateLimitHint | None = None
        wait: float | None = None
        for scope_id in controller.scope_ids(request):
            status_trigger = controller.backoff_config(scope_id).is_trigger_status(response.status)
            # Rate-limit headers count requests: a scope this request spends a
            # cost in (the spec's cost recipe) is reconciled by its own rules.
            counted = controller.counts_requests(request, scope_id)
            if not (status_trigger or counted):
                continue
            # A response speaks for its site, not for the machine behind it: the
            # IP scope of a host name, shared by other sites, is not backed off
            # by it (a probe: one site's 503s took another site on the same
            # address from 0.2 s to 105 s). Failed connections still count.
            shared_address = controller.is_address_of_host(request, scope_id)
            trigger = status_trigger and not shared_address
            if not (trigger or counted):
                continue
            if hint is None:  # parsed only when some scope can use it
                hint = self._hint(response)
                wait = self._response_delay(response)
            record = ScopeBackoff(trigger=trigger, delay=wait if trigger else None)
            # The server's counts: a spent one holds the scope until its reset, a
            # remaining one is the truth for a quota and a budget until the
            # reset. Not for the IP scope of a host name unless it counts a
            # quota of its own: the sites sharing an address keep quotas of theirs.
            if counted and (not shared_address or controller.has_quota(scope_id)):
                if hint.exhausted and record.delay is None:
                    record = replace(record, delay=hint.delay)
                if hint.remaining is not None:
                    record = replace(
                        record, remaining=hint.remaining, reset=hint.reset, limit=hint.limit
                    )
            if record != _NOTHING:
                result[scope_id] = record
        return AwaitableDict(result)

    def get_response_delay(self, response: Response) -> float | None:
        """Seconds *response* asks the client to wait, or ``None`` if it names none.

        Read from ``Retry-After`` (seconds or an HTTP date), ``RateLimit-Reset``,
        the ``RateLimit`` field and ``X-RateLimit-Reset``; the largest wins.
        Values that cannot be used (garbage, negative, a date in the past)
        count as none. :meth:`get_response_backoff` asks this method, so an
        override (a custom wait header, say) changes what slotkit honours.
        """
        return self._hint(response).delay

    def _response_delay(self, response: Response) -> float | None:
        """:meth:`get_response_delay`, checked when a subclass overrides it: a
        header's raw bytes (``response.headers.get(...)``) would otherwise fail
        the request with a bare ``TypeError`` from deep inside the backoff."""
        method = self.get_response_delay
        wait = method(response)
        if (
            wait is None
            or getattr(method, "__func__", None) is ThrottlingManager.get_response_delay
        ):
            return wait
        seconds = math.nan
        if not isinstance(wait, (bool, str, bytes)):
            # Any real number will do: Fraction, Decimal, numpy's floats.
            with contextlib.suppress(TypeError, ValueError, OverflowError):
                seconds = float(wait)
        if not 0 <= seconds < math.inf:
            owner = getattr(method, "__self__", self)
            name = owner.__name__ if isinstance(owner, type) else type(owner).__name__
            raise ValueError(
                f"{name}.get_response_delay() must return None or a finite "
                f"number of seconds >= 0, got {wait!r} (a header's value is bytes: "
                "convert it with float(), and return None when it is missing or unusable)"
            )
        return seconds

    def _hint(self, response: Response) -> RateLimitHint:
        """The rate-limit headers of *response*, parsed once per response."""
        cached = self._last_hint
        if cached is not None and cached[0] is response:
            return cached[1]
        # Outside slotkit's downloader there is no controller: read the crawl's clock.
        now = self._controller.now() if self._controller is not None else default_clock().seconds()
        hint = parse_rate_limit_headers(response.headers, now=now)
        self._last_hint = (response, hint)
        return hint

    def get_exception_backoff(self, request: Request, exception: BaseException) -> Backoff:
        """What a download failure says about the request's scopes (empty: nothing).

        Every scope whose backoff ``exceptions`` match *exception* is triggered.
        """
        if _dont_track(request) or self._controller is None:
            return AwaitableDict()
        triggered = [
            scope_id
            for scope_id in self._controller.scope_ids(request)
            if self._controller.backoff_config(scope_id).is_trigger_exception(exception)
        ]
        return AwaitableDict(dict.fromkeys(triggered, ScopeBackoff(trigger=True)))

    def delay_scope(self, scope: str, seconds: float) -> None:
        """Hold every request of *scope* for at least *seconds* from now.

        Raises :class:`TypeError` for a scope that is not a ``str`` or seconds
        given as text, and :class:`ValueError` for an empty scope id or seconds
        that are not a finite number >= 0.
        """
        if not isinstance(scope, str):
            raise TypeError(f"delay_scope() needs a scope id (a str), got {scope!r}")
        if not scope:
            raise ValueError("delay_scope(''): a scope id cannot be empty")
        if isinstance(seconds, (str, bytes)):
            # A number, as the signature says: "3" is more likely a bug upstream.
            raise TypeError(f"delay_scope({scope!r}, {seconds!r}): seconds must be a number")
        held = finite_seconds(seconds)
        if held is None:
            raise ValueError(
                f"delay_scope({scope!r}, {seconds!r}): seconds must be a finite number >= 0"
            )
        if self._controller is None:
            raise RuntimeError(
                "delay_scope() needs slotkit's downloader: set DOWNLOADER = 'slotkit.Downloader'"
            )
        self._controller.hold_scope(scope, held)


def _dont_track(request: Request) -> bool:
    """``throttling_dont_track``, or AutoThrottle's ``autothrottle_dont_adjust_delay``."""
    meta = request.meta
    return bool(meta.get("throttling_dont_track") or meta.get("autothrottle_dont_adjust_delay"))


def _request_of(response: Response) -> Request | None:
    """The request being judged, else the response's own.

    At the downloader's stage Scrapy has not set ``response.request`` yet,
    and a response built anew by a manager (the "upstream status" recipe)
    never has one, so the downloader says which request it is judging.
    """
    return current_request.get() or getattr(response, "request", None)


def build_manager(crawler: Crawler, cls: type | None) -> Any:
    """Instantiate ``THROTTLING_MANAGER`` (see :mod:`slotkit.manager_loading`)."""
    from slotkit.manager_loading import build_manager as build

    return build(crawler, cls)


def _empty_collection(value: object) -> bool:
    """Whether a ``throttling_scopes`` value is an empty collection (set, list,
    dict, ``dict.keys()``, ``range(0)`` ...).

    A scope list built in code may come out empty. Taking that as "no scopes"
    would send the request with no limit at all, silently; the request keeps
    its site's scope instead. (An empty string is a bad id and fails the request.)
    """
    return isinstance(value, Collection) and not isinstance(value, str) and len(value) == 0
