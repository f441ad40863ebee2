"""Which scopes a request belongs to, and what its outcome says about them.

:class:`ThrottlingManager` is the default ``THROTTLING_MANAGER``. Subclass it
and override :meth:`~ThrottlingManager.get_scopes` (sync or ``async``) to
group requests differently; the helpers :func:`scope_cache`,
:func:`add_scope` and :func:`update_scope_backoff` keep such overrides short.
"""

from __future__ import annotations

import functools
import inspect
import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from weakref import WeakKeyDictionary

from scrapy.utils.httpobj import urlparse_cached
from zope.interface import implementer

from slotkit.awaitables import AwaitableDict, awaitable
from slotkit.dns import cached_ip
from slotkit.domains import registrable_domain
from slotkit.feedback import current_request
from slotkit.headers import RateLimitHint, parse_rate_limit_headers
from slotkit.interfaces import IThrottlingManager
from slotkit.settings import CUSTOM, DOMAIN, IP

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from slotkit.backoff import BackoffConfig

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

#: What ``get_scopes`` may return: nothing, one id, several ids, or ids with quota amounts.
Scopes = None | str | Iterable[str] | Mapping[str, float | None]

#: The meta key of Scrapy's download slot, still honoured.
DOWNLOAD_SLOT = "download_slot"
#: Where slotkit records the slot key it wrote into ``download_slot`` itself, so
#: that a redirect to another host is not pinned to the old host's scope.
AUTO_SLOT = "_slotkit_auto_slot"

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_-]{1,63})*\.?$", re.I)


def scope_kind(scope_id: str) -> str:
    """Guess the kind of a scope from its id: an IP address, a host name, or custom.

    Kinds only choose the default concurrency (``CONCURRENT_REQUESTS_PER_IP``,
    ``CONCURRENT_REQUESTS_PER_DOMAIN`` or ``THROTTLING_SCOPE_CONCURRENCY``).
    A host name has a dot or is ``localhost``; ``api`` or
    ``api.example/endpoint`` are custom scopes.
    """
    try:
        ipaddress.ip_address(scope_id.strip("[]"))
    except ValueError:
        pass
    else:
        return IP
    if scope_id == "localhost" or ("." in scope_id and _HOSTNAME.match(scope_id)):
        return DOMAIN
    return CUSTOM


def normalize_scopes(scopes: object, *, where: str = "get_scopes()") -> dict[str, float | None]:
    """Turn any accepted scopes value into ``{scope id: quota amount or None}``.

    Order is kept (the first scope is the request's primary scope, the one
    reported as its ``download_slot``). Bad values raise :class:`TypeError`
    naming *where* they came from.
    """
    if scopes is None:
        return {}
    if isinstance(scopes, str):
        return {scopes: None}
    if isinstance(scopes, Mapping):
        result: dict[str, float | None] = {}
        for key, amount in scopes.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} returned a non-string scope id {key!r}")
            if amount is not None and (
                isinstance(amount, bool) or not isinstance(amount, (int, float))
            ):
                raise TypeError(
                    f"{where} gave scope {key!r} the amount {amount!r}; expected a number"
                )
            result[key] = None if amount is None else float(amount)
        return result
    if isinstance(scopes, Iterable):
        result = {}
        for key in scopes:
            if not isinstance(key, str):
                raise TypeError(f"{where} returned a non-string scope id {key!r}")
            result[key] = None
        return result
    raise TypeError(
        f"{where} must return None, a scope id, an iterable of ids or a dict of id -> amount "
        f"(got {scopes!r})"
    )


def add_scope(scopes: Scopes, scope: str, amount: float | None = None) -> Scopes:
    """Return *scopes* with *scope* added (with a quota *amount* if given).

    Accepts and returns every form ``get_scopes`` may return; the input is
    never modified. A dict is returned when either side carries amounts.
    """
    current = normalize_scopes(scopes, where="add_scope()")
    if amount is None and all(value is None for value in current.values()):
        return [*current, scope] if scope not in current else list(current)
    current[scope] = None if amount is None else float(amount)
    return current


_M = TypeVar("_M")
_R = TypeVar("_R")


def scope_cache(
    method: Callable[[_M, Request], Awaitable[_R] | _R],
) -> Callable[[_M, Request], Awaitable[_R] | _R]:
    """Cache ``get_scopes`` per request object (sync or ``async`` methods alike).

    The scopes of a request are asked for once per trip through the
    downloader; the cache makes repeated calls (from a priority queue, say)
    free. A retried or redirected request is a new object and is asked again.
    """
    cache: WeakKeyDictionary[Request, Any] = WeakKeyDictionary()

    if inspect.iscoroutinefunction(method):
        # Stay a coroutine function, so callers can tell it must be awaited.
        @functools.wraps(method)
        async def async_wrapper(self: _M, request: Request) -> Any:
            try:
                return cache[request]
            except KeyError:
                pass
            value = await method(self, request)
            cache[request] = value
            return value

        return async_wrapper

    @functools.wraps(method)
    def wrapper(self: _M, request: Request) -> Awaitable[_R] | _R:
        try:
            return cache[request]  # type: ignore[no-any-return]
        except KeyError:
            pass
        result = method(self, request)
        if isinstance(result, Awaitable):
            return _cache_awaited(cache, request, result)
        cache[request] = result
        return result

    return wrapper


async def _cache_awaited(
    cache: WeakKeyDictionary[Any, Any], request: Any, pending: Awaitable[Any]
) -> Any:
    value = await pending
    cache[request] = _Ready(value)
    return value


class _Ready:
    """An awaitable that yields an already known value, any number of times."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Any:
        return self.value
        yield  # pragma: no cover - makes this a generator


@dataclass(frozen=True, slots=True)
class ScopeBackoff:
    """What one outcome says about one scope.

    ``trigger``: slow the scope down one backoff step. ``delay``: hold it at
    least this many seconds (a server hint). ``consumed`` / ``remaining``:
    correct its quota bookkeeping.
    """

    trigger: bool = False
    delay: float | None = None
    consumed: float | None = None
    remaining: float | None = None


_NOTHING = ScopeBackoff()

#: What ``get_response_backoff`` returns: ``None`` or scope id -> :class:`ScopeBackoff`.
Backoff = Mapping[str, ScopeBackoff] | None


def update_scope_backoff(
    backoff: Backoff,
    scope: str,
    *,
    trigger: bool | None = None,
    delay: float | None = None,
    consumed: float | None = None,
    remaining: float | None = None,
) -> dict[str, ScopeBackoff]:
    """Return *backoff* with the record of *scope* updated; the input is not modified."""
    result = dict(backoff or {})
    record = result.get(scope, ScopeBackoff())
    changes: dict[str, Any] = {}
    if trigger is not None:
        changes["trigger"] = trigger
    if delay is not None:
        changes["delay"] = delay
    if consumed is not None:
        changes["consumed"] = (record.consumed or 0.0) + consumed
    if remaining is not None:
        changes["remaining"] = remaining
    result[scope] = replace(record, **changes)
    return result


class _ScopeController(Protocol):
    """What the manager needs from the downloader that owns the scopes."""

    def hold_scope(self, scope: str, seconds: float) -> None: ...

    def scope_ids(self, request: Request) -> list[str]: ...

    def backoff_config(self, scope_id: str) -> BackoffConfig: ...

    def now(self) -> float: ...

    def has_quota(self, scope_id: str) -> bool: ...


@implementer(IThrottlingManager)
class ThrottlingManager:
    """The default throttling manager: one scope per host name.

    In order, the scopes of a request are: the ``throttling_scopes`` meta if
    set; else a ``download_slot`` meta set by the user (Scrapy's way of
    naming a slot); else the request's host name, so every subdomain is its
    own scope.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._controller: _ScopeController | None = None
        settings = crawler.settings
        self._per_ip = settings.getint("CONCURRENT_REQUESTS_PER_IP") > 0
        self._registrable = settings.get("THROTTLING_DOMAIN_GROUPING") == "registrable_domain"

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ThrottlingManager:
        return cls(crawler)

    def attach(self, controller: _ScopeController) -> None:
        """Connect the manager to the downloader that owns the scopes."""
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
        if scopes is not None:
            return scopes  # type: ignore[no-any-return]
        slot = meta.get(DOWNLOAD_SLOT)
        if slot is not None and slot != meta.get(AUTO_SLOT):
            return str(slot)
        host = urlparse_cached(request).hostname or ""
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
          ``RateLimit``, ``X-RateLimit-*`` ...) becomes its hard minimum.
        * Every scope with a quota takes the server's remaining count
          (``RateLimit`` / ``X-RateLimit-Remaining``) as the truth, and an
          exhausted quota holds the scope until the reported reset.
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
        for scope_id in controller.scope_ids(request):
            trigger = controller.backoff_config(scope_id).is_trigger_status(response.status)
            quota = controller.has_quota(scope_id)
            if not (trigger or quota):
                continue
            if hint is None:  # parsed only when some scope can use it
                hint = parse_rate_limit_headers(response.headers, now=controller.now())
            record = ScopeBackoff(trigger=trigger, delay=hint.delay if trigger else None)
            if quota and hint.remaining is not None:
                exhausted_wait = hint.delay if hint.remaining == 0 else None
                record = replace(
                    record, remaining=hint.remaining, delay=record.delay or exhausted_wait
                )
            if record != _NOTHING:
                result[scope_id] = record
        return AwaitableDict(result)

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
        """Hold every request of *scope* for at least *seconds* from now."""
        if self._controller is None:
            raise RuntimeError(
                "delay_scope() needs slotkit's downloader: set DOWNLOADER = 'slotkit.Downloader'"
            )
        self._controller.hold_scope(scope, float(seconds))


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


class _DuckManager(ThrottlingManager):
    """Adapts a user class that only defines ``get_scopes`` or ``get_request_scopes``."""

    def __init__(self, crawler: Crawler, inner: Any) -> None:
        super().__init__(crawler)
        self.inner = inner
        self._method = getattr(inner, "get_scopes", None) or inner.get_request_scopes

    def get_scopes(self, request: Request) -> Scopes:
        return self._method(request)  # type: ignore[no-any-return]


def build_manager(crawler: Crawler, cls: type | None) -> Any:
    """Instantiate ``THROTTLING_MANAGER``, adapting duck-typed classes, refusing others."""
    from scrapy.utils.misc import build_from_crawler

    from slotkit.settings import SettingsError

    if cls is None:
        return ThrottlingManager(crawler)
    if isinstance(cls, type) and issubclass(cls, ThrottlingManager):
        return build_from_crawler(cls, crawler)
    has_scopes = callable(getattr(cls, "get_scopes", None)) or callable(
        getattr(cls, "get_request_scopes", None)
    )
    if not has_scopes:
        raise SettingsError(
            f"THROTTLING_MANAGER {cls.__module__}.{cls.__qualname__} does not provide "
            "slotkit.interfaces.IThrottlingManager: it needs at least a get_scopes(request) "
            "method (subclass slotkit.ThrottlingManager to inherit the rest)"
        )
    instance = (
        build_from_crawler(cls, crawler)
        if hasattr(cls, "from_crawler")
        else _instantiate(cls, crawler)
    )
    if IThrottlingManager.providedBy(instance) or all(
        callable(getattr(instance, name, None))
        for name in ("get_scopes", "get_response_backoff", "get_exception_backoff", "delay_scope")
    ):
        return instance
    return _DuckManager(crawler, instance)


def _instantiate(cls: type, crawler: Crawler) -> Any:
    try:
        return cls(crawler)
    except TypeError:
        return cls()
