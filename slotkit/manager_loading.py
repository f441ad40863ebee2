"""Building ``THROTTLING_MANAGER``: subclasses, duck-typed classes, and refusals.

* No class: the default :class:`~slotkit.ThrottlingManager`.
* A subclass of it: built with ``from_crawler(crawler)`` and used as is.
* Any other class must have ``get_scopes(request)`` (or the spec's name for
  it, ``get_request_scopes``). When it also has every other method of
  :class:`~slotkit.interfaces.IThrottlingManager` it is used as is;
  otherwise slotkit completes it: an adapter runs each method the class
  defines and the default manager's for the others. Declaring the interface
  with ``@implementer`` changes nothing here, so a class that claims it but
  defines only part of it is completed the same way.

Whatever the class, before the crawl starts every method slotkit (or a
recipe, for ``delay_scope``) calls is checked to accept the arguments it
passes; a mismatch is a :class:`~slotkit.settings.SettingsError` naming the
class, the method, its signature and the call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from slotkit.interfaces import IThrottlingManager
from slotkit.manager import ThrottlingManager
from slotkit.scope_managers import (
    call_mismatch,
    class_path,
    interface_calls,
    mismatch_message,
    shown_signature,
)
from slotkit.settings import SettingsError

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler

    from slotkit.manager import _ScopeController
    from slotkit.scope_ids import Scopes

__all__ = ["build_manager"]

WHERE = "THROTTLING_MANAGER"

#: The interface's methods, with the arguments they are called with.
MANAGER_CALLS = interface_calls(IThrottlingManager)

#: Called too when defined: the default ``get_response_backoff`` asks
#: ``get_response_delay``, the downloader calls ``attach`` once, and
#: ``get_request_scopes`` stands in for a missing ``get_scopes``.
OPTIONAL_MANAGER_CALLS: dict[str, tuple[str, ...]] = {
    "get_response_delay": ("response",),
    "attach": ("controller",),
    "get_request_scopes": ("request",),
}

#: The methods a user's class may define to replace the default manager's.
#: ``get_scopes`` is not listed: the adapter always takes it from the user.
OVERRIDABLE = tuple(name for name in (*MANAGER_CALLS, "get_response_delay") if name != "get_scopes")


class _DuckManager(ThrottlingManager):
    """The default manager, with every method the user's class defines put in its place.

    The user's methods are bound onto the instance, so the default code that
    calls ``self.<method>`` (``get_response_backoff`` asking
    ``get_response_delay``, say) reaches them too, and the downloader sees
    whether the user's ``get_scopes`` is ``async``. :func:`_adapter_for`
    gives each wrapped class a subclass of its own name, so messages that
    name ``type(manager)`` name the user's class.
    """

    def __init__(self, crawler: Crawler, inner: Any) -> None:
        super().__init__(crawler)
        self.inner = inner
        self.get_scopes = _scopes_method(inner)  # type: ignore[method-assign]
        for name in OVERRIDABLE:
            method = getattr(inner, name, None)
            if callable(method):
                setattr(self, name, method)

    def get_scopes(self, request: Request) -> Scopes:
        # Never reached through an instance (__init__ shadows it); defining it
        # keeps the downloader off its shortcut for the default get_scopes.
        return _scopes_method(self.inner)(request)  # type: ignore[no-any-return]

    def attach(self, controller: _ScopeController) -> None:
        """Connect the defaults to the downloader, and the user's object if it asks to be."""
        super().attach(controller)
        attach = getattr(self.inner, "attach", None)
        if callable(attach):
            attach(controller)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # isinstance(crawler.throttler, TheUsersClass) holds, as it would had
        # slotkit used the user's object as it is (isinstance consults
        # __class__ when type() does not match); type() still names the adapter.
        return type(self.__dict__["inner"])

    def __getattr__(self, name: str) -> Any:
        # Only names the adapter lacks come here: the user's own extras
        # (reached through crawler.throttler, for instance).
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)


def _scopes_method(inner: Any) -> Callable[..., Any]:
    """The user's ``get_scopes``, else its ``get_request_scopes``."""
    method = getattr(inner, "get_scopes", None)
    if not callable(method):
        method = inner.get_request_scopes
    return cast("Callable[..., Any]", method)


def _adapter_for(cls: type) -> type[_DuckManager]:
    """A :class:`_DuckManager` subclass that carries the name of the user's *cls*."""
    namespace = {
        "__qualname__": cls.__qualname__,
        "__module__": __name__,
        "__doc__": f"slotkit's completion of {class_path(cls)} with the default manager.",
    }
    return cast("type[_DuckManager]", type(cls.__name__, (_DuckManager,), namespace))


def build_manager(crawler: Crawler, cls: type | None) -> Any:
    """Instantiate ``THROTTLING_MANAGER``: completing duck-typed classes, refusing others."""
    if cls is None:
        return ThrottlingManager(crawler)
    if isinstance(cls, type) and issubclass(cls, ThrottlingManager):
        manager = _instantiate(cls, crawler)
        check_manager_methods(cls, manager)
        return manager
    _require_scopes(cls)
    instance = _instantiate(cls, crawler)
    check_manager_methods(cls, instance)
    if all(callable(getattr(instance, name, None)) for name in MANAGER_CALLS):
        return instance
    return _adapter_for(cls)(crawler, instance)


def _require_scopes(cls: type) -> None:
    if callable(getattr(cls, "get_scopes", None)) or callable(
        getattr(cls, "get_request_scopes", None)
    ):
        return
    raise SettingsError(
        f"{WHERE} {class_path(cls)} does not provide "
        "slotkit.interfaces.IThrottlingManager: it needs at least a get_scopes(request) "
        "method (subclass slotkit.ThrottlingManager to inherit the rest)"
    )


def _instantiate(cls: type, crawler: Crawler) -> Any:
    """``cls.from_crawler(crawler)`` if defined, else ``cls(crawler)``, else ``cls()``."""
    factory = getattr(cls, "from_crawler", None)
    if factory is not None:
        problem = call_mismatch(factory, ("crawler",))
        if problem is not None:
            raise SettingsError(
                mismatch_message(WHERE, cls, "from_crawler", factory, ("crawler",), problem)
            )
        from scrapy.utils.misc import build_from_crawler

        return build_from_crawler(cls, crawler)
    if call_mismatch(cls, ("crawler",)) is None:
        return cls(crawler)
    if call_mismatch(cls, ()) is None:
        return cls()
    raise SettingsError(
        f"{WHERE} names {class_path(cls)}, whose constructor {cls.__name__}"
        f"{shown_signature(cls)} takes neither (crawler) nor (); add a "
        "from_crawler(cls, crawler) class method to build it"
    )


def check_manager_methods(cls: type, instance: Any) -> None:
    """Refuse *instance* (built from *cls*) if a method slotkit calls cannot take its arguments."""
    for name, args in {**MANAGER_CALLS, **OPTIONAL_MANAGER_CALLS}.items():
        method = getattr(instance, name, None)
        if not callable(method):
            continue
        problem = call_mismatch(method, args)
        if problem is not None:
            raise SettingsError(mismatch_message(WHERE, cls, name, method, args, problem))
