"""slotkit.clock.AsyncioClock: the crawl clock in Scrapy's reactorless mode."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from twisted.internet.interfaces import IReactorTime
from zope.interface.verify import verifyObject

from slotkit.clock import AsyncioClock

WAIT = 0.05


def test_readings_are_epoch_seconds() -> None:
    """A probe: the loop's own time (from boot) made HTTP-dates and epoch resets
    in rate-limit headers decades off in reactorless crawls."""
    loop = asyncio.new_event_loop()
    try:
        clock = AsyncioClock(loop)
        verifyObject(IReactorTime, clock)
        assert abs(clock.seconds() - time.time()) < 1.0
    finally:
        loop.close()


def test_a_call_runs_when_the_clock_says() -> None:
    """callLater converts the clock's epoch readings back onto the loop's time."""

    async def scenario() -> tuple[float, float, float]:
        clock = AsyncioClock(asyncio.get_running_loop())
        fired = asyncio.get_running_loop().create_future()
        start = clock.seconds()
        call = clock.callLater(WAIT, lambda: fired.set_result(clock.seconds()))
        # Bracketed by readings (the clock is monotonic): a thread that loses the
        # CPU between two statements makes no difference.
        assert start + WAIT <= call.getTime() <= clock.seconds() + WAIT
        late = clock.callLater(WAIT, lambda: None)
        late.reset(60.0)  # moved on: must not fire within the test
        ran_at = await asyncio.wait_for(fired, 10.0)
        assert late.active()
        late.cancel()
        return start, ran_at, call.getTime()

    # In a thread of its own: under pytest-twisted this thread's loop is running.
    with ThreadPoolExecutor(1) as pool:
        start, ran_at, due = pool.submit(asyncio.run, scenario()).result(timeout=30)
    assert ran_at >= due - 1e-3  # the loop fires call_at a hair early at most
    # Not late (an unconverted epoch reading would never fire): generous, as a
    # busy machine delays a new thread's loop.
    assert ran_at - start < 5.0
