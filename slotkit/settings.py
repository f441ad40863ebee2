"""Read and validate slotkit's settings once, at crawler start.

Everything a scope needs is resolved here into plain values, so a bad value
fails before the first request with a message that names the setting, the
scope, what arrived and what is accepted. Nothing in here touches a reactor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from slotkit.backoff import BackoffRules, read_backoff, scope_backoff
from slotkit.migration import SOURCE as AUTOTHROTTLE_SOURCE
from slotkit.migration import AutoThrottleMapping, autothrottle_mapping
from slotkit.rampup import RampupConfig, rampup_backoff
from slotkit.redis_settings import check_redis_settings
from slotkit.scope_config import ScopeConfig
from slotkit.scope_entries import (
    DEFAULT_THROTTLING_SCOPES,
    RESERVED_SCOPE_KEYS,
    SCOPE_KEYS,
    load_class,
    parse_target,
    positive,
    slot_entry,
    validate_scope_entry,
    warn_capped_floors,
    warn_serial_quotas,
)
from slotkit.validation import (
    NO_JITTER,
    Jitter,
    SettingsError,
    _closest,
    _describe,
    _integer,
    _number,
    as_bool,
    default_jitter,
    dict_setting,
    parse_jitter,
    per_ip_setting,
)

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "NO_JITTER",
    "RESERVED_SCOPE_KEYS",
    "SCOPE_KEYS",
    "Jitter",
    "ScopeConfig",
    "ThrottlingSettings",
    "SettingsError",
    "parse_jitter",
]


#: Source of a concurrency that ``CONCURRENT_REQUESTS`` capped.
CAPPED_SOURCE = "CONCURRENT_REQUESTS (cap)"
#: Key of ``ScopeConfig.sources`` saying where a capped concurrency came from.
UNCAPPED_CONCURRENCY_SOURCE = "concurrency before the cap"


#: Values of ``THROTTLING_DOMAIN_GROUPING``: one scope per host name, or per
#: registrable domain (``books.example.co.uk`` -> ``example.co.uk``).
DOMAIN_GROUPINGS = frozenset({"host", "registrable_domain"})

#: Kinds of scope; they differ only in their default concurrency.
DOMAIN, IP, CUSTOM = "domain", "ip", "custom"


@dataclass(frozen=True)
class ThrottlingSettings:
    """Every throttling setting of a crawl, validated.

    Built with :meth:`from_settings` (Scrapy settings in, :class:`SettingsError`
    naming the setting for any bad value); :meth:`scope_config` resolves one
    scope's configuration from it. The downloader keeps it as ``config``.
    """

    domain_concurrency: int = 8
    ip_concurrency: int = 0
    scope_concurrency: int = 1
    total_concurrency: int = 16
    delay: float = 0.0
    jitter: Jitter = (-0.5, 0.5)
    scopes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    slots: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    scope_limit: int = 100_000
    scope_max_idle: float = 3600.0
    warn_threshold: int = 500
    debug: bool = False
    manager: type | None = None
    scope_manager: type | None = None
    backoff: BackoffRules = field(default_factory=BackoffRules)
    #: Per-scope backoff rules, for scopes whose entry has a ``"backoff"`` dict.
    scope_backoffs: Mapping[str, BackoffRules] = field(default_factory=dict)
    resend: bool = True
    resend_timeout: float = 180.0
    #: Resolved configs of scopes with no entry of their own, by kind.
    _kind_configs: dict[str, ScopeConfig] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    window: float = 60.0
    rampup_target: tuple[int, int] = (1, 1)
    robots_obey: bool = False
    robots_max_delay: float = 60.0
    #: The longest wait a redirect's Retry-After gets (slotkit.redirect_wait).
    redirect_max_delay: float = 100.0
    domain_grouping: str = "host"
    #: AutoThrottle settings mapped onto slotkit's (``AUTOTHROTTLE_ENABLED``).
    autothrottle: AutoThrottleMapping | None = None
    #: ``THROTTLING_REDIS_TIMEOUT``, checked with or without a store.
    redis_timeout: float = 0.25
    #: Whether ``BACKOFF_MIN_DELAY`` / ``BACKOFF_DELAY_FACTOR`` were set (rampup scopes
    #: otherwise take smaller steps, see ``_rampup_backoff``).
    backoff_min_delay_set: bool = False
    backoff_factor_set: bool = False

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> ThrottlingSettings:
        """Read and check every setting; raise :class:`SettingsError` on the first bad one."""
        raw_scopes = (
            DEFAULT_THROTTLING_SCOPES
            if settings.get("THROTTLING_SCOPES") is None
            else dict_setting(settings, "THROTTLING_SCOPES")
        )
        if not isinstance(raw_scopes, Mapping):
            raise SettingsError(
                "THROTTLING_SCOPES must be a dict mapping scope ids to dicts of options "
                f"(got {_describe(raw_scopes)})"
            )
        scopes = {
            scope: validate_scope_entry("THROTTLING_SCOPES", scope, entry)
            for scope, entry in raw_scopes.items()
        }
        # Scrapy's getdict() takes an empty list as {} here: so does slotkit.
        raw_slots = dict_setting(settings, "DOWNLOAD_SLOTS") or {}
        if not isinstance(raw_slots, Mapping):
            raise SettingsError(f"DOWNLOAD_SLOTS must be a dict (got {_describe(raw_slots)})")
        slots = {str(key): slot_entry(str(key), entry) for key, entry in raw_slots.items()}
        manager = settings.get("THROTTLING_MANAGER")
        scope_manager = settings.get("THROTTLING_SCOPE_MANAGER")
        backoff = read_backoff(settings)
        autothrottle = autothrottle_mapping(settings)
        if autothrottle is not None and autothrottle.max_delay is not None:
            backoff = replace(backoff, max_delay=autothrottle.max_delay)
            backoff = replace(backoff, min_delay=min(backoff.min_delay, backoff.max_delay))
        scope_backoffs = {
            scope: scope_backoff(
                backoff, f"THROTTLING_SCOPES[{scope!r}]['backoff']", entry["backoff"]
            )
            for scope, entry in scopes.items()
            if "backoff" in entry
        }
        grouping = settings.get("THROTTLING_DOMAIN_GROUPING", "host")
        if not isinstance(grouping, str) or grouping not in DOMAIN_GROUPINGS:
            raise SettingsError(
                f"THROTTLING_DOMAIN_GROUPING must be one of {', '.join(sorted(DOMAIN_GROUPINGS))} "
                f"(got {_describe(grouping)})"
                f"{_closest(str(grouping), DOMAIN_GROUPINGS, words=False)}"
            )
        delay = _number("DOWNLOAD_DELAY", settings.get("DOWNLOAD_DELAY", 0.0))
        if autothrottle is not None and autothrottle.delay is not None:
            delay = autothrottle.delay
        # Read even while ROBOTSTXT_OBEY is off, so a bad value fails there too.
        obey_slotkit = as_bool(settings, "THROTTLING_ROBOTSTXT_OBEY", True)
        config = cls(
            autothrottle=autothrottle,
            backoff_min_delay_set=settings.get("BACKOFF_MIN_DELAY") is not None,
            backoff_factor_set=settings.get("BACKOFF_DELAY_FACTOR") is not None,
            domain_grouping=grouping,
            robots_obey=as_bool(settings, "ROBOTSTXT_OBEY") and obey_slotkit,
            redis_timeout=check_redis_settings(settings),
            robots_max_delay=_number(
                "THROTTLING_ROBOTSTXT_MAX_DELAY",
                settings.get("THROTTLING_ROBOTSTXT_MAX_DELAY", 60.0),
            ),
            redirect_max_delay=_number(
                "REDIRECT_MAX_DELAY", settings.get("REDIRECT_MAX_DELAY", 100.0)
            ),
            window=positive("THROTTLING_WINDOW", settings.get("THROTTLING_WINDOW", 60.0)),
            rampup_target=parse_target(
                "RAMPUP_BACKOFF_TARGET", settings.get("RAMPUP_BACKOFF_TARGET", 1)
            ),
            backoff=backoff,
            scope_backoffs=scope_backoffs,
            resend=as_bool(settings, "BACKOFF_RESEND", True),
            resend_timeout=_number(
                "BACKOFF_RESEND_TIMEOUT", settings.get("BACKOFF_RESEND_TIMEOUT", 180.0)
            ),
            domain_concurrency=_integer(
                "CONCURRENT_REQUESTS_PER_DOMAIN",
                settings.get("CONCURRENT_REQUESTS_PER_DOMAIN", 8),
                minimum=1,
            ),
            ip_concurrency=_integer(
                "CONCURRENT_REQUESTS_PER_IP",
                per_ip_setting(settings),
                minimum=0,
            ),
            scope_concurrency=_integer(
                "THROTTLING_SCOPE_CONCURRENCY",
                settings.get("THROTTLING_SCOPE_CONCURRENCY", 1),
                minimum=1,
            ),
            total_concurrency=_integer(
                "CONCURRENT_REQUESTS", settings.get("CONCURRENT_REQUESTS", 16), minimum=0
            ),
            delay=delay,
            jitter=default_jitter(settings),
            scopes=scopes,
            slots=slots,
            scope_limit=_integer(
                "THROTTLING_SCOPE_LIMIT", settings.get("THROTTLING_SCOPE_LIMIT", 100_000), minimum=0
            ),
            scope_max_idle=_number(
                "THROTTLING_SCOPE_MAX_IDLE", settings.get("THROTTLING_SCOPE_MAX_IDLE", 3600.0)
            ),
            warn_threshold=_integer(
                "DELAYED_REQUESTS_WARN_THRESHOLD",
                settings.get("DELAYED_REQUESTS_WARN_THRESHOLD", 500),
                minimum=0,
            ),
            debug=as_bool(settings, "THROTTLING_DEBUG")
            or (autothrottle is not None and autothrottle.debug),
            manager=None if manager is None else load_class("THROTTLING_MANAGER", manager),
            scope_manager=(
                None
                if scope_manager is None
                else load_class("THROTTLING_SCOPE_MANAGER", scope_manager)
            ),
        )
        warn_serial_quotas(
            config.scopes,
            config.slots,
            config.scope_concurrency,
            config.scope_manager,
            config.total_concurrency,
        )
        warn_capped_floors(config)
        return config

    def backoff_config(self, scope: str) -> BackoffRules:
        """The backoff rules of *scope*: its ``"backoff"`` overrides, else the globals."""
        return self.scope_backoffs.get(scope, self.backoff)

    def default_concurrency(self, kind: str) -> int:
        """The concurrency of a scope of *kind* that configures none."""
        if kind == IP and self.ip_concurrency:
            return self.ip_concurrency
        if kind == CUSTOM:
            return self.scope_concurrency
        return self.domain_concurrency

    def default_concurrency_setting(self, kind: str) -> str:
        """The setting :meth:`default_concurrency` reads for a scope of *kind*."""
        if kind == IP and self.ip_concurrency:
            return "CONCURRENT_REQUESTS_PER_IP"
        if kind == CUSTOM:
            return "THROTTLING_SCOPE_CONCURRENCY"
        return "CONCURRENT_REQUESTS_PER_DOMAIN"

    def scope_config(self, scope: str, kind: str) -> ScopeConfig:
        """Resolve the configuration of *scope*: defaults, then ``DOWNLOAD_SLOTS``,
        then ``THROTTLING_SCOPES``; ``CONCURRENT_REQUESTS`` caps the concurrency."""
        if scope not in self.scopes and scope not in self.slots:
            # Most scopes configure nothing of their own: their config depends
            # only on their kind, and a broad crawl creates one per request.
            cached = self._kind_configs.get(kind)
            if cached is None:
                cached = self._kind_configs[kind] = self._resolve(scope, kind)
            return cached
        return self._resolve(scope, kind)

    def _resolve(self, scope: str, kind: str) -> ScopeConfig:
        sources = {
            "concurrency": "default",
            "delay": "default" if self.autothrottle is None else AUTOTHROTTLE_SOURCE,
            "jitter": "default",
            "min_concurrency": "default",
        }
        values: dict[str, Any] = {
            "concurrency": self.default_concurrency(kind),
            "delay": self.delay,
            "jitter": self.jitter,
            "min_concurrency": 1,
            "manager": self.scope_manager,
            "quota": None,
            "window": self.window,
            # AutoThrottle steered every slot; a site may be a name or an address.
            "rampup": {"min_delay": self.autothrottle.min_delay}
            if kind != CUSTOM and self.autothrottle and self.autothrottle.rampup
            else None,
            "ignore_robots_txt": False,
        }
        if values["rampup"] is not None:
            sources["rampup"] = AUTOTHROTTLE_SOURCE
        for origin, table in (("DOWNLOAD_SLOTS", self.slots), ("THROTTLING_SCOPES", self.scopes)):
            entry = table.get(scope)
            if entry:
                values.update(entry)
                sources.update(dict.fromkeys(entry, origin))
        concurrency = values["concurrency"]
        if self.total_concurrency and concurrency > self.total_concurrency:
            concurrency = self.total_concurrency
            # Robots.txt keeps a value configured for this scope, capped or not.
            sources[UNCAPPED_CONCURRENCY_SOURCE] = sources.get("concurrency", "default")
            sources["concurrency"] = CAPPED_SOURCE
        rampup = self._rampup_config(values["rampup"])
        backoff = self.backoff_config(scope)
        if rampup is not None and sources.get("rampup") != AUTOTHROTTLE_SOURCE:
            # Not for the AutoThrottle mapping's rampup, which every site of a
            # polite crawl gets: their backoff stays as steep as configured.
            backoff = self._rampup_backoff(scope, backoff, rampup)
        return ScopeConfig(
            concurrency=concurrency,
            delay=values["delay"],
            jitter=values["jitter"],
            min_concurrency=min(values["min_concurrency"], concurrency),
            manager=values["manager"],
            backoff=backoff,
            quota=values["quota"],
            window=values["window"],
            rampup=rampup,
            ignore_robots_txt=values["ignore_robots_txt"],
            sources=sources,
        )

    def _rampup_backoff(
        self, scope: str, backoff: BackoffRules, rampup: RampupConfig
    ) -> BackoffRules:
        """*backoff* with rampup's small steps where the user chose none (see
        :func:`slotkit.rampup.rampup_backoff`)."""
        entry = self.scopes.get(scope, {}).get("backoff")
        chosen = set(entry) if isinstance(entry, Mapping) else set()
        return rampup_backoff(
            backoff,
            rampup,
            min_delay_chosen=self.backoff_min_delay_set or "min_delay" in chosen,
            factor_chosen=self.backoff_factor_set or "delay_factor" in chosen,
        )

    def _rampup_config(self, entry: Mapping[str, Any] | None) -> RampupConfig | None:
        if entry is None:
            return None
        return RampupConfig(
            target=entry.get("backoff_target", self.rampup_target),
            delay_factor=entry.get("delay_factor", 0.5),
            min_delay=entry.get("min_delay", 0.0),
            window=self.backoff.window,
        )
