"""The shared backend's settings, checked without connecting to anything.

Called by :meth:`ThrottlingSettings.from_settings
<slotkit.settings.ThrottlingSettings.from_settings>`, so the crawl and
``python -m slotkit explain`` refuse the same values. ``THROTTLING_REDIS_TIMEOUT``
is checked even without a URL: "every value is checked when the crawler starts".
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlparse

from slotkit.validation import SettingsError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["DEFAULT_TIMEOUT", "check_redis_settings", "check_redis_url", "redis_timeout"]

DEFAULT_TIMEOUT = 0.25


def check_redis_settings(settings: BaseSettings) -> float:
    """Check ``THROTTLING_REDIS_URL`` (when set) and return ``THROTTLING_REDIS_TIMEOUT``."""
    url = settings.get("THROTTLING_REDIS_URL")
    if url:
        check_redis_url(str(url))
    return redis_timeout(settings)


def redis_timeout(settings: BaseSettings) -> float:
    """``THROTTLING_REDIS_TIMEOUT`` in seconds (> 0), or a :class:`SettingsError`."""
    raw = settings.get("THROTTLING_REDIS_TIMEOUT", DEFAULT_TIMEOUT)
    try:
        timeout = settings.getfloat("THROTTLING_REDIS_TIMEOUT", DEFAULT_TIMEOUT)
    except ValueError:
        timeout = float("nan")
    if not timeout > 0 or timeout == float("inf"):
        raise SettingsError(
            f"THROTTLING_REDIS_TIMEOUT must be a number of seconds > 0 (got {raw!r})"
        )
    return timeout


def check_redis_url(url: str) -> None:
    """Refuse a ``THROTTLING_REDIS_URL`` that could never be used (no connection made)."""
    if url == "local":
        return
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise SettingsError(
            f"THROTTLING_REDIS_URL must be a redis://, rediss:// or unix:// URL, or 'local' "
            f"(got {url!r})"
        )
    try:
        from redis.connection import parse_url
    except ImportError:
        raise SettingsError(
            "THROTTLING_REDIS_URL is set but redis-py is not installed; "
            "install it with: pip install 'slotkit[redis]'"
        ) from None
    try:
        parse_url(url)
    except ValueError as exc:
        raise SettingsError(f"THROTTLING_REDIS_URL {url!r} cannot be used: {exc}") from None
    database = urlparse(url).path.strip("/")
    if url.startswith(("redis://", "rediss://")) and database and not database.isdigit():
        # redis-py would quietly use database 0.
        raise SettingsError(
            f"THROTTLING_REDIS_URL {url!r}: the database after the host must be a number, "
            f"as in redis://localhost:6379/0 (got {database!r})"
        )
