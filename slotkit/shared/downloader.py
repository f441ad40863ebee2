"""``slotkit.shared.SharedDownloader``: slotkit's downloader with throttling shared through Redis.

``slotkit.Downloader`` builds this class itself when ``THROTTLING_REDIS_URL``
is set, so users need not name it.

It adds one step to the path of a request: after the local gate admitted it
(local concurrency and known holds), :meth:`SharedThrottle.reserve` waits
for the shared store, and the leases are given back after the download.
Everything else (signals, middlewares, backoff detection, slots view) is
:class:`slotkit.Downloader`'s.

Settings (read here; the shared part is off unless ``THROTTLING_REDIS_URL`` is set):

``THROTTLING_REDIS_URL``
    ``redis://host:port/db`` (``rediss://`` for TLS), or ``local`` for an
    in-process store shared by the crawlers of one process.
``THROTTLING_REDIS_NAMESPACE``
    The hash tag every key lives under (default ``slotkit``); crawls that
    must throttle together use the same one.
``THROTTLING_REDIS_TIMEOUT``
    Seconds one store call may take before it counts as a failure (0.25).
"""

from __future__ import annotations

import contextvars
import os
import socket
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.reactor import is_asyncio_reactor_installed, is_reactor_installed

from slotkit.downloader import Downloader
from slotkit.shared.client import AsyncioRedisBackend, Backend, TwinBackend
from slotkit.shared.manager import SharedScopeManager
from slotkit.shared.threaded import ThreadedRedisBackend
from slotkit.shared.throttle import Pass, SharedThrottle, ThrottleOptions
from slotkit.shared.twin import TwinStore

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.interfaces import IReactorTime

    from slotkit.gate import Waiter
    from slotkit.registry import Scope
    from slotkit.settings import ScopeConfig

__all__ = ["SharedDownloader", "current_pass", "local_store"]

#: The shared pass of the request whose outcome is being applied (for backoff dedup).
current_pass: contextvars.ContextVar[Pass | None] = contextvars.ContextVar(
    "slotkit_current_pass", default=None
)

_LOCAL_STORES: dict[int, TwinStore] = {}


def local_store(clock: IReactorTime) -> TwinStore:
    """The process-wide twin store of ``THROTTLING_REDIS_URL = "local"``."""
    store = _LOCAL_STORES.get(id(clock))
    if store is None:
        store = _LOCAL_STORES[id(clock)] = TwinStore(clock)
    return store


def make_backend(url: str, timeout: float, clock: IReactorTime) -> Backend:
    """The backend for *url* (checked by ``ThrottlingSettings``), matched to the reactor in use."""
    if url == "local":
        return TwinBackend(local_store(clock))
    if not is_reactor_installed() or is_asyncio_reactor_installed():
        return AsyncioRedisBackend(url, timeout, clock)
    return ThreadedRedisBackend(url, timeout, clock)


class SharedDownloader(Downloader):
    """:class:`slotkit.Downloader` plus the shared store (``THROTTLING_REDIS_URL``)."""

    def __init__(
        self,
        crawler: Crawler,
        clock: IReactorTime | None = None,
        backend: Backend | None = None,
    ) -> None:
        settings = crawler.settings
        url = settings.get("THROTTLING_REDIS_URL")
        self.shared: SharedThrottle | None = None
        #: Requests the local gate admitted that wait for the store's answer.
        self._at_store: set[Request] = set()
        self._cut_at_store: list[Request] = []
        super().__init__(crawler, clock)
        timeout = self.config.redis_timeout
        if backend is None and not url:
            return
        if backend is None:
            backend = make_backend(str(url), timeout, self._clock)
        options = ThrottleOptions(
            namespace=settings.get("THROTTLING_REDIS_NAMESPACE") or "slotkit",
            timeout=timeout,
            lease_ttl=settings.getfloat("DOWNLOAD_TIMEOUT", 180.0) + 10.0,
        )
        worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.shared = SharedThrottle(backend, self._clock, worker, options, self._mode_changed)
        crawler.slotkit_shared = self.shared  # type: ignore[attr-defined]
        self.shared.start()
        # The engine awaits spider_closed handlers: the connections close before the
        # reactor stops (bounded by the call timeout, whatever the store does).
        crawler.signals.connect(self._close_store, signal=signals.spider_closed)

    # Scopes use the shared manager unless the user named another one.

    def scope_config(self, scope_id: str, kind: str | None = None) -> ScopeConfig:
        config = super().scope_config(scope_id, kind)
        if self.shared is not None and config.manager is None:
            config = replace(config, manager=SharedScopeManager)
        return config

    def _new_scope(self, scope_id: str) -> Scope:
        scope = super()._new_scope(scope_id)
        manager = scope.manager
        if isinstance(manager, SharedScopeManager):
            manager.bind(scope_id)
            if self.crawl_delays is not None:
                manager.crawl_delay = self.crawl_delays.delays.get(scope_id, 0.0)
            if self.shared is not None:
                manager.throttle = self.shared
                self.shared.register(manager)
        return scope

    def _crawl_delay_found(self, site: str, delay: float) -> None:
        scope = self.registry.peek(site)
        if scope is not None and isinstance(scope.manager, SharedScopeManager):
            scope.manager.crawl_delay = delay
        super()._crawl_delay_found(site, delay)

    def _spider_closing(self, reason: str) -> None:
        if self.shared is None or self._closing_reason is not None:
            super()._spider_closing(reason)
            return
        # 1. Those waiting at the store count in the close line too.
        self._cut_at_store = list(self._at_store)
        # 2. The base decides their fate (JOBDIR: back to the scheduler) and
        #    closes the local gate, so that a ticket given back in step 3
        #    admits nobody (on a plain reactor the next waiter would go at
        #    once, and meet the closed store uncounted).
        super()._spider_closing(reason)
        # 3. Then the waits at the store end.
        self.shared.stop_waiting(f"the spider closed ({reason})")

    def _requests_waiting(self) -> list[Request]:
        return super()._requests_waiting() + self._cut_at_store

    def _mode_changed(self, mode: str) -> None:
        self.stats.inc(f"shared/mode/{mode}")

    # The extra step on the path of a request

    async def _acquire(
        self,
        request: Request,
        scopes: list[Scope],
        amounts: list[float | None],
        delay: float,
        arrived: float | None = None,
    ) -> Waiter:
        entered = self._clock.seconds()
        ticket = await super()._acquire(request, scopes, amounts, delay, arrived)
        if self.shared is None:
            return ticket
        admitted = self._clock.seconds()
        self._at_store.add(request)
        try:
            shared_pass = await self.shared.reserve(request, scopes, amounts)
        except BaseException:
            self.gate.release(ticket)
            raise
        finally:
            self._at_store.discard(request)
        self._passes[ticket] = shared_pass
        # The reservation may have waited: backoff's "sent before the step?"
        # must see when the request really left.
        ticket.left_at = now = self._clock.seconds()
        # The wait stats cover the whole wait, the store's part included.
        if ticket.enqueued_at > 0:  # the local gate counted this request already
            self.stats.inc("wait_time_total", now - admitted)
            self.stats.max("wait_time_max", now - entered)
        elif shared_pass.waited:
            self.stats.waited(now - entered)
        return ticket

    async def _transfer(self, request: Request, ticket: Waiter) -> tuple[Response, bool]:
        shared_pass = self._passes.pop(ticket, None)
        token = current_pass.set(shared_pass)
        try:
            return await super()._transfer(request, ticket)
        finally:
            current_pass.reset(token)
            if shared_pass is not None and self.shared is not None:
                self.shared.release(shared_pass)

    @property
    def _passes(self) -> dict[Waiter, Pass]:
        passes: dict[Waiter, Pass] | None = self.__dict__.get("_shared_passes")
        if passes is None:
            passes = self.__dict__["_shared_passes"] = {}
        return passes

    def close(self) -> None:
        if self.shared is not None:
            summary = self.shared_summary()
            for key, value in summary.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    self.stats.set(f"shared/{key}", value)
            # How long the store took to answer, as this worker's loop saw it.
            took = sorted(summary["latencies"])
            for name, share in (("p50", 0.5), ("p99", 0.99)):
                if took:
                    at = min(len(took) - 1, int(share * len(took)))
                    self.stats.set(f"shared/acquire_{name}_ms", round(took[at] * 1000, 3))
            self.shared.close()
        super().close()

    async def _close_store(self) -> None:
        # A coroutine, not a Deferred: Scrapy 2.19 deprecates signal handlers
        # that return Deferreds (a warning in every shared crawl's log).
        if self.shared is None:
            return
        closing = self.shared.close()
        closing.addTimeout(2 * self.shared.options.timeout + 0.5, self._clock)
        closing.addErrback(lambda _: None)
        await maybe_deferred_to_future(closing)

    def shared_summary(self) -> dict[str, Any]:
        """Counters of the shared layer (for benchmarks and the status line)."""
        shared = self.shared
        if shared is None:
            return {}
        return {
            "mode": shared.mode,
            "workers": shared.workers,
            "calls": shared.calls,
            "acquires": shared.acquires,
            "fallback_requests": shared.fallback_requests,
            "fallbacks": shared.fallbacks,
            "resyncs": shared.resyncs,
            "fell_back_at": shared.fell_back_at,
            "resynced_at": shared.resynced_at,
            "events": shared.event_count,
            "hold_event_at": shared.last_hold_event_at,
            "go_now": list(getattr(getattr(shared.backend, "stats", None), "go_now", [])),
            "reasks": shared.reasks,
            "late": shared.late,
            "commands": getattr(getattr(shared.backend, "stats", None), "commands", 0),
            "latencies": shared.latencies,
            "sent_at": list(getattr(getattr(shared.backend, "stats", None), "sent_at", [])),
            **{f"backoff/{k}": v for k, v in shared.backoff_outcomes.items()},
        }
