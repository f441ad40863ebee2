"""The ``throttling_delay`` request meta: hold one request for a while.

The delay is applied once. At the gate it runs from the request's arrival,
unless a throttling-aware queue (:class:`~slotkit.ThrottlingAwarePriorityQueue`)
took the request in first: that queue holds the request while its scopes
are not ready, so the delay runs from then, alongside that wait.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from slotkit.validation import finite_seconds

if TYPE_CHECKING:
    from scrapy import Request

logger = logging.getLogger("slotkit")

__all__ = ["DELAY_FROM", "pending_request_delay", "request_delay", "stamp_request_delay"]

#: Private meta key: when a throttling-aware queue took the request in. Its
#: ``throttling_delay`` runs from then, as the queue holds it while it waits.
DELAY_FROM = "_slotkit_delay_from"


def stamp_request_delay(request: Request, now: float) -> None:
    """A queue that holds requests until they can go took *request* in at *now*.

    Without this, a request with a ``throttling_delay`` waited in the queue
    until its scopes were ready and only then began its delay at the gate
    (a probe: a 3 s delay sent 3 s after the quota opened, the quota idle).
    """
    meta = request.meta
    if meta.get("throttling_delay") and DELAY_FROM not in meta and not meta.get("_slotkit_delayed"):
        meta[DELAY_FROM] = now


def pending_request_delay(request: Request, now: float) -> float:
    """Seconds left of *request*'s stamped ``throttling_delay`` (0: none, or run)."""
    meta = request.meta
    since = meta.get(DELAY_FROM)
    if since is None or meta.get("_slotkit_delayed"):
        return 0.0
    value = meta.get("throttling_delay")
    seconds = None if isinstance(value, (str, bytes)) else finite_seconds(value)
    if seconds is None or not isinstance(since, (int, float)):
        return 0.0
    return max(0.0, float(since) + seconds - now)


def request_delay(request: Request, now: float) -> float:
    """The ``throttling_delay`` meta of *request*, applied once per request.

    Stamped by a throttling-aware queue (:func:`stamp_request_delay`), it runs
    from when the queue took the request in; otherwise from now.
    """
    meta = request.meta
    value = meta.get("throttling_delay")
    if not value or meta.get("_slotkit_delayed"):
        return 0.0
    pending = pending_request_delay(request, now) if DELAY_FROM in meta else None
    meta["_slotkit_delayed"] = True
    # An infinite delay would keep the crawl open forever. Text is refused
    # even when it reads as a number, as delay_scope() refuses it: "1" in a
    # meta dict is more likely a bug upstream than a choice.
    text = isinstance(value, (str, bytes))
    seconds = None if text else finite_seconds(value)
    if seconds is None:
        logger.warning(
            "Ignoring throttling_delay=%r of %s: expected a finite number of seconds >= 0%s",
            value,
            request,
            ", not text" if text else "",
        )
        return 0.0
    return seconds if pending is None else pending
