"""Scope ids: what ``get_scopes`` may return, and the helpers that build such values.

:func:`normalize_scopes` turns every accepted form into one shape,
:func:`add_scope` extends any form, :func:`scope_cache` memoizes a
``get_scopes`` override per request, and :func:`scope_kind` tells a host,
an IP address and a custom scope apart (the kind picks default limits).
"""

from __future__ import annotations

import functools
import inspect
import ipaddress
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from weakref import WeakKeyDictionary

from slotkit.settings import CUSTOM, DOMAIN, IP

if TYPE_CHECKING:
    from scrapy import Request

__all__ = [
    "AUTO_SLOT",
    "DOWNLOAD_SLOT",
    "Scopes",
    "add_scope",
    "held_site_ids",
    "host_of_netloc",
    "netloc_keys",
    "netloc_of",
    "normalize_scopes",
    "scope_cache",
    "scope_kind",
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
    A host name has a dot or is ``localhost``; ``api`` or ``cost`` are
    custom scopes. A ``host:port`` id (a URL's ``netloc``, as the spec's
    recipes return) is a site, so a domain scope, whether its host is a
    name or an address; so is an endpoint of a site, ``host/path`` (the
    spec's endpoint recipe treats endpoints "as different domains").
    The empty id, the scope of URLs without a host (``data:``, ``file:``),
    is a domain scope too, as Scrapy's slot ``""`` is.
    """
    if not scope_id:
        return DOMAIN
    if host_of_netloc(scope_id) is not None:
        return DOMAIN
    site, slash, _ = scope_id.partition("/")
    if slash and site and scope_kind(site) != CUSTOM:
        return DOMAIN
    # Only ids that start like an address can be one: skipping the parse (and
    # its exception) for host names keeps scope creation cheap at 10k+ hosts.
    if scope_id[:1].isdigit() or scope_id[:1] == "[" or ":" in scope_id:
        try:
            ipaddress.ip_address(scope_id.strip("[]"))
        except ValueError:
            pass
        else:
            return IP
    if scope_id == "localhost" or ("." in scope_id and _HOSTNAME.match(scope_id)):
        return DOMAIN
    return CUSTOM


def is_single_label_site(scope_id: str, host: str | None) -> bool:
    """Whether *scope_id* is the request's own single-label *host*.

    A host such as ``vm`` (a docker-compose service, an intranet name) has no
    dot to tell it from a custom scope such as ``api``; being the request's
    own host says it is a site, and so does ``host:port`` (a URL's ``netloc``,
    as the spec's recipe returns it). An IPv6 address has no dot either, but is
    an address: its scope stays an IP scope (``CONCURRENT_REQUESTS_PER_IP``,
    shared with the names that resolve to it).
    """
    if "." in scope_id or not host or scope_kind(scope_id) == IP:
        return False
    if scope_id == host:
        return True
    # "svc:8080": a URL's netloc, as the spec's recipe returns it.
    name, colon, port = scope_id.rpartition(":")
    return bool(colon) and port.isdigit() and name == host


def host_of_netloc(scope_id: str) -> str | None:
    """The host of a ``host:port`` scope id (``"[::1]:8080"`` gives ``"::1"``), else ``None``.

    Default scopes are host names, as Scrapy's slots are, while a URL's
    ``netloc`` keeps an explicit port; this tells the two apart.
    """
    host, sep, port = scope_id.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return None  # a bare IPv6 address, not host:port
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost" and not ("." in host and _HOSTNAME.match(host)):
            return None
    return host


def held_site_ids(scope_id: str, netloc_scopes: Mapping[str, str] | None = None) -> list[str]:
    """The scope ids ``delay_scope(scope_id, ...)`` holds: the id itself and,
    when it names a site, the host scope that site's requests go through
    (last in the list).

    A URL's ``netloc`` (the spec's recipe) keeps its port and case, while
    default scopes are lower-case host names; a single-label host
    (``svc:8080``, as service names go in a compose network) counts too,
    which :func:`host_of_netloc` leaves alone for settings keys. A
    ``host:port`` settings key (*netloc_scopes*, see :func:`netloc_keys`)
    is that port's requests' scope id as written, in whatever case
    (``"API.example.com:8443"``): the recipe's lower-case netloc holds it.
    """
    ids = [scope_id]
    written = (netloc_scopes or {}).get(scope_id.lower())
    if written is not None and written != scope_id:
        ids.append(written)
    host, sep, port = scope_id.rpartition(":")
    site = host_of_netloc(scope_id)
    if site is None and sep and port.isdigit() and _HOSTNAME.match(host):
        site = host
    if site is None and scope_kind(scope_id) == DOMAIN:
        site = scope_id  # a host name given in another case
    if site is not None:
        site = site.lower()
        if site not in ids:
            ids.append(site)
    return ids


def netloc_of(netloc: str) -> str:
    """A URL's ``netloc`` as a scope id: lower-case, without any ``user:password@``."""
    return netloc.rpartition("@")[2].lower()


def netloc_keys(settings: Any) -> dict[str, str]:
    """The ``THROTTLING_SCOPES`` / ``DOWNLOAD_SLOTS`` keys naming a ``host:port``, by netloc.

    Default scopes are host names, as Scrapy's slots are, but the spec's
    recipes name sites by ``netloc``: a request to a port named so gets that
    entry's scope (the key as written) instead of its host's. Maps the
    lower-case netloc to the key.
    """
    keys: dict[str, str] = {}
    for name in ("THROTTLING_SCOPES", "DOWNLOAD_SLOTS"):
        try:
            table = settings.getdict(name)
        except (TypeError, ValueError):
            continue  # validated (and reported) by the downloader's settings
        for key in table:
            if not isinstance(key, str):
                continue
            # "svc:8080" too: a single-label host (a compose service) with a port.
            host, colon, port = key.rpartition(":")
            if host_of_netloc(key) or (colon and port.isdigit() and _HOSTNAME.match(host)):
                keys.setdefault(key.lower(), key)
    return keys


def normalize_scopes(
    scopes: object, *, where: str = "get_scopes()", empty_ok: bool = True
) -> dict[str, float | None]:
    """Turn any accepted scopes value into ``{scope id: quota amount or None}``.

    Order is kept (the first scope is the request's primary scope, the one
    reported as its ``download_slot``); a set, having none, is taken sorted.
    Bad values raise :class:`TypeError` naming *where* they came from, and
    so does an empty id unless *empty_ok* (a manager may give ``""``: the
    site of a URL with no host, such as ``data:``; a user's meta may not,
    as ``THROTTLING_SCOPES`` refuses it).
    """
    result = _normalized(scopes, where)
    if not empty_ok and "" in result:
        raise TypeError(f"{where} gave an empty scope id; a scope id is a non-empty str")
    return result


def _normalized(scopes: object, where: str) -> dict[str, float | None]:
    if scopes is None:
        return {}
    if isinstance(scopes, str):
        return {scopes: None}
    if isinstance(scopes, (bytes, bytearray)):
        raise TypeError(f"{where} gave bytes {scopes!r}; a scope id is a str")
    if isinstance(scopes, Mapping):
        result: dict[str, float | None] = {}
        for key, amount in scopes.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} gave a non-string scope id {key!r}")
            if amount is not None and (
                isinstance(amount, bool)
                or not isinstance(amount, (int, float))
                or not 0 <= amount < math.inf  # NaN, inf and negatives would switch quotas off
            ):
                raise TypeError(
                    f"{where} gave scope {key!r} the amount {amount!r}; "
                    "expected a finite number >= 0"
                )
            result[key] = None if amount is None else float(amount)
        return result
    if isinstance(scopes, Iterable):
        result = {}
        for key in scopes:
            if not isinstance(key, str):
                raise TypeError(f"{where} gave a non-string scope id {key!r}")
            result[key] = None
        if isinstance(scopes, (set, frozenset)) and len(result) > 1:
            # A set has no order, and string hashing changes between runs: sort it
            # so the primary scope (the download_slot) is the same in every run.
            result = dict.fromkeys(sorted(result))
        return result
    raise TypeError(
        f"{where} must be None, a scope id, an iterable of ids or a dict of id -> amount "
        f"(got {scopes!r})"
    )


def add_scope(scopes: Scopes, scope: str, amount: float | None = None) -> Scopes:
    """Return *scopes* with *scope* added (with a quota *amount* if given).

    Accepts and returns every form ``get_scopes`` may return; the input is
    never modified. A dict is returned when either side carries amounts.
    """
    current = normalize_scopes(scopes, where="add_scope()")
    # The added scope passes the checks the meta key's do (a str id, an
    # amount that is a finite number >= 0).
    added = normalize_scopes({scope: amount}, where="add_scope()")
    if amount is None and all(value is None for value in current.values()):
        return [*current, scope] if scope not in current else list(current)
    current.update(added)
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
