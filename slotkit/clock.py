"""Where the downloader's time comes from.

Everything that waits in slotkit takes an ``IReactorTime``. In a normal
crawl that is the Twisted reactor; in Scrapy's reactorless mode
(``TWISTED_REACTOR_ENABLED = False``) it is :class:`AsyncioClock`, an
``IReactorTime`` over the running asyncio loop; tests pass a
:class:`twisted.internet.task.Clock`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from zope.interface import implementer

__all__ = ["AsyncioClock", "default_clock", "stock_clock"]


@implementer(IDelayedCall)
class _LoopCall:
    """An ``IDelayedCall`` backed by an :class:`asyncio.TimerHandle`."""

    def __init__(
        self,
        clock: AsyncioClock,
        when: float,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kw: dict[str, Any],
    ) -> None:
        self._clock = clock
        self._func, self._args, self._kw = func, args, kw
        self._when = when
        self._done = False
        self._handle = clock.loop.call_at(clock.loop_time(when), self._run)

    def _run(self) -> None:
        self._done = True
        self._clock._live.discard(self)
        self._func(*self._args, **self._kw)

    def getTime(self) -> float:  # noqa: N802 - Twisted's interface names
        return self._when

    def cancel(self) -> None:
        if self._done:
            from twisted.internet.error import AlreadyCalled

            raise AlreadyCalled(self)
        self._done = True
        self._handle.cancel()
        self._clock._live.discard(self)

    def delay(self, secondsLater: float) -> None:  # noqa: N803
        self._reschedule(self._when + secondsLater)

    def reset(self, secondsFromNow: float) -> None:  # noqa: N803
        self._reschedule(self._clock.seconds() + secondsFromNow)

    def _reschedule(self, when: float) -> None:
        self._handle.cancel()
        self._when = when
        self._handle = self._clock.loop.call_at(self._clock.loop_time(when), self._run)

    def active(self) -> bool:
        return not self._done


@implementer(IReactorTime)
class AsyncioClock:
    """``IReactorTime`` on an asyncio event loop, for Scrapy's reactorless mode.

    Its readings are seconds since the epoch, as a Twisted reactor's are: the
    loop's monotonic time moved by the epoch once, at creation. Rate-limit
    headers give HTTP-dates and epoch resets, and a ``JOBDIR`` keeps readings
    across runs; the loop's own time starts anywhere (at boot, on Linux), and
    a date compared with it was off by decades.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        wall: Callable[[], float] = time.time,  # noqa: TID251 - read once, to anchor; never waits
    ) -> None:
        self.loop = loop
        self._live: set[_LoopCall] = set()
        # Once: the reading stays monotonic when the wall clock is set later.
        self._epoch_offset = wall() - loop.time()

    def seconds(self) -> float:
        return self.loop.time() + self._epoch_offset

    def loop_time(self, when: float) -> float:
        """*when*, a reading of this clock, on the loop's own clock (for ``call_at``)."""
        return when - self._epoch_offset

    def callLater(
        self, delay: float, callable: Callable[..., Any], *args: Any, **kw: Any
    ) -> _LoopCall:  # noqa: N802, A002
        call = _LoopCall(self, self.seconds() + max(0.0, delay), callable, args, kw)
        self._live.add(call)
        return call

    def getDelayedCalls(self) -> list[_LoopCall]:  # noqa: N802
        return list(self._live)


def default_clock() -> IReactorTime:
    """The installed Twisted reactor, or the running asyncio loop without one.

    Never installs a reactor: importing ``twisted.internet.reactor`` would
    install the default one as a side effect, which breaks reactorless crawls.
    """
    if "twisted.internet.reactor" in sys.modules:
        from twisted.internet import reactor

        return reactor
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "slotkit.Downloader needs a Twisted reactor or a running asyncio event loop; "
            "start the crawl with Scrapy's CrawlerProcess/AsyncCrawlerProcess"
        ) from None
    return AsyncioClock(loop)


#: The clock stock Scrapy 2.19 stamps ``Slot.lastseen`` with, which plugins
#: compare against. slotkit decides nothing on it: the ``slots`` view only
#: translates its last dispatch onto it (tests replace it).
stock_clock: Callable[[], float] = time.monotonic  # noqa: TID251 - stock's own clock
