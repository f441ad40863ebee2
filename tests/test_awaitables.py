"""Default manager results work with sync and async overrides alike."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy import Request
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from slotkit import ThrottlingManager, add_scope, update_scope_backoff
from slotkit.awaitables import AwaitableStr, NotReadyError, awaitable, run_without_suspending


def run(value: Any) -> Any:
    """Drive a coroutine that never suspends (these awaitables never do) to its result."""

    async def wait() -> Any:
        return await value

    coroutine = wait()
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the awaitable suspended")


def test_awaiting_returns_the_value_itself() -> None:
    """await on a wrapped value gives back an equal plain value."""
    assert run(awaitable("example.com")) == "example.com"
    assert run(awaitable(None)) == []
    assert run(awaitable({"a": 1.0})) == {"a": 1.0}


class AsyncManager(ThrottlingManager):
    async def get_scopes(self, request: Request) -> Any:
        scopes = await super().get_scopes(request)
        return add_scope(scopes, "api")

    async def get_response_backoff(self, response: Response) -> Any:
        backoff = await super().get_response_backoff(response)
        return update_scope_backoff(backoff, "api", consumed=1.0)


class SyncManager(ThrottlingManager):
    def get_scopes(self, request: Request) -> Any:
        return add_scope(super().get_scopes(request), "api")


def test_async_override_awaits_super() -> None:
    """The spec's style: `await super().get_scopes(request)` works."""
    manager = AsyncManager(get_crawler())
    assert run(manager.get_scopes(Request("https://example.com/"))) == ["example.com", "api"]


def test_async_override_awaits_super_backoff() -> None:
    """`await super().get_response_backoff(response)` works without a downloader."""
    manager = AsyncManager(get_crawler())
    response = Response("https://example.com/", request=Request("https://example.com/"))
    assert set(run(manager.get_response_backoff(response))) == {"api"}


def test_sync_override_uses_super_directly() -> None:
    """Plain calls to super() return plain, usable values."""
    manager = SyncManager(get_crawler())
    assert manager.get_scopes(Request("https://example.com/")) == ["example.com", "api"]


def test_run_without_suspending_gives_the_result_of_a_coroutine_that_waits_for_nothing() -> None:
    async def scopes() -> object:
        return await AwaitableStr("example.com")

    assert run_without_suspending(scopes()) == "example.com"


def test_run_without_suspending_refuses_and_closes_a_coroutine_that_waits() -> None:
    finished: list[bool] = []

    class Pending:
        def __await__(self) -> Any:
            yield self  # what a pending Future or Deferred does

    async def scopes() -> str:
        try:
            await Pending()
        finally:
            finished.append(True)  # closed: its finally blocks ran
        return "never"

    with pytest.raises(NotReadyError):
        run_without_suspending(scopes())
    assert finished == [True]
