"""Building ``THROTTLING_MANAGER``: subclasses, duck-typed classes, and refusals."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotkit.interfaces import IThrottlingManager
from slotkit.manager import ThrottlingManager

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from slotkit.scope_ids import Scopes

__all__ = ["build_manager"]


class _DuckManager(ThrottlingManager):
    """Adapts a user class that only defines ``get_scopes`` or ``get_request_scopes``."""

    def __init__(self, crawler: Crawler, inner: Any) -> None:
        super().__init__(crawler)
        self.inner = inner
        self._method = getattr(inner, "get_scopes", None) or inner.get_request_scopes

    def get_scopes(self, request: Request) -> Scopes:
        return self._method(request)  # type: ignore[no-any-return]


def build_manager(crawler: Crawler, cls: type | None) -> Any:
    """Instantiate ``THROTTLING_MANAGER``, adapting duck-typed classes, refusing others."""
    from scrapy.utils.misc import build_from_crawler

    from slotkit.settings import SettingsError

    if cls is None:
        return ThrottlingManager(crawler)
    if isinstance(cls, type) and issubclass(cls, ThrottlingManager):
        return build_from_crawler(cls, crawler)
    has_scopes = callable(getattr(cls, "get_scopes", None)) or callable(
        getattr(cls, "get_request_scopes", None)
    )
    if not has_scopes:
        raise SettingsError(
            f"THROTTLING_MANAGER {cls.__module__}.{cls.__qualname__} does not provide "
            "slotkit.interfaces.IThrottlingManager: it needs at least a get_scopes(request) "
            "method (subclass slotkit.ThrottlingManager to inherit the rest)"
        )
    instance = (
        build_from_crawler(cls, crawler)
        if hasattr(cls, "from_crawler")
        else _instantiate(cls, crawler)
    )
    if IThrottlingManager.providedBy(instance) or all(
        callable(getattr(instance, name, None))
        for name in ("get_scopes", "get_response_backoff", "get_exception_backoff", "delay_scope")
    ):
        return instance
    return _DuckManager(crawler, instance)


def _instantiate(cls: type, crawler: Crawler) -> Any:
    try:
        return cls(crawler)
    except TypeError:
        return cls()
