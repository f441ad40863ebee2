"""Throttling shared by several crawler processes through Redis (opt-in).

Set ``THROTTLING_REDIS_URL`` with ``DOWNLOADER = "slotkit.Downloader"`` (or
name ``slotkit.shared.SharedDownloader`` directly); see ``docs/shared.rst``.
"""

from slotkit.shared.downloader import SharedDownloader
from slotkit.shared.manager import SharedScopeManager
from slotkit.shared.throttle import SharedThrottle, ThrottleOptions
from slotkit.shared.twin import TwinStore

Downloader = SharedDownloader

__all__ = [
    "Downloader",
    "SharedDownloader",
    "SharedScopeManager",
    "SharedThrottle",
    "ThrottleOptions",
    "TwinStore",
]
