"""Quota shares for :class:`~slotkit.pqueue.ThrottlingAwarePriorityQueue`.

All else equal, the spec prefers the request that uses the larger portion of
what is left of a quota. :class:`QuotaShares` tells that portion for a
request, from the live scopes' managers or, for a scope not created yet,
from its configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request

    from slotkit.pqueue_readiness import Readiness

__all__ = ["QuotaShares", "Terms"]

#: The ``(scope id, amount)`` pairs of a request's scopes that count a quota,
#: sorted: requests with equal terms always have equal quota shares.
Terms = tuple[tuple[str, float], ...]


class QuotaShares:
    """The quota share of requests, for one crawl's priority queue."""

    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness
        #: Some ``THROTTLING_SCOPES`` entry sets a quota, which a request naming
        #: no amount may spend too (so every request may have a quota share).
        self.configured = _any_quota_configured(readiness.downloader)

    def may_have_share(self, scopes: Mapping[str, float | None] | None) -> bool:
        """Whether a request with *scopes* (``None``: not known yet) can have a share.

        Without configured quotas only requests that name amounts can.
        """
        return scopes is None or self.configured or any(v is not None for v in scopes.values())

    def share(self, request: Request, scopes: Mapping[str, float | None] | None = None) -> float:
        """The largest share of a scope's remaining quota that *request* would use.

        ``0.0`` unless one of its scopes counts a quota. A request that names
        no amount spends 1 unit, as its scope manager counts it. A scope
        manager tells its remaining quota through a ``quota_available(now)``
        method (slotkit's default manager has one), or a ``quota`` object
        with ``remaining(now)``. A scope not created yet that will get
        slotkit's default manager has its whole configured quota left.
        *scopes*: the request's scopes, if already known.
        """
        return self.terms_and_share(request, scopes)[1]

    def terms_and_share(
        self, request: Request, scopes: Mapping[str, float | None] | None = None
    ) -> tuple[Terms, float]:
        """The quota terms of *request* (see :data:`Terms`) and its :meth:`share`."""
        if scopes is None:
            scopes = self.readiness.scopes(request)
        if not scopes or getattr(self.readiness.downloader, "registry", None) is None:
            return (), 0.0
        terms: list[tuple[str, float]] = []
        share = 0.0
        now = self.readiness.now()
        for scope_id, named in scopes.items():
            available = self._available(scope_id, now)
            if available is not None:
                amount = 1.0 if named is None else named  # what the scope manager counts
                terms.append((scope_id, amount))
                share = max(share, _portion(amount, available))
        return tuple(sorted(terms)), share

    def share_of(self, terms: Terms, available: dict[str, float | None]) -> float:
        """The share of a request with quota *terms*, now.

        *available*: remaining quota by scope id, filled in as scopes are
        looked up, for several calls in a row at one moment.
        """
        share = 0.0
        now: float | None = None
        for scope_id, amount in terms:
            if scope_id not in available:
                if now is None:
                    now = self.readiness.now()
                available[scope_id] = self._available(scope_id, now)
            left = available[scope_id]
            if left is not None:
                share = max(share, _portion(amount, left))
        return share

    def _available(self, scope_id: str, now: float) -> float | None:
        """The quota *scope_id* has left (``None``: it counts none, or cannot tell)."""
        downloader = self.readiness.downloader
        scope = downloader.registry.peek(scope_id)
        if scope is not None:
            return _quota_available(scope.manager, now)
        return _configured_quota(downloader, scope_id)


def _portion(amount: float, available: float) -> float:
    return amount / available if available > 0 else math.inf


def _configured_quota(downloader: Any, scope_id: str) -> float | None:
    """The quota a scope not created yet will start with (``None``: none, or unknown).

    Only for slotkit's default manager: a custom (or the shared) manager
    reports no share once the scope exists, so guessing one before would
    rank its requests ahead of live scopes' for no reason.
    """
    scope_config = getattr(downloader, "scope_config", None)
    if scope_config is None:
        return None
    config = scope_config(scope_id)
    if config.manager is not None or config.quota is None:
        return None
    return float(config.quota)


def _any_quota_configured(downloader: Any) -> bool:
    config = getattr(downloader, "config", None)
    scopes = getattr(config, "scopes", None) or {}
    return any(
        isinstance(entry, Mapping) and entry.get("quota") is not None for entry in scopes.values()
    )


def _quota_available(manager: Any, now: float) -> float | None:
    """The quota *manager* has left at *now*, or ``None`` if it counts none."""
    method = getattr(manager, "quota_available", None)
    if callable(method):
        value = method(now)
        return None if value is None else float(value)
    quota = getattr(manager, "quota", None)
    remaining = getattr(quota, "remaining", None)
    if callable(remaining):
        return float(remaining(now))
    return None
