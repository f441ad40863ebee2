"""robots.txt ``Crawl-delay`` as a scope's delay and concurrency.

Scrapy's RobotsTxtMiddleware sends ``robots_parsed`` once per site; this
module reads the site's ``Crawl-delay`` for the crawl's user agent from it
(``RobotParser.crawl_delay``) and makes it the site scope's delay, capped at
``THROTTLING_ROBOTSTXT_MAX_DELAY``, with a concurrency of 1. It is a floor:
jitter may lengthen the gap, never shorten it. The values
survive scope eviction: a Crawl-delay describes the site, not the run.

Values set explicitly for the scope (``THROTTLING_SCOPES`` or
``DOWNLOAD_SLOTS``) win; if they are more aggressive than the site asks, one
warning names both and the setting they came from, unless the scope's
``THROTTLING_SCOPES`` entry sets ``ignore_robots_txt``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.utils.httpobj import urlparse_cached

from slotkit.migration import SOURCE as AUTOTHROTTLE_SOURCE
from slotkit.scope_ids import netloc_keys, netloc_of
from slotkit.settings import CAPPED_SOURCE, UNCAPPED_CONCURRENCY_SOURCE

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from slotkit.registry import Scope
    from slotkit.settings import ScopeConfig

logger = logging.getLogger("slotkit")

__all__ = ["CrawlDelays", "apply_crawl_delay", "overrides_robots", "shortened_delay"]

ROBOTS = "robots.txt"
#: Settings whose values for a scope win over its robots.txt.
EXPLICIT = frozenset({"THROTTLING_SCOPES", "DOWNLOAD_SLOTS"})


def apply_crawl_delay(config: ScopeConfig, crawl_delay: float) -> tuple[ScopeConfig, str | None]:
    """*config* with the site's Crawl-delay applied, and a warning if the config wins.

    Delay and concurrency come from robots.txt unless they were configured
    for this very scope; a configured value faster than the site asks is
    kept, and reported.
    """
    sources = dict(config.sources)
    delay, concurrency = config.delay, config.concurrency
    faster = []
    origins: set[str] = set()
    if sources.get("delay") in EXPLICIT:
        if delay < crawl_delay:
            faster.append(f"delay {delay:g}s (Crawl-delay {crawl_delay:g}s)")
            origins.add(sources["delay"])
    else:
        delay = crawl_delay
        sources["delay"] = ROBOTS
    jitter = config.jitter
    if sources["delay"] == ROBOTS and jitter[0] < 0:
        # The site asked for at least this gap: jitter may lengthen it, never
        # shorten it (RANDOMIZE_DOWNLOAD_DELAY's ±50% would go to half).
        jitter = (0.0, max(0.0, jitter[1]))
    origin = _concurrency_origin(sources)
    if origin in EXPLICIT:
        if concurrency > 1:
            faster.append(f"concurrency {concurrency} (robots.txt implies 1)")
            origins.add(origin)
    else:
        concurrency = 1
        sources["concurrency"] = ROBOTS
    rampup = config.rampup
    if rampup is not None and sources["delay"] == ROBOTS and rampup.min_delay < delay:
        # Rampup lowers the delay step by step: the site's Crawl-delay is where it stops.
        rampup = replace(rampup, min_delay=delay)
    updated = replace(
        config,
        delay=delay,
        jitter=jitter,
        rampup=rampup,
        concurrency=concurrency,
        min_concurrency=min(config.min_concurrency, concurrency),
        sources=sources,
    )
    warning = None
    if faster and not config.ignore_robots_txt:
        warning = f"{', '.join(faster)}. {_advice(origins)}"
    return updated, warning


def shortened_delay(config: ScopeConfig, crawl_delay: float) -> float | None:
    """The longer delay a Crawl-delay replaces in *config*, if it does (``None``: none).

    A Crawl-delay overrides ``DOWNLOAD_DELAY`` (the specification's rule),
    downwards too: the site allows it. Only a delay configured for the scope
    itself is kept.
    """
    if config.sources.get("delay") in EXPLICIT or config.delay <= crawl_delay:
        return None
    return config.delay


def _delay_setting(source: str | None) -> str:
    """The setting a scope's delay came from, by its source ("default": DOWNLOAD_DELAY)."""
    if source == AUTOTHROTTLE_SOURCE:
        return "AUTOTHROTTLE_START_DELAY"
    return "DOWNLOAD_DELAY" if source in (None, "default") else source


def overrides_robots(config: ScopeConfig) -> bool:
    """Whether *config* sets its own pace: a delay or concurrency configured for
    that very scope, or ``ignore_robots_txt``.

    A request whose first scope is not its site's (domain grouping, a
    ``download_slot``, the ``throttling_scopes`` meta) is also held by its
    site's scope when the site has a Crawl-delay, unless that first scope
    says so.
    """
    if config.ignore_robots_txt or config.sources.get("delay") in EXPLICIT:
        return True
    return _concurrency_origin(config.sources) in EXPLICIT


def _concurrency_origin(sources: Mapping[str, str]) -> str | None:
    """Where a scope's concurrency was configured, looking through the crawl-wide cap.

    A configured 32 capped by CONCURRENT_REQUESTS = 16 is still configured (a
    probe saw it silently replaced by robots.txt's 1).
    """
    origin = sources.get("concurrency")
    if origin == CAPPED_SOURCE:
        origin = sources.get(UNCAPPED_CONCURRENCY_SOURCE)
    return origin


def _advice(origins: set[str]) -> str:
    """Where the faster values came from, and how to silence the warning there.

    Only a ``THROTTLING_SCOPES`` entry takes ``ignore_robots_txt``; a
    ``DOWNLOAD_SLOTS`` entry refuses it, so its values have to move (a
    ``THROTTLING_SCOPES`` entry for the same id merges with it key by key).
    """
    named = " and ".join(sorted(origins))
    if origins == {"THROTTLING_SCOPES"}:
        return (
            f"Keeping the values configured in {named}; set 'ignore_robots_txt': True "
            "in that entry to silence this"
        )
    return (
        f"Keeping the values configured in {named}; DOWNLOAD_SLOTS entries cannot take "
        "'ignore_robots_txt', so to silence this move the entry to THROTTLING_SCOPES "
        "and set 'ignore_robots_txt': True there"
    )


class CrawlDelays:
    """Crawl-delay per site, fed by Scrapy's ``robots_parsed`` signal."""

    def __init__(
        self,
        crawler: Crawler,
        max_delay: float,
        on_delay: Callable[[str, float], Any],
    ) -> None:
        self._crawler = crawler
        self._max_delay = max_delay
        self._on_delay = on_delay
        settings = crawler.settings
        self._user_agent = settings.get("ROBOTSTXT_USER_AGENT") or None
        self._default_agent = settings.get("USER_AGENT") or ""
        #: Ports with a scope of their own (a ``host:port`` settings key).
        self._netloc_sites = netloc_keys(settings)
        #: Site (host name) -> Crawl-delay in seconds, already capped.
        self.delays: dict[str, float] = {}
        self._warned: set[str] = set()
        self._noted: set[str] = set()
        crawler.signals.connect(self._robots_parsed, signal=signals.robots_parsed)

    def _robots_parsed(self, robotparser: Any, request: Request) -> None:
        agent = self._user_agent or request.headers.get(b"User-Agent") or self._default_agent
        try:
            delay = robotparser.crawl_delay(agent)
        except Exception:  # a third-party parser must not break the crawl
            logger.debug("slotkit: robots.txt parser failed on crawl_delay()", exc_info=True)
            return
        if delay is None:
            return
        site = urlparse_cached(request).hostname or ""
        try:
            delay = float(delay)
        except (TypeError, ValueError):
            logger.debug("slotkit: ignoring %s's robots.txt Crawl-delay %r", site, delay)
            return
        # 0 is a valid Crawl-delay: no gap, but still one request at a time.
        if not math.isfinite(delay) or delay < 0:
            logger.debug("slotkit: ignoring %s's robots.txt Crawl-delay %r", site, delay)
            return
        if delay > self._max_delay:
            logger.info(
                "slotkit: %s asks for Crawl-delay %gs; using THROTTLING_ROBOTSTXT_MAX_DELAY=%gs",
                site,
                delay,
                self._max_delay,
            )
            delay = self._max_delay
        # robots.txt belongs to one port: a port with a scope of its own takes it
        # alone; otherwise the host's scope (shared by its ports, like Scrapy's
        # slots) and a host:port scope a custom manager may name.
        netloc = netloc_of(urlparse_cached(request).netloc)
        own_scope = self._netloc_sites.get(netloc)
        for scope_id in {own_scope} if own_scope is not None else {site, netloc}:
            # Ports sharing the host's scope may ask for different delays: the
            # largest is a floor for all of them (the last parsed won before).
            larger = max(delay, self.delays.get(scope_id, 0.0))
            self.delays[scope_id] = larger
            self._on_delay(scope_id, larger)

    def site_delay(self, request: Request) -> tuple[str, float] | None:
        """The scope id of *request*'s site and its Crawl-delay, if robots.txt gave one.

        The id is the one :meth:`_robots_parsed` stored the delay under: the
        host name, or ``host:port`` for a port with a scope of its own.
        """
        if not self.delays:
            return None
        parsed = urlparse_cached(request)
        site = self._netloc_sites.get(netloc_of(parsed.netloc)) or parsed.hostname or ""
        delay = self.delays.get(site)
        return None if delay is None else (site, delay)

    def warn_once(self, scope_id: str, warning: str) -> None:
        """Log, once per scope, that its configuration is faster than its robots.txt asks."""
        if scope_id in self._warned:
            return
        self._warned.add(scope_id)
        logger.warning(
            "slotkit: scope %r is more aggressive than its robots.txt: %s.", scope_id, warning
        )

    def note_shortened(self, scope_id: str, crawl_delay: float, config: ScopeConfig) -> None:
        """Say, once per scope, that its Crawl-delay replaced a longer crawl-wide delay."""
        longer = shortened_delay(config, crawl_delay)
        if longer is None or scope_id in self._noted:
            return
        self._noted.add(scope_id)
        logger.info(
            "slotkit: scope %r waits its robots.txt Crawl-delay %gs between requests, in "
            "place of the longer %gs from %s (other scopes of its requests keep their "
            "own); set a delay for it in THROTTLING_SCOPES to keep the longer one",
            scope_id,
            crawl_delay,
            longer,
            _delay_setting(config.sources.get("delay")),
        )

    def update_live(self, scope: Scope, config: ScopeConfig) -> None:
        """Bring a scope that already exists to the robots-adjusted *config*."""
        scope.manager.set_base_delay(config.delay)
        scope.manager.set_concurrency(config.concurrency)
        if config.rampup is not None:
            # Not part of the interface either: a rampup floor only slotkit's managers know.
            set_rampup_min_delay = getattr(scope.manager, "set_rampup_min_delay", None)
            if callable(set_rampup_min_delay):
                set_rampup_min_delay(config.rampup.min_delay)
        # Not part of the scope-manager interface: managers without jitter skip it.
        set_jitter = getattr(scope.manager, "set_jitter", None)
        if callable(set_jitter):
            set_jitter(config.jitter)
