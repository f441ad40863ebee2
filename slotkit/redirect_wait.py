"""``Retry-After`` on a redirect: the redirected request waits.

RFC 9110 (section 10.2.3): sent with a 3xx response, ``Retry-After`` is the
least time the client is asked to wait before following the redirect. It
says nothing about the scope (a 3xx is no rate-limit signal), so it holds
one request, the redirected one, for at most ``REDIRECT_MAX_DELAY`` seconds
(``0`` turns this off).

Scrapy's ``RedirectMiddleware`` builds the redirected request from the
original, meta included. The downloader therefore writes the moment the wait
ends into the original request's meta before the response goes up to the
middlewares, and the redirected request waits at the gate until then. The
moment is on the crawl's clock rather than a length of time, so a later
copy (a retry, a further redirect) does not wait again.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from slotkit.headers import parse_rate_limit_headers

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response

__all__ = ["REDIRECT_WAIT", "note_redirect_wait", "redirect_wait"]

logger = logging.getLogger("slotkit")

#: The meta key holding when a redirected request may go (the crawl clock's seconds).
REDIRECT_WAIT = "_slotkit_redirect_wait"


def note_redirect_wait(request: Request, response: Response, now: float, cap: float) -> float:
    """Note in *request*'s meta how long its redirect must wait; return that wait (0: none)."""
    if not 300 <= response.status < 400 or cap <= 0:
        return 0.0
    retry_after = response.headers.get(b"Retry-After")
    if retry_after is None:
        return 0.0
    # Only Retry-After: a RateLimit-Reset on a redirect tells of a quota, not of this redirect.
    fields = {"Retry-After": retry_after}
    date = response.headers.get(b"Date")
    if date is not None:
        fields["Date"] = date  # an HTTP-date counts from the server's clock
    hint = parse_rate_limit_headers(fields, now=now)
    if hint.delay is None:
        return 0.0
    wait = min(hint.delay, cap)
    request.meta[REDIRECT_WAIT] = now + wait
    if hint.delay > cap:
        logger.debug(
            "slotkit: %s redirects after Retry-After %gs; waiting REDIRECT_MAX_DELAY=%gs",
            response,
            hint.delay,
            cap,
        )
    return wait


def redirect_wait(request: Request, now: float) -> float:
    """Seconds *request* still has to wait because the response it follows said so."""
    until = request.meta.pop(REDIRECT_WAIT, None)
    if isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until):
        return 0.0
    return max(0.0, until - now)
