"""``Retry-After`` on a redirect: the redirected request waits.

RFC 9110 (section 10.2.3): sent with a 3xx response, ``Retry-After`` is the
least time the client is asked to wait before following the redirect. It
says nothing about the scope (a 3xx is no rate-limit signal), so it holds
one request, the redirected one, for at most ``REDIRECT_MAX_DELAY`` seconds
(``0`` turns this off).

Scrapy's ``RedirectMiddleware`` builds the redirected request from the
original, meta included, and appends the original's URL to its
``redirect_urls``. The downloader therefore writes the original's URL and
the moment the wait ends into the original request's meta before the
response goes up to the middlewares; a request waits at the gate only if
the last of its ``redirect_urls`` is that URL, so copies made by hand from
``response.meta`` do not. The moment is on the crawl's clock rather than a
length of time, so a retry of the redirected request does not wait again,
and it is capped again when read (a ``JOBDIR`` resumed on another machine
reads it on another clock).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from slotkit.headers import parse_rate_limit_headers

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response

__all__ = ["REDIRECT_STATUSES", "REDIRECT_WAIT", "note_redirect_wait", "redirect_wait"]

logger = logging.getLogger("slotkit")

#: The meta key holding ``(url, until)``: the redirect's source and when its target may go.
REDIRECT_WAIT = "_slotkit_redirect_wait"

#: The statuses Scrapy's RedirectMiddleware follows through ``Location``.
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


def note_redirect_wait(request: Request, response: Response, now: float, cap: float) -> float:
    """Note in *request*'s meta how long its redirect must wait; return that wait (0: none)."""
    if response.status not in REDIRECT_STATUSES or cap <= 0:
        return 0.0
    headers = response.headers
    retry_after = headers.get(b"Retry-After")
    if retry_after is None or b"Location" not in headers:
        return 0.0
    # Only Retry-After: a RateLimit-Reset on a redirect tells of a quota, not of this redirect.
    fields = {"Retry-After": retry_after}
    date = headers.get(b"Date")
    if date is not None:
        fields["Date"] = date  # an HTTP-date counts from the server's clock
    hint = parse_rate_limit_headers(fields, now=now)
    if hint.delay is None:
        return 0.0
    wait = min(hint.delay, cap)
    request.meta[REDIRECT_WAIT] = (request.url, now + wait)
    if hint.delay > cap:
        logger.debug(
            "slotkit: %s redirects after Retry-After %gs; waiting REDIRECT_MAX_DELAY=%gs",
            response,
            hint.delay,
            cap,
        )
    return wait


def redirect_wait(request: Request, now: float, cap: float) -> float:
    """Seconds *request* still has to wait because the redirect it follows said so."""
    meta = request.meta
    noted = meta.get(REDIRECT_WAIT)
    if not (isinstance(noted, tuple) and len(noted) == 2):
        return 0.0
    source, until = noted
    followed = meta.get("redirect_urls") or ()
    if not followed or followed[-1] != source:
        return 0.0  # not the request RedirectMiddleware built from that response
    if isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until):
        return 0.0
    return min(max(0.0, until - now), cap)
