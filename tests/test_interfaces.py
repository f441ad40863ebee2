"""Tests for slotkit.interfaces: the two pluggable parts, and every shipped provider of them."""

from __future__ import annotations

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock
from zope.interface import Attribute
from zope.interface.interface import Method
from zope.interface.verify import verifyClass, verifyObject

from slotkit.gate import Gate
from slotkit.interfaces import IThrottlingManager, IThrottlingScopeManager
from slotkit.manager import ThrottlingManager, build_manager
from slotkit.registry import Scope
from slotkit.scope import ThrottlingScopeManager
from slotkit.scope_managers import check_scope_manager_class
from slotkit.settings import SettingsError

WINDOW = 60.0


@pytest.mark.parametrize("interface", [IThrottlingManager, IThrottlingScopeManager])
def test_every_member_is_documented(interface):
    """Each method and attribute of the interfaces has a docstring."""
    for name in interface.names():
        member = interface[name]
        assert isinstance(member, (Method, Attribute))
        assert member.getDoc().strip(), f"{interface.__name__}.{name} has no docstring"


def test_scope_manager_interface_members():
    """IThrottlingScopeManager declares exactly the spec's scope-manager protocol."""
    assert set(IThrottlingScopeManager.names()) == {
        "from_crawler",
        "can_send",
        "record_sent",
        "record_done",
        "record_backoff",
        "reconcile_quota",
        "set_base_delay",
        "set_concurrency",
        "is_idle",
    }


def test_manager_interface_members():
    """IThrottlingManager declares the spec's manager protocol plus the crawler attribute."""
    assert set(IThrottlingManager.names()) == {
        "get_scopes",
        "get_response_backoff",
        "get_exception_backoff",
        "delay_scope",
        "crawler",
    }


def test_default_scope_manager_provides_the_interface():
    """ThrottlingScopeManager instances and the class verify against IThrottlingScopeManager."""
    assert verifyObject(IThrottlingScopeManager, ThrottlingScopeManager(concurrency=2, delay=1.0))
    assert verifyClass(IThrottlingScopeManager, ThrottlingScopeManager)


def test_default_manager_provides_the_interface():
    """ThrottlingManager(crawler) verifies against IThrottlingManager."""
    crawler = get_crawler(Spider)
    assert verifyObject(IThrottlingManager, ThrottlingManager(crawler))
    assert verifyClass(IThrottlingManager, ThrottlingManager)


def test_adapted_duck_manager_provides_the_interface():
    """The adapter build_manager wraps around a one-method class provides the interface."""

    class OneMethod:
        def get_request_scopes(self, request):
            return "x"

    assert verifyObject(IThrottlingManager, build_manager(get_crawler(Spider), OneMethod))


class FixedWindowScopeManager:
    """The spec's fixed-window scope manager example, without the wall-clock fallback."""

    def __init__(self, crawler, config):
        self.limit = config["quota"]
        self.window = config.get("window", WINDOW)
        self.reset_at = None
        self.used = 0.0
        self.active = 0

    @classmethod
    def from_crawler(cls, crawler, config):
        return cls(crawler, config)

    def can_send(self, now=None, amount=None):
        if self.reset_at is not None and now >= self.reset_at:
            self.reset_at, self.used = None, 0.0
        if self.used and self.used + (amount or 0) > self.limit:
            return self.reset_at - now
        return 0.0

    def record_sent(self, now=None, amount=None):
        if self.reset_at is None:
            self.reset_at = now + self.window
        self.used += amount or 0
        self.active += 1

    def record_done(self, now=None):
        self.active = max(0, self.active - 1)

    def record_backoff(self, delay=None, now=None):
        pass

    def reconcile_quota(self, consumed=None, remaining=None, now=None):
        if remaining is not None:
            self.used = max(0.0, self.limit - remaining)
        elif consumed is not None:
            self.used = max(0.0, self.used + consumed)

    def set_base_delay(self, delay):
        pass

    def set_concurrency(self, concurrency):
        pass

    def is_idle(self, now, max_idle):
        return self.active == 0


def test_spec_fixed_window_example_has_the_interface():
    """The spec's example scope manager has every method, so slotkit accepts it at start."""
    manager = FixedWindowScopeManager.from_crawler(None, {"quota": 10.0})
    assert verifyObject(IThrottlingScopeManager, manager, tentative=True)
    check_scope_manager_class("THROTTLING_SCOPE_MANAGER", FixedWindowScopeManager)


def test_spec_fixed_window_example_works_at_the_gate():
    """At the gate, the example lets a window's quota through, then waits for the next window."""
    clock = Clock()
    gate = Gate(clock)
    scope = Scope("cost", FixedWindowScopeManager(None, {"quota": 10.0}))
    fired = []
    for index, amount in enumerate([4.0, 4.0, 4.0]):
        request = Request(f"https://api.example/{index}")
        deferred = gate.acquire(request, [scope], [amount])
        deferred.addCallback(lambda ticket: (fired.append(clock.seconds()), gate.release(ticket)))
    assert fired == [0.0, 0.0]
    clock.advance(WINDOW)
    assert fired == [0.0, 0.0, WINDOW]
    assert clock.getDelayedCalls() == []


def test_incomplete_scope_manager_is_refused():
    """A scope manager class missing methods is refused, naming the setting, class and methods."""

    class Partial:
        def can_send(self, now, amount):
            return 0.0

        def record_sent(self, now, amount):
            pass

    with pytest.raises(SettingsError) as info:
        check_scope_manager_class("THROTTLING_SCOPE_MANAGER", Partial)
    message = str(info.value)
    assert message.startswith("THROTTLING_SCOPE_MANAGER names ")
    assert "Partial" in message
    assert "IThrottlingScopeManager" in message
    for name in ("record_done", "record_backoff", "reconcile_quota", "is_idle"):
        assert name in message
    assert "can_send" not in message.split("missing", 1)[1]


def test_no_scope_manager_class_is_fine():
    """No THROTTLING_SCOPE_MANAGER (None) passes the check."""
    check_scope_manager_class("THROTTLING_SCOPE_MANAGER", None)


def test_interface_docs_promise_inf_means_full():
    """The can_send contract keeps math.inf for 'only a state change frees it'."""
    assert "math.inf" in IThrottlingScopeManager["can_send"].getDoc()


def test_shipped_providers_satisfy_the_spec_protocols():
    """The typing.Protocol names of the spec accept slotkit's defaults and the docs' example."""
    from slotkit import ThrottlingManagerProtocol, ThrottlingScopeManagerProtocol
    from tests.test_recipes import recipe

    crawler = get_crawler(Spider)
    assert isinstance(ThrottlingManager(crawler), ThrottlingManagerProtocol)
    assert isinstance(
        ThrottlingScopeManager.from_crawler(crawler, {"delay": 0.0}),
        ThrottlingScopeManagerProtocol,
    )
    example = recipe("fixed_window").FixedWindowScopeManager
    assert isinstance(example.from_crawler(crawler, {"quota": 3.0}), ThrottlingScopeManagerProtocol)


def test_spec_config_types_are_plain_dicts_slotkit_accepts():
    """ThrottlingScopeConfig / BackoffConfig build the dicts THROTTLING_SCOPES takes."""
    from scrapy.settings import Settings

    from slotkit import BackoffConfig, ThrottlingScopeConfig, ThrottlingSettings

    entry = ThrottlingScopeConfig(delay=0.5, backoff=BackoffConfig(max_delay=30.0, min_delay=2.0))
    assert type(entry) is dict
    config = ThrottlingSettings.from_settings(Settings({"THROTTLING_SCOPES": {"a.example": entry}}))
    assert config.scope_config("a.example", "domain").delay == 0.5
