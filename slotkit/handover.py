"""Awaiting a Deferred whose result must be given back: a gate's ticket, a lock.

A Deferred fires, and the coroutine awaiting it resumes a loop turn later
(under the asyncio reactor its result goes through an asyncio future). A
cancel landing in between (a caller's timeout, the engine giving up) raises
in the coroutine although the result was handed over: a ticket holding
scope slots, or a lock, would then never be given back. :func:`take`
keeps the result as it is handed over and gives it back if the awaiting
coroutine never gets it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred

__all__ = ["take"]

_T = TypeVar("_T")


async def take(deferred: Deferred[_T], give_back: Callable[[_T], object]) -> _T:
    """The result of *deferred*; *give_back* it if the awaiting ends otherwise."""
    handed: list[_T] = []

    def keep(result: _T) -> _T:
        handed.append(result)
        return result

    deferred.addCallback(keep)
    try:
        return await maybe_deferred_to_future(deferred)
    except BaseException:
        if handed:
            give_back(handed[0])
        raise
