"""Building scope managers: the default one, or a user's class, checked at start.

A user's class (``THROTTLING_SCOPE_MANAGER`` or a ``THROTTLING_SCOPES``
entry's ``"manager"``) is checked when the crawler starts, before any
request: it must have every method slotkit calls, and each of them must
accept the arguments slotkit passes. Without the second part a Scrapy-style
``from_crawler(cls, crawler)`` or a ``can_send(self)`` would pass the start
and then fail with a ``TypeError`` on every request.

The helpers that compare a method's signature with slotkit's call
(:func:`call_mismatch`, :func:`mismatch_message`) serve
:mod:`slotkit.manager_loading` too.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from zope.interface.interface import Method

from slotkit.interfaces import IThrottlingScopeManager
from slotkit.scope import ThrottlingScopeManager
from slotkit.settings import ScopeConfig, SettingsError, ThrottlingSettings

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy.crawler import Crawler
    from zope.interface.interface import InterfaceClass

__all__ = [
    "call_mismatch",
    "check_scope_manager_class",
    "check_scope_managers",
    "ScopeManagerError",
    "create_scope_manager",
    "interface_calls",
    "mismatch_message",
]


def interface_calls(interface: InterfaceClass, *skip: str) -> dict[str, tuple[str, ...]]:
    """Method name -> the positional arguments slotkit passes, as *interface* declares them."""
    calls: dict[str, tuple[str, ...]] = {}
    for name in interface.names():
        member = interface[name]
        if isinstance(member, Method) and name not in skip:
            calls[name] = tuple(member.positional)
    return calls


#: The methods slotkit calls on every scope manager, with the arguments it passes.
SCOPE_MANAGER_CALLS = interface_calls(IThrottlingScopeManager, "from_crawler")

#: The methods slotkit calls on every scope manager.
REQUIRED_METHODS = tuple(SCOPE_MANAGER_CALLS)

#: Outside the interface: slotkit calls these only on managers that define them.
OPTIONAL_SCOPE_MANAGER_CALLS: dict[str, tuple[str, ...]] = {
    "record_started": ("now",),
    "record_ending": ("sent_at", "amount"),
    "export_state": ("now",),
    "import_state": ("state", "now"),
    "set_jitter": ("jitter",),
    "quota_available": ("now",),
    "sample_delay": (),
}

#: The arguments of ``cls.from_crawler(crawler, config)`` (or of ``cls(...)`` without one).
BUILD_ARGS = ("crawler", "config")


# Comparing a signature with slotkit's call


def call_mismatch(
    method: Callable[..., Any], args: Sequence[str], *, takes_self: bool = False
) -> str | None:
    """Why *method* cannot be called with ``len(args)`` positional arguments, else ``None``.

    *takes_self*: *method* is a plain function that will run bound to an
    instance, so it receives one more argument first. A signature Python
    cannot read (some builtins) is given the benefit of the doubt.
    """
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return None
    placeholders = [object()] * (len(args) + int(takes_self))
    try:
        signature.bind(*placeholders)
    except TypeError as exc:
        return str(exc)
    return None


def shown_signature(method: Callable[..., Any]) -> str:
    """The parameters of *method* as its author wrote them (with ``self`` or ``cls``)."""
    function = getattr(method, "__func__", method)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return "(...)"
    return str(signature.replace(return_annotation=inspect.Signature.empty))


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def mismatch_message(
    where: str,
    cls: type,
    name: str,
    method: Callable[..., Any],
    args: Sequence[str],
    problem: str,
) -> str:
    """The error for a method of *cls* that cannot take slotkit's call ``name(*args)``."""
    return (
        f"{where} names {class_path(cls)}, whose {name}{shown_signature(method)} cannot "
        f"take the call slotkit makes, {name}({', '.join(args)}): {problem}"
    )


# Scope manager classes


def check_scope_manager_class(where: str, cls: type | None) -> None:
    """Refuse, at crawler start, a scope manager class slotkit could not drive.

    *where* names the setting in the error. Every interface method must
    exist, and the constructor and every method slotkit would call must
    accept slotkit's arguments.
    """
    if cls is None:
        return
    missing = [name for name in REQUIRED_METHODS if not callable(getattr(cls, name, None))]
    if missing:
        raise SettingsError(
            f"{where} names {class_path(cls)}, which does not provide "
            f"slotkit.interfaces.IThrottlingScopeManager: missing {', '.join(sorted(missing))}"
        )
    _check_construction(where, cls)
    for name, args in {**SCOPE_MANAGER_CALLS, **OPTIONAL_SCOPE_MANAGER_CALLS}.items():
        _check_method(where, cls, name, args)


def check_scope_managers(config: ThrottlingSettings) -> None:
    """Check every scope manager class *config* names (the crawl's and explain's check)."""
    check_scope_manager_class("THROTTLING_SCOPE_MANAGER", config.scope_manager)
    for scope_id, entry in config.scopes.items():
        if "manager" in entry:
            check_scope_manager_class(
                f"THROTTLING_SCOPES[{scope_id!r}]['manager']", entry["manager"]
            )


def _check_construction(where: str, cls: type) -> None:
    """``from_crawler(crawler, config)`` (or ``cls(crawler, config)``) must bind."""
    factory = getattr(cls, "from_crawler", None)
    if factory is not None:
        problem = call_mismatch(factory, BUILD_ARGS)
        if problem is not None:
            raise SettingsError(
                mismatch_message(where, cls, "from_crawler", factory, BUILD_ARGS, problem)
                + " (a scope manager receives its scope's config too, unlike other"
                " Scrapy components)"
            )
        return
    problem = call_mismatch(cls, BUILD_ARGS)
    if problem is not None:
        raise SettingsError(
            f"{where} names {class_path(cls)}, which has no from_crawler and whose "
            f"constructor {cls.__name__}{shown_signature(cls)} cannot take the call slotkit "
            f"makes, {cls.__name__}({', '.join(BUILD_ARGS)}): {problem}"
        )


def _check_method(where: str, cls: type, name: str, args: tuple[str, ...]) -> None:
    target = _instance_call(cls, name)
    if target is None:
        return
    method, takes_self = target
    problem = call_mismatch(method, args, takes_self=takes_self)
    if problem is not None:
        raise SettingsError(mismatch_message(where, cls, name, method, args, problem))


def _instance_call(cls: type, name: str) -> tuple[Callable[..., Any], bool] | None:
    """What ``instance.<name>(...)`` runs on an instance of *cls*, and whether it gets ``self``.

    ``None`` when *cls* has no such attribute, or one whose behaviour cannot
    be told without an instance (a custom descriptor): those are trusted.
    """
    raw = inspect.getattr_static(cls, name, None)
    if isinstance(raw, (classmethod, staticmethod)):
        return getattr(cls, name), False
    if inspect.isfunction(raw):
        return raw, True
    if callable(raw) and not hasattr(type(raw), "__get__"):
        return raw, False  # a callable object stored on the class is called as is
    return None


def create_scope_manager(crawler: Crawler, config: ScopeConfig, scope_id: str = "") -> Any:
    """Instantiate the scope manager for the scope *scope_id* from its resolved *config*.

    Raises :class:`ScopeManagerError` when a custom manager's constructor raises.
    """
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
    given = config.as_dict()
    factory = getattr(cls, "from_crawler", None)
    try:
        if factory is not None:
            return factory(crawler, given)
        return cls(crawler, given)
    except SettingsError:
        raise  # says already which setting is wrong
    except Exception as exc:
        # Each request of the scope fails with this: a bare KeyError named
        # neither the manager, nor the scope, nor the setting to look at.
        raise ScopeManagerError(
            f"the scope manager {cls.__module__}.{cls.__qualname__} (THROTTLING_SCOPE_MANAGER, "
            f"or the 'manager' of a THROTTLING_SCOPES entry) raised {type(exc).__name__}: {exc} "
            f"building scope {scope_id!r} from {given!r}"
        ) from exc


class ScopeManagerError(RuntimeError):
    """A custom scope manager could not be built for a scope; its requests fail with this."""
