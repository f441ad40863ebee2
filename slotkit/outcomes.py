"""What one response or exception says about each scope of its request."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure

__all__ = ["Backoff", "ScopeBackoff", "cut_by_cancel", "update_scope_backoff"]


@dataclass(frozen=True, slots=True)
class ScopeBackoff:
    """What one outcome says about one scope.

    ``trigger``: slow the scope down one backoff step. ``delay``: hold it at
    least this many seconds (a server hint). ``consumed`` / ``remaining``:
    correct its quota bookkeeping. ``reset``: with ``remaining``, the seconds
    until the server counts afresh (what a spent count lasts, and the
    scope's budget of ``remaining`` requests). ``limit``: the server's count
    per window, the budget of each window after the reset.
    """

    trigger: bool = False
    delay: float | None = None
    consumed: float | None = None
    remaining: float | None = None
    reset: float | None = None
    limit: float | None = None


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
    """Return *backoff* with the record of *scope* updated; the input is not modified.

    Raises :class:`TypeError` for a scope that is not a ``str`` and
    :class:`ValueError` for a figure no server could mean: a ``delay`` or
    ``remaining`` that is not a finite number >= 0, a ``consumed`` that is not
    a finite number (negative gives units back).
    """
    if not isinstance(scope, str):
        raise TypeError(f"update_scope_backoff() needs a scope id (a str), got {scope!r}")
    _check_figure("delay", delay, minimum=0.0)
    _check_figure("remaining", remaining, minimum=0.0)
    _check_figure("consumed", consumed, minimum=-math.inf)
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


def _check_figure(name: str, value: float | None, *, minimum: float) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"update_scope_backoff(): {name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < minimum:
        bound = "" if minimum == -math.inf else f" >= {minimum:g}"
        raise ValueError(
            f"update_scope_backoff(): {name} must be a finite number{bound}, got {value!r}"
        )


def cut_by_cancel(exc: BaseException) -> bool:
    """Whether *exc* is a transfer cut off by cancelling its Deferred.

    Twisted's HTTP client reports that as a response never received whose
    reasons hold a CancelledError, and Scrapy wraps it in DownloadFailedError.
    """
    for error in (exc, exc.__cause__):
        for reason in getattr(error, "reasons", None) or ():
            if isinstance(reason, Failure) and reason.check(CancelledError):
                return True
    return False
