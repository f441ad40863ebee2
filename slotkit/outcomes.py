"""What one response or exception says about each scope of its request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Backoff", "ScopeBackoff", "update_scope_backoff"]


@dataclass(frozen=True, slots=True)
class ScopeBackoff:
    """What one outcome says about one scope.

    ``trigger``: slow the scope down one backoff step. ``delay``: hold it at
    least this many seconds (a server hint). ``consumed`` / ``remaining``:
    correct its quota bookkeeping.
    """

    trigger: bool = False
    delay: float | None = None
    consumed: float | None = None
    remaining: float | None = None


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
    """Return *backoff* with the record of *scope* updated; the input is not modified."""
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
