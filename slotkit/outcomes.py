"""What one response or exception says about each scope of its request."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure

__all__ = ["Backoff", "ScopeBackoff", "as_backoff", "cut_by_cancel", "update_scope_backoff"]


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


#: What ``get_response_backoff`` returns: ``None`` or scope id -> :class:`ScopeBackoff`
#: (other shapes are read by :func:`as_backoff`).
Backoff = Mapping[str, ScopeBackoff] | None

#: The keys of a plain-dict record: :class:`ScopeBackoff`'s fields, and ``"quota"``,
#: the draft's name for ``remaining``.
RECORD_KEYS = ("trigger", "delay", "consumed", "remaining", "reset", "limit", "quota")

ACCEPTED = (
    "None, a scope id, an iterable of scope ids, or a dict mapping scope ids to "
    "ScopeBackoff records, None or dicts with the keys " + ", ".join(RECORD_KEYS)
)


def as_backoff(value: Any, where: str) -> Backoff:
    """*value*, what a manager said of an outcome, as scope id -> :class:`ScopeBackoff`.

    Besides slotkit's dict of records, reads the shapes of the upstream
    draft of this API, so managers written against it work unchanged: a scope
    id or an iterable of them (each scope backs off), and dict values that
    are ``None`` or ``{}`` (the scope backs off) or plain dicts such as
    ``{"delay": 5.0}`` (a hold, which is a trigger), ``{"consumed": 2.0}`` or
    ``{"remaining": 0}`` (quota corrections only, unless ``"trigger"`` says
    otherwise). Anything false (``None``, ``False``, ``{}``) says nothing.
    Raises :class:`TypeError` or :class:`ValueError` naming *where* for
    anything else.
    """
    if not value:
        # Also ``status == 429 and {...}`` on a 200, and the default manager's empty answer.
        return None
    if isinstance(value, Mapping):
        if all(type(record) is ScopeBackoff for record in value.values()):
            return value  # slotkit's own shape: the common case costs one pass
        return {
            _scope_id(scope, where): _record(record, scope, where)
            for scope, record in value.items()
        }
    if isinstance(value, str):
        return {_scope_id(value, where): ScopeBackoff(trigger=True)}
    if isinstance(value, Iterable) and not isinstance(value, (bytes, bytearray)):
        return {_scope_id(scope, where): ScopeBackoff(trigger=True) for scope in value}
    raise TypeError(f"{where} returned {value!r}; expected {ACCEPTED}")


def _scope_id(scope: Any, where: str) -> str:
    if not isinstance(scope, str):
        raise TypeError(f"{where}: a scope id must be a str, got {scope!r}")
    return scope


def _record(entry: Any, scope: str, where: str) -> ScopeBackoff:
    if isinstance(entry, ScopeBackoff):
        return entry
    if entry is None:
        return ScopeBackoff(trigger=True)
    if not isinstance(entry, Mapping):
        raise TypeError(f"{where}: the record of scope {scope!r} is {entry!r}; expected {ACCEPTED}")
    unknown = [key for key in entry if key not in RECORD_KEYS]
    if unknown:
        match = difflib.get_close_matches(str(unknown[0]), RECORD_KEYS, n=1, cutoff=0.6)
        hint = f" (did you mean {match[0]!r}?)" if match else ""
        raise TypeError(
            f"{where}: the record of scope {scope!r} has the unknown key {unknown[0]!r}{hint}; "
            f"accepted keys: {', '.join(RECORD_KEYS)}"
        )
    remaining = entry.get("remaining")
    if remaining is None:
        remaining = entry.get("quota")
    figures = {name: entry.get(name) for name in ("delay", "consumed", "reset", "limit")}
    for name, figure in (*figures.items(), ("remaining", remaining)):
        _check_figure(name, figure, minimum=-math.inf if name == "consumed" else 0.0, where=where)
    trigger = entry.get("trigger")
    if trigger is None:
        # A hold is a trigger (as delay_scope is); counts alone only correct the quota.
        counts_only = figures["consumed"] is not None or remaining is not None
        trigger = figures["delay"] is not None or not counts_only
    elif not isinstance(trigger, bool):
        raise TypeError(
            f"{where}: the record of scope {scope!r} has trigger={trigger!r}; "
            "expected True or False"
        )
    return ScopeBackoff(trigger=trigger, remaining=remaining, **figures)


class _Omitted:
    """The default of :func:`update_scope_backoff`'s figures: not given at all.

    Given as ``None``, a figure is left as it is; only a call that gives none
    of them adds a bare scope. Shown as ``None`` in signatures, as it acts.
    """

    def __repr__(self) -> str:
        return "None"


_OMITTED: Any = _Omitted()


def update_scope_backoff(
    backoff: Backoff,
    scope: str,
    *,
    trigger: bool | None = _OMITTED,
    delay: float | None = _OMITTED,
    consumed: float | None = _OMITTED,
    remaining: float | None = _OMITTED,
) -> dict[str, ScopeBackoff]:
    """Return *backoff* with the record of *scope* updated; the input is not modified.

    Raises :class:`TypeError` for a scope that is not a ``str`` and
    :class:`ValueError` for a figure no server could mean: a ``delay`` or
    ``remaining`` that is not a finite number >= 0, a ``consumed`` that is not
    a finite number (negative gives units back).

    *backoff* may have any shape :func:`as_backoff` reads. Called with no
    figure and no ``trigger`` at all, a scope not named yet is added as
    backing off (the draft's "add the bare scope"); one already named is
    left as it is. A figure given as ``None`` is no figure.
    """
    if not isinstance(scope, str):
        raise TypeError(f"update_scope_backoff() needs a scope id (a str), got {scope!r}")
    where = "update_scope_backoff()"
    bare = all(given is _OMITTED for given in (trigger, delay, consumed, remaining))
    if trigger is _OMITTED:
        trigger = None
    delay, consumed, remaining = (
        None if given is _OMITTED else given for given in (delay, consumed, remaining)
    )
    _check_figure("delay", delay, minimum=0.0, where=where)
    _check_figure("remaining", remaining, minimum=0.0, where=where)
    _check_figure("consumed", consumed, minimum=-math.inf, where=where)
    result = dict(as_backoff(backoff, where) or {})
    if bare:
        result.setdefault(scope, ScopeBackoff(trigger=True))
        return result
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


def _check_figure(name: str, value: Any, *, minimum: float, where: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < minimum:
        bound = "" if minimum == -math.inf else f" >= {minimum:g}"
        raise ValueError(f"{where}: {name} must be a finite number{bound}, got {value!r}")


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
