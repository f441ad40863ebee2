"""Values that are also awaitable, so overrides may be sync or ``async``.

Scrapy's throttling documentation writes overrides as ``async def`` methods
that ``await super().get_scopes(request)``; plain sync overrides that call
``super().get_scopes(request)`` are just as natural. The default
:class:`~slotkit.ThrottlingManager` returns its results wrapped in these
types: each *is* the value (a ``str``, ``list`` or ``dict``) and awaiting it
yields the value itself, so both styles work against the same base class.
"""

from __future__ import annotations

import inspect
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred

__all__ = [
    "AwaitableDict",
    "AwaitableList",
    "AwaitableStr",
    "NotReadyError",
    "awaitable",
    "needs_await",
    "resolved",
    "run_without_suspending",
]

_T = TypeVar("_T")
_V = TypeVar("_V")


class _SelfAwaiting:
    __slots__ = ()

    def __await__(self: _T) -> Generator[Any, None, _T]:
        return self
        yield  # pragma: no cover - makes this a generator


class AwaitableStr(_SelfAwaiting, str):
    """A ``str`` that ``await`` returns unchanged."""

    __slots__ = ()


class AwaitableList(_SelfAwaiting, list):  # type: ignore[type-arg]
    """A ``list`` that ``await`` returns unchanged (also: no scopes, when empty)."""


class AwaitableDict(_SelfAwaiting, dict):  # type: ignore[type-arg]
    """A ``dict`` that ``await`` returns unchanged (also: no backoff, when empty)."""


def awaitable(value: _V) -> _V:
    """*value* as one of the awaitable types; ``None`` becomes an empty one."""
    result: Any = value
    if isinstance(value, _SelfAwaiting):
        result = value
    elif value is None:
        result = AwaitableList()
    elif isinstance(value, str):
        result = AwaitableStr(value)
    elif isinstance(value, dict):
        result = AwaitableDict(value)
    elif isinstance(value, (list, tuple, set, frozenset)):
        result = AwaitableList(value)
    return result  # type: ignore[no-any-return]  # same value, awaitable too


def needs_await(value: Any) -> bool:
    """Whether a user method's result must be awaited (not a plain or self-awaiting value)."""
    if value is None or isinstance(value, (str, list, dict, set, tuple, frozenset)):
        return False
    return isinstance(value, Deferred) or inspect.isawaitable(value)


async def resolved(value: Any) -> Any:
    """*value*, awaited if a user method returned a coroutine or a Deferred."""
    if isinstance(value, Deferred):
        return await maybe_deferred_to_future(value)
    if inspect.isawaitable(value):
        return await value
    return value


class NotReadyError(Exception):
    """A coroutine run synchronously needed to wait for something."""


def run_without_suspending(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """The result of *coroutine* if it finishes without waiting on anything.

    Schedulers ask for a request's scopes synchronously, while the spec
    writes ``get_scopes`` as ``async def`` that usually awaits nothing but
    ``super().get_scopes()`` (an already-resolved value). Such a coroutine
    is stepped once; if it does wait (a DNS lookup, say), it is closed and
    :class:`NotReadyError` raised, and the downloader awaits the method for
    real later.
    """
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise NotReadyError(f"{coroutine!r} waits for something")
