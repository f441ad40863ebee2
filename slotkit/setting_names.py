"""The names of slotkit's settings, and a warning for a misspelt one.

Scrapy ignores a setting nobody reads, so ``THROTTLING_REDIS_ULR`` would
silently leave every worker throttling on its own. slotkit owns the
``THROTTLING_``, ``BACKOFF_`` and ``RAMPUP_`` prefixes: a name under them
that slotkit does not read is reported once at start, with the closest
name it does read.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from slotkit.validation import _closest

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["SETTING_NAMES", "unknown_setting_names", "warn_unknown_setting_names"]

logger = logging.getLogger("slotkit")

#: Every setting slotkit reads under its own prefixes (docs/settings.rst).
SETTING_NAMES = frozenset(
    {
        "THROTTLING_SCOPES",
        "THROTTLING_SCOPE_CONCURRENCY",
        "THROTTLING_SCOPE_LIMIT",
        "THROTTLING_SCOPE_MANAGER",
        "THROTTLING_SCOPE_MAX_IDLE",
        "THROTTLING_MANAGER",
        "THROTTLING_WINDOW",
        "THROTTLING_DEBUG",
        "THROTTLING_DOMAIN_GROUPING",
        "THROTTLING_STATS_INTERVAL",
        "THROTTLING_ROBOTSTXT_OBEY",
        "THROTTLING_ROBOTSTXT_MAX_DELAY",
        "THROTTLING_REDIS_URL",
        "THROTTLING_REDIS_NAMESPACE",
        "THROTTLING_REDIS_TIMEOUT",
        "BACKOFF_HTTP_CODES",
        "BACKOFF_EXCEPTIONS",
        "BACKOFF_DELAY_FACTOR",
        "BACKOFF_MIN_DELAY",
        "BACKOFF_MAX_DELAY",
        "BACKOFF_JITTER",
        "BACKOFF_WINDOW",
        "BACKOFF_RESEND",
        "BACKOFF_RESEND_TIMEOUT",
        "RAMPUP_BACKOFF_TARGET",
    }
)
PREFIXES = ("THROTTLING_", "BACKOFF_", "RAMPUP_")


def unknown_setting_names(settings: BaseSettings) -> list[tuple[str, str]]:
    """``(name, hint)`` for each setting under slotkit's prefixes that it does not read."""
    return [
        (name, _closest(name, SETTING_NAMES))
        for name in sorted(str(key) for key in settings)
        if name.startswith(PREFIXES) and name not in SETTING_NAMES
    ]


def warn_unknown_setting_names(settings: BaseSettings) -> None:
    for name, hint in unknown_setting_names(settings):
        logger.warning("slotkit: the setting %s is not one slotkit reads%s", name, hint)
