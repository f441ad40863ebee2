"""slotkit: throttling scopes for Scrapy's downloader.

Switch it on with ``DOWNLOADER = "slotkit.Downloader"``.
"""

from __future__ import annotations

from slotkit.addon import Addon
from slotkit.downloader import Downloader
from slotkit.gate import GateClosedError
from slotkit.manager import (
    ScopeBackoff,
    ThrottlingManager,
    add_scope,
    scope_cache,
    update_scope_backoff,
)
from slotkit.protocols import (
    BackoffConfig,
    ThrottlingManagerProtocol,
    ThrottlingScopeConfig,
    ThrottlingScopeManagerProtocol,
)
from slotkit.scheduler import ThrottlingAwarePriorityQueue, ThrottlingAwareScheduler
from slotkit.scope import ThrottlingScopeManager
from slotkit.settings import ScopeConfig, SettingsError, ThrottlingSettings

__version__ = "0.1.0"

__all__ = [
    "Addon",
    "BackoffConfig",
    "Downloader",
    "GateClosedError",
    "ScopeBackoff",
    "ScopeConfig",
    "SettingsError",
    "ThrottlingAwarePriorityQueue",
    "ThrottlingAwareScheduler",
    "ThrottlingManager",
    "ThrottlingManagerProtocol",
    "ThrottlingScopeConfig",
    "ThrottlingScopeManager",
    "ThrottlingScopeManagerProtocol",
    "ThrottlingSettings",
    "add_scope",
    "scope_cache",
    "update_scope_backoff",
]
