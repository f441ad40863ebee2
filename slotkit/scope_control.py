"""The downloader's side of scopes: creating them, and what the manager asks of them.

:class:`ScopeControl` is a base of :class:`slotkit.Downloader`. It builds a
new scope's manager from the settings (plus AutoThrottle's start delay and a
robots.txt Crawl-delay), counts evictions, and answers the throttling
manager's questions (:meth:`hold_scope` for ``delay_scope``, a request's
scope ids, the clock, quotas, backoff rules).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from slotkit.awaitables import NotReadyError, run_without_suspending
from slotkit.dns import address_of
from slotkit.domains import registrable_domain
from slotkit.registry import Scope
from slotkit.robots import apply_crawl_delay, overrides_robots
from slotkit.scope_ids import (
    AUTO_SLOT,
    DOWNLOAD_SLOT,
    held_site_ids,
    is_single_label_site,
    normalize_scopes,
    scope_kind,
)
from slotkit.scope_managers import create_scope_manager
from slotkit.settings import CUSTOM, DOMAIN, IP

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from weakref import WeakKeyDictionary, WeakSet

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.utils.datatypes import LocalCache
    from twisted.internet.interfaces import IReactorTime

    from slotkit.backoff import BackoffRules
    from slotkit.gate import Gate
    from slotkit.registry import ScopeRegistry
    from slotkit.robots import CrawlDelays
    from slotkit.settings import ScopeConfig, ThrottlingSettings
    from slotkit.stats import ThrottlingStats

logger = logging.getLogger("slotkit")

__all__ = ["ScopeControl"]


class ScopeControl:
    """Scope creation and the manager's controller interface (a base of the Downloader)."""

    # Set up by the Downloader's __init__.
    crawler: Crawler
    config: ThrottlingSettings
    _clock: IReactorTime
    registry: ScopeRegistry
    gate: Gate
    stats: ThrottlingStats
    crawl_delays: CrawlDelays | None
    _default_delay: float | None
    _kind_hints: LocalCache[str, str]
    #: (first scope, site) -> whether the site's Crawl-delay scope joins (see _add_site_scope).
    _site_scope_joins: LocalCache[tuple[str, str], bool]
    _saved: dict[str, dict[str, float]]
    _evicted_recoveries: int
    _scope_ids: WeakKeyDictionary[Request, dict[str, float | None]]
    _recoveries_seen: dict[str, int]
    _rampup_seen: dict[str, tuple[int, float]]
    #: The THROTTLING_SCOPES / DOWNLOAD_SLOTS keys naming a host:port (see netloc_keys).
    _netloc_scopes: dict[str, str]
    _scopes_wait: WeakSet[Request]
    _default_get_scopes: bool
    _get_scopes: Callable[[Request], Any]
    manager: Any

    def _normalized_scopes(self, request: Request, raw: Any) -> dict[str, float | None]:
        """*raw* (what ``get_scopes`` gave) as scope id -> amount, noting site-like ids.

        A user's ``download_slot`` and the request's own host name a site even
        when their id alone would read as a custom scope; the hint decides
        the kind (and so the default concurrency) when the scope is created.
        """
        meta = request.meta
        if type(raw) is str and raw:  # the default manager's answer: skip the error context
            scopes: dict[str, float | None] = {raw: None}
        else:
            from_meta = raw is meta.get("throttling_scopes")  # the default manager passes it on
            where = (
                f"the throttling_scopes meta of {request}"
                if from_meta
                else f"{type(self.manager).__name__}.get_scopes()"
            )
            scopes = normalize_scopes(raw, where=where, empty_ok=not from_meta)
        slot = meta.get(DOWNLOAD_SLOT)
        if (
            slot is not None
            and slot != meta.get(AUTO_SLOT)
            and str(slot) in scopes
            and scope_kind(str(slot)) != DOMAIN  # a hint only where it changes the kind
        ):
            self._kind_hints.setdefault(str(slot), DOMAIN)
        for scope_id in scopes:
            if (
                "." not in scope_id  # the cheap test first: most ids are host names
                and scope_id not in self._kind_hints
                and is_single_label_site(scope_id, urlparse_cached(request).hostname)
            ):
                self._kind_hints[scope_id] = DOMAIN
        self._add_derived_scopes(request, scopes)
        return scopes

    def _add_derived_scopes(self, request: Request, scopes: dict[str, float | None]) -> None:
        """The scopes a request joins whatever ``get_scopes`` said: its site's, when
        a Crawl-delay holds it, and its address, with ``CONCURRENT_REQUESTS_PER_IP``."""
        self._add_site_scope(request, scopes)
        if self.config.ip_concurrency:
            self._add_ip_scope(request, scopes)

    def _add_site_scope(self, request: Request, scopes: dict[str, float | None]) -> None:
        """A robots.txt Crawl-delay holds the requests of its site, whatever their scopes.

        Usually the site's scope is the request's first one. When it is not
        (``THROTTLING_DOMAIN_GROUPING``, a ``download_slot``, the
        ``throttling_scopes`` meta, a custom manager), the site's scope joins
        the request's scopes, so the delay the site asked for still holds (a
        probe saw 3 ms gaps under a 1 s Crawl-delay). Unless the first scope
        sets its own pace in ``THROTTLING_SCOPES`` / ``DOWNLOAD_SLOTS`` (or
        ``ignore_robots_txt``): those values are kept, as for a site scope,
        with the same one warning when they are faster.
        """
        crawl_delays = self.crawl_delays
        if crawl_delays is None or not crawl_delays.delays or not scopes:
            return
        found = crawl_delays.site_delay(request)
        if found is None or found[0] in scopes:
            return
        site, delay = found
        first = next(iter(scopes))
        joins = self._site_scope_joins.get((first, site))
        if joins is None:
            config = self.scope_config(first)
            joins = not overrides_robots(config)
            if not joins and not config.ignore_robots_txt:
                _, warning = apply_crawl_delay(config, delay)
                if warning:
                    crawl_delays.warn_once(first, warning)
            self._site_scope_joins[(first, site)] = joins
        if joins:
            if scope_kind(site) == CUSTOM:  # a single-label host; an address stays one
                self._kind_hints.setdefault(site, DOMAIN)
            scopes[site] = None

    @staticmethod
    def _add_ip_scope(request: Request, scopes: dict[str, float | None]) -> None:
        """``CONCURRENT_REQUESTS_PER_IP``: the request's address joins its scopes.

        The spec adds it to *each* request: those whose scopes come from a
        custom manager or the ``throttling_scopes`` meta too, not only the
        default manager's (which already adds it). Known once Scrapy's DNS
        cache has the host, or at once for an address.
        """
        address = address_of(request)
        if address is not None and address not in scopes:
            scopes[address] = None

    def known_scopes(self, request: Request) -> dict[str, float | None]:
        """The scopes of *request* if ``get_scopes`` can tell without waiting, else ``{}``.

        For schedulers and ``get_slot_key``: a sync answer, or an ``async``
        one that awaits nothing pending (see
        :func:`~slotkit.awaitables.run_without_suspending`). Never raises.
        """
        raw = (
            self.manager._default_scopes(request)
            if self._default_get_scopes
            else self._answer_without_waiting(request)
        )
        scopes: dict[str, float | None]
        try:
            scopes = {raw: None} if type(raw) is str else normalize_scopes(raw)
        except TypeError:
            return {}
        if scopes:
            self._add_derived_scopes(request, scopes)
        return scopes

    def _answer_without_waiting(self, request: Request) -> Any:
        """What ``get_scopes(request)`` answers at once, or ``None`` if it must wait or fails."""
        if request in self._scopes_wait:
            return None
        try:
            raw = self._get_scopes(request)
            if inspect.iscoroutine(raw):
                raw = run_without_suspending(raw)
        except NotReadyError:
            # Asked again it would start the same wait again (a DNS lookup in a
            # thread, say), once per scheduler query: remember the answer.
            self._scopes_wait.add(request)
            return None
        except Exception:
            return None
        if isinstance(raw, Deferred) or (
            inspect.isawaitable(raw) and not isinstance(raw, (str, list, dict))
        ):
            self._scopes_wait.add(request)
            return None
        return raw

    def scope_config(self, scope_id: str, kind: str | None = None) -> ScopeConfig:
        """The resolved configuration a new scope *scope_id* gets now.

        Settings first (:meth:`ThrottlingSettings.scope_config`), then the
        AutoThrottle start delay if one was set, then the site's robots.txt
        Crawl-delay if one is known. *kind* saves guessing it again when the
        caller already has it.
        """
        if kind is None:
            kind = self._kind_of(scope_id)
        config = self.config.scope_config(scope_id, kind)
        if self._default_delay is not None and config.sources.get("delay") == "default":
            config = replace(config, delay=self._default_delay)
        if self.crawl_delays is not None and scope_id in self.crawl_delays.delays:
            crawl_delay = self.crawl_delays.delays[scope_id]
            self.crawl_delays.note_shortened(scope_id, crawl_delay, config)
            config, warning = apply_crawl_delay(config, crawl_delay)
            if warning:
                self.crawl_delays.warn_once(scope_id, warning)
        return config

    def _kind_of(self, scope_id: str) -> str:
        """The kind of scope *scope_id*: a site when a request said so (its
        ``download_slot``, its single-label host, a robots.txt site) or when
        it is a ``DOWNLOAD_SLOTS`` key, else what its id looks like."""
        hinted = self._kind_hints.get(scope_id)
        if hinted is not None:
            return hinted
        return DOMAIN if scope_id in self.config.slots else scope_kind(scope_id)

    def _new_scope(self, scope_id: str) -> Scope:
        kind = self._kind_of(scope_id)
        manager = create_scope_manager(self.crawler, self.scope_config(scope_id, kind), scope_id)
        saved = self._saved.pop(scope_id, None)
        if saved is not None and callable(getattr(manager, "import_state", None)):
            manager.import_state(saved, self._clock.seconds())
        if self.config.debug:
            logger.info("slotkit: new scope %r: %r", scope_id, manager)
        return Scope(scope_id, manager, kind)

    def _crawl_delay_found(self, site: str, delay: float) -> None:
        """robots.txt of *site* gave a Crawl-delay: apply it to the live scope too."""
        scope = self.registry.peek(site)
        if scope is None or self.crawl_delays is None:
            return
        self.crawl_delays.update_live(scope, self.scope_config(site))
        view = scope.view
        if view is not None and view.written:
            # Set through downloader.slots (a plugin): like a THROTTLING_SCOPES
            # entry, it outranks the Crawl-delay, with the same warning.
            view.reapply()
            faster = _faster_than_robots(view.written, delay)
            if faster:
                self.crawl_delays.warn_once(
                    site, f"{faster} set through downloader.slots (Crawl-delay {delay:g}s)"
                )
        self.gate.poke(scope)

    def _evicted(self, scope: Scope) -> None:
        self.stats.inc("scopes_evicted")
        self._evicted_recoveries += int(getattr(scope.manager, "recoveries", 0))
        # A scope made again starts counting its recoveries from 0. (Kind hints
        # stay: delay_scope(), slots[...] and a manager's backoff can make a
        # scope again with no request to give its kind; they are bounded.)
        self._recoveries_seen.pop(scope.id, None)
        self._rampup_seen.pop(scope.id, None)

    def hold_scope(self, scope_id: str, seconds: float) -> None:
        """Hold every request of *scope_id* for *seconds* (``delay_scope``); not capped.

        A ``host:port`` id (a URL's ``netloc``, as in the spec's recipe) also
        holds the host's scope, as a host name in capitals holds its
        lower-case one: default scopes are lower-case host names, like
        Scrapy's slots, so without this the recipe would hold a scope no
        request uses (see :func:`~slotkit.scope_ids.held_site_ids`).
        For the same reason, with ``THROTTLING_DOMAIN_GROUPING =
        "registrable_domain"`` a host also holds the group its requests share.
        """
        ids = held_site_ids(scope_id, self._netloc_scopes)
        if self.config.domain_grouping == "registrable_domain":
            group = registrable_domain(ids[-1])
            if group not in ids:
                ids.append(group)
        now = self._clock.seconds()
        for held in ids:
            scope = self.registry.get(held)
            scope.manager.record_backoff(seconds, now)
            scope.step_started_at = now
            self.gate.poke(scope)
        self.stats.inc("backoff/triggers/delay_scope")

    # What the throttling manager asks of the downloader

    def scope_ids(self, request: Request) -> list[str]:
        """The scopes *request* went through on its last trip (empty if unknown)."""
        return list(self._scope_ids.get(request, ()))

    def counts_requests(self, request: Request, scope_id: str) -> bool:
        """Whether *request* spends one unit of *scope_id* (so a server's request count applies).

        A request that names another amount for a scope (a cost, in the
        spec's cost recipe) counts something else there.
        """
        amount = self._scope_ids.get(request, {}).get(scope_id)
        return amount is None or amount == 1.0

    def now(self) -> float:
        """The crawl clock's current time (epoch seconds under a Twisted reactor)."""
        return float(self._clock.seconds())

    def is_address_of_host(self, request: Request, scope_id: str) -> bool:
        """Whether *scope_id* is the IP scope of *request*'s host name.

        (``CONCURRENT_REQUESTS_PER_IP``: other sites may share it.) A request
        to an address itself has that address for its site scope, and an
        address that is the request's first scope is what it was grouped by:
        ``False`` for both.
        """
        if scope_id == urlparse_cached(request).hostname:
            return False
        ids = self._scope_ids.get(request)
        if ids and next(iter(ids)) == scope_id:
            return False  # the request's own first scope (meta "10.0.0.1", a manager's grouping)
        scope = self.registry.peek(scope_id)
        kind = scope.kind if scope is not None else scope_kind(scope_id)
        return kind == IP

    def has_quota(self, scope_id: str) -> bool:
        """Whether the live scope *scope_id* counts a quota."""
        scope = self.registry.peek(scope_id)
        return scope is not None and getattr(scope.manager, "quota", None) is not None

    def backoff_config(self, scope_id: str) -> BackoffRules:
        """The backoff rules of *scope_id*."""
        return self.config.backoff_config(scope_id)

    def _log_recoveries(self, scopes: Sequence[Scope]) -> None:
        """THROTTLING_DEBUG: say when a scope stepped back from its backoff,
        and when rampup moved its concurrency or delay.

        Scope managers are pure and do not log; a recovery or rampup step is
        applied when the scope is next asked, so the dispatch that follows is
        where it shows.
        """
        for scope in scopes:
            manager = scope.manager
            recoveries = getattr(manager, "recoveries", None)
            if isinstance(recoveries, int):
                seen = self._recoveries_seen.get(scope.id, 0)
                if recoveries > seen:
                    logger.info(
                        "slotkit: scope %r recovered %d backoff step(s): %r",
                        scope.id,
                        recoveries - seen,
                        manager,
                    )
                self._recoveries_seen[scope.id] = recoveries
            rampup = getattr(manager, "rampup", None)
            steps = getattr(rampup, "steps", None)
            if isinstance(steps, int):
                # Rampup's own steps only: a Crawl-delay or a slots[...] write
                # also changes the pace, and is not rampup's doing.
                pace = (getattr(manager, "concurrency", 0), getattr(manager, "delay", 0.0))
                before = self._rampup_seen.get(scope.id)
                if before is not None and steps > before[0]:
                    logger.info(
                        "slotkit: scope %r rampup stepped up: concurrency %d, delay %.3g s",
                        scope.id,
                        pace[0],
                        pace[1],
                    )
                self._rampup_seen[scope.id] = (steps, pace[1])


def _faster_than_robots(written: dict[str, float], crawl_delay: float) -> str:
    """What of *written* (through ``downloader.slots``) is faster than a Crawl-delay asks."""
    faster = []
    if written.get("delay", crawl_delay) < crawl_delay:
        faster.append(f"delay {written['delay']:g}s")
    if written.get("concurrency", 1) > 1:
        faster.append(f"concurrency {written['concurrency']:g}")
    return ", ".join(faster)
