"""slotkit.signaling: a per-request signal is skipped only when nobody could hear it."""

from __future__ import annotations

from typing import Any

import pytest
from pydispatch import dispatcher
from scrapy import signals
from scrapy.signalmanager import SignalManager

from slotkit.signaling import has_receivers, send_if_heard

SIGNAL = signals.response_downloaded


class Sender:
    """A crawler stand-in: pydispatch keys receivers by the sender's identity."""


@pytest.fixture(params=["table", "getReceivers"])
def manager(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> SignalManager:
    """A crawler's signal manager; checked through pydispatch's table and its public call."""
    if request.param == "getReceivers":
        monkeypatch.setattr("slotkit.signaling._CONNECTIONS", None)
    return SignalManager(Sender())


def test_nobody_connected_sends_nothing(manager: SignalManager) -> None:
    assert not has_receivers(manager, SIGNAL)
    send_if_heard(manager, SIGNAL, request=None)  # nothing to call, nothing raised


@pytest.mark.parametrize(
    ("sender_of", "signal"),
    [
        pytest.param(lambda m: m.sender, SIGNAL, id="this sender, this signal"),
        pytest.param(lambda m: dispatcher.Any, SIGNAL, id="any sender, this signal"),
        pytest.param(lambda m: m.sender, dispatcher.Any, id="this sender, any signal"),
        pytest.param(lambda m: dispatcher.Any, dispatcher.Any, id="any sender, any signal"),
    ],
)
def test_every_way_of_listening_is_heard(
    manager: SignalManager, sender_of: Any, signal: Any
) -> None:
    heard: list[Any] = []

    def receiver(**kwargs: Any) -> None:
        heard.append(kwargs.get("request"))

    dispatcher.connect(receiver, signal=signal, sender=sender_of(manager), weak=False)
    try:
        assert has_receivers(manager, SIGNAL)
        send_if_heard(manager, SIGNAL, request="r1")
    finally:
        dispatcher.disconnect(receiver, signal=signal, sender=sender_of(manager), weak=False)
    assert heard == ["r1"]
    assert not has_receivers(manager, SIGNAL)


def test_a_receiver_of_another_sender_is_not_heard(manager: SignalManager) -> None:
    other = SignalManager(Sender())
    other.connect(lambda **kwargs: None, signal=SIGNAL, weak=False)
    try:
        assert not has_receivers(manager, SIGNAL)
        assert has_receivers(other, SIGNAL)
    finally:
        other.disconnect_all(SIGNAL)
