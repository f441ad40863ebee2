"""The spec's typing names: protocols for static checkers, and the settings' dict shapes.

slotkit's pluggable parts are defined by the zope interfaces in
:mod:`slotkit.interfaces` (``verifyObject`` checks them at run time). The
throttling design names the same contracts as :class:`typing.Protocol`
classes, and names the dicts that ``THROTTLING_SCOPES`` accepts; they are
here so code written against those names type-checks and imports as is::

    from slotkit import BackoffConfig, ThrottlingScopeConfig

    THROTTLING_SCOPES: dict[str, ThrottlingScopeConfig] = {
        "example.com": {"delay": 1.0, "backoff": BackoffConfig(max_delay=60.0)},
    }

Both dict types are plain :class:`dict` at run time; slotkit validates their
contents when the crawler starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = [
    "BackoffConfig",
    "ThrottlingManagerProtocol",
    "ThrottlingScopeConfig",
    "ThrottlingScopeManagerProtocol",
]


class BackoffConfig(TypedDict, total=False):
    """Per-scope backoff overrides: the ``"backoff"`` key of a ``THROTTLING_SCOPES`` entry.

    Every key left out falls back to the global setting of the same name.
    """

    http_codes: Sequence[int]
    """Response statuses that trigger backoff (``BACKOFF_HTTP_CODES``)."""
    exceptions: Sequence[type[BaseException] | str]
    """Download exceptions, or their import paths, that trigger backoff (``BACKOFF_EXCEPTIONS``)."""
    delay_factor: float
    """Delay multiplier per trigger, divisor per quiet window (``BACKOFF_DELAY_FACTOR``)."""
    max_delay: float
    """Ceiling of the backoff delay and of server wait hints (``BACKOFF_MAX_DELAY``)."""
    min_delay: float
    """First backoff delay when the scope had none (``BACKOFF_MIN_DELAY``)."""
    jitter: float | Sequence[float]
    """Random spread of backoff delays, ±x or ``[low, high]`` (``BACKOFF_JITTER``)."""


class ThrottlingScopeConfig(TypedDict, total=False):
    """One ``THROTTLING_SCOPES`` entry: how a scope is throttled."""

    concurrency: int
    """Most requests of the scope in flight at once."""
    min_concurrency: int
    """Floor that backoff and rampup never go below (default 1)."""
    delay: float
    """Minimum seconds between two dispatches to the scope (default ``DOWNLOAD_DELAY``)."""
    jitter: float | Sequence[float]
    """Random spread of the delay: ±x, or ``[low, high]`` for ``delay * (1 + uniform(low, high))``.

    Overrides ``RANDOMIZE_DOWNLOAD_DELAY`` / ``DOWNLOAD_DELAY_JITTER`` for the scope.
    """
    quota: float
    """Most quota the scope may spend per window."""
    window: float
    """Length of the quota window in seconds (default ``THROTTLING_WINDOW``)."""
    rampup: bool | dict[str, Any]
    """Probe for the fastest rate the scope tolerates (``True`` or ``RAMPUP_*`` overrides)."""
    backoff: BackoffConfig
    """Per-scope backoff overrides."""
    manager: str | type
    """A custom scope manager class, or its import path, for this scope."""
    ignore_robots_txt: bool
    """Silence the warning when this entry is faster than the site's robots.txt Crawl-delay."""


@runtime_checkable
class ThrottlingScopeManagerProtocol(Protocol):
    """What a scope manager provides; see :class:`slotkit.interfaces.IThrottlingScopeManager`.

    Times are the crawl clock's seconds, passed in; a scope manager never
    reads a clock itself.
    """

    @classmethod
    def from_crawler(cls, crawler: Crawler, config: Any) -> ThrottlingScopeManagerProtocol:
        """Build the manager of one scope from the crawler and the scope's config."""
        ...

    def can_send(self, now: float, amount: float | None) -> float:
        """Seconds until a request spending *amount* may go (0 or less: now)."""
        ...

    def record_sent(self, now: float, amount: float | None) -> None:
        """A request of the scope was dispatched."""
        ...

    def record_done(self, now: float) -> None:
        """A dispatched request of the scope finished, whatever its outcome."""
        ...

    def record_backoff(self, delay: float | None, now: float) -> None:
        """Slow down: one backoff step (*delay* ``None``) or a hard hold of *delay* seconds."""
        ...

    def reconcile_quota(self, consumed: float | None, remaining: float | None, now: float) -> None:
        """Correct the quota count with what a response said was spent or is left."""
        ...

    def set_base_delay(self, delay: float) -> None:
        """Change the configured delay at run time."""
        ...

    def set_concurrency(self, concurrency: int) -> None:
        """Change the configured concurrency at run time."""
        ...

    def is_idle(self, now: float, max_idle: float) -> bool:
        """Whether the scope holds no state worth keeping and may be evicted."""
        ...


@runtime_checkable
class ThrottlingManagerProtocol(Protocol):
    """What ``THROTTLING_MANAGER`` provides; see :class:`slotkit.interfaces.IThrottlingManager`."""

    def get_scopes(self, request: Request) -> Any:
        """The scopes of *request*: an id, an iterable of ids, or a dict id -> quota amount."""
        ...

    def get_response_backoff(self, response: Response) -> Any:
        """What *response* says about its request's scopes (scope id -> ``ScopeBackoff``)."""
        ...

    def get_exception_backoff(self, request: Request, exception: BaseException) -> Any:
        """What a download failure says about the request's scopes."""
        ...

    def delay_scope(self, scope: str, seconds: float) -> None:
        """Hold every request of *scope* for at least *seconds* from now."""
        ...
