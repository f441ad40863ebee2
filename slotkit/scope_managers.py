"""Building scope managers: the default one, or a user's class, checked at start."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotkit.interfaces import IThrottlingScopeManager
from slotkit.scope import ThrottlingScopeManager
from slotkit.settings import ScopeConfig, SettingsError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = ["check_scope_manager_class", "create_scope_manager"]

#: The methods slotkit calls on every scope manager.
REQUIRED_METHODS = tuple(name for name in IThrottlingScopeManager.names() if name != "from_crawler")


def check_scope_manager_class(where: str, cls: type | None) -> None:
    """Refuse, at crawler start, a scope manager class that lacks part of the interface."""
    if cls is None:
        return
    missing = [name for name in REQUIRED_METHODS if not callable(getattr(cls, name, None))]
    if missing:
        raise SettingsError(
            f"{where} names {cls.__module__}.{cls.__qualname__}, which does not provide "
            f"slotkit.interfaces.IThrottlingScopeManager: missing {', '.join(sorted(missing))}"
        )


def create_scope_manager(crawler: Crawler, config: ScopeConfig) -> Any:
    """Instantiate the scope manager for one scope from its resolved *config*."""
    cls = config.manager
    if cls is None or cls is ThrottlingScopeManager:
        # Positional: a broad crawl comes here once per request, and binding
        # nine keywords costs more than the rest of the call.
        return ThrottlingScopeManager(
            config.concurrency,
            config.delay,
            config.jitter,
            config.min_concurrency,
            None,  # rng: the shared one
            config.backoff,
            config.quota,
            config.window,
            config.rampup,
        )
    factory = getattr(cls, "from_crawler", None)
    if factory is not None:
        return factory(crawler, config.as_dict())
    return cls(crawler, config.as_dict())
