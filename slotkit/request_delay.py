"""The ``throttling_delay`` request meta: one request held for a number of seconds.

The delay starts the first time it is asked about (at the gate, or as
slotkit's priority queue takes the request in), and its end is stamped into
the meta, on the crawl's clock: a request handed back at a ``JOBDIR`` pause
waits out the rest when the crawl resumes.

Meta travels. ``RetryMiddleware`` and ``RedirectMiddleware`` copy it into
the request they build, and those must not wait again; but a spider that
builds its next request from ``response.meta`` copies the stamp too, and
that request is another one, with its own delay. So the stamp names the
request it was made for: its delay in seconds, its URL, and the retry and
redirect counts Scrapy's middlewares raise on each copy. A request whose
counts went up is a retry or redirect of the stamped one (it inherits the
end, and the stamp moves to it); one that differs otherwise (another URL,
another delay) starts a delay of its own. A copy with the same URL and
delay cannot be told from the request itself (Scrapy's queues deserialize
a new object from the same meta), and does not wait again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from slotkit.validation import finite_seconds

if TYPE_CHECKING:
    from scrapy import Request

__all__ = ["DELAY_UNTIL", "request_delay_left"]

logger = logging.getLogger("slotkit")

#: Request meta: when its ``throttling_delay`` ends, and which request that is:
#: ``(until, seconds, url, retry_times, redirect_times)``.
DELAY_UNTIL = "_slotkit_delay_until"


def request_delay_left(request: Request, now: float) -> float:
    """What is left at *now* of the ``throttling_delay`` meta of *request*."""
    meta = request.meta
    value = meta.get("throttling_delay")
    if not value or meta.get("_slotkit_delayed"):  # (a job saved by 0.1.0 before the stamp)
        return 0.0
    # An infinite delay would keep the crawl open forever. Text is refused
    # even when it reads as a number, as delay_scope() refuses it: "1" in a
    # meta dict is more likely a bug upstream than a choice.
    text = isinstance(value, (str, bytes))
    seconds = None if text else finite_seconds(value)
    stamp = meta.get(DELAY_UNTIL)
    if stamp is not None:
        end = _inherited_end(request, stamp, seconds)
        if end is not None:
            if seconds is None:
                return 0.0
            # Never more than the delay itself (a clock that is not the saving crawl's).
            return max(0.0, min(end - now, seconds))
    if seconds is None:
        _stamp(request, now, None)
        logger.warning(
            "Ignoring throttling_delay=%r of %s: expected a finite number of seconds >= 0%s",
            value,
            request,
            ", not text" if text else "",
        )
        return 0.0
    _stamp(request, now + seconds, seconds)
    return seconds


def _inherited_end(request: Request, stamp: Any, seconds: float | None) -> float | None:
    """When the stamped delay ends for *request*; ``None``: the stamp is another request's."""
    if not isinstance(stamp, (tuple, list)):
        # A job saved before stamps named their request: a bare end.
        end = finite_seconds(stamp)
        return 0.0 if end is None else end
    if len(stamp) != 5:
        return None
    until, stamped_seconds, url, retries, redirects = stamp
    end = finite_seconds(until)
    if end is None or stamped_seconds != seconds:
        return None  # the delay was set anew
    now_url, now_retries, now_redirects = _marks(request)
    if (now_url, now_retries, now_redirects) == (url, retries, redirects):
        return end  # the request itself, asked again (or read back from a queue)
    if now_retries > _count(retries) or now_redirects > _count(redirects):
        _stamp(request, end, seconds)  # its retry or redirect: the stamp moves to it
        return end
    return None


def _stamp(request: Request, until: float, seconds: float | None) -> None:
    request.meta[DELAY_UNTIL] = (until, seconds, *_marks(request))


def _marks(request: Request) -> tuple[str, int, int]:
    """What tells a request from the retries and redirects Scrapy copies from it."""
    meta = request.meta
    return request.url, _count(meta.get("retry_times")), _count(meta.get("redirect_times"))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
