"""Sending the downloader's per-request signals only when someone listens.

Scrapy's ``send_catch_log`` walks pydispatch's receiver tables through a
generator, wraps every receiver call and builds a result list, whether or
not a receiver exists. The stock downloader pays that three times per
request; in a default crawl nobody is connected to those three signals, and
the walk costs about as much as the rest of slotkit's per-request work.
Looking the four receiver lists up first (the same lookups
``getAllReceivers`` makes) skips a send that would reach no one; any
receiver, even a dead weak reference, sends the signal as before. So does
a signal manager whose ``send_catch_log`` was replaced (a subclass, or a
test patching it to watch the signals): it may want every send.

The lookups read pydispatch's ``connections`` table with ``dict.get``: its
``getReceivers`` raises and catches a ``KeyError`` for every absent entry,
which made the check cost half a send (3.3 µs against 0.4 µs here).
"""

from __future__ import annotations

from typing import Any

from pydispatch import dispatcher
from pydispatch.dispatcher import Any as AnySender
from scrapy.signalmanager import SignalManager

_STOCK_SEND = SignalManager.send_catch_log
#: pydispatch's table, id(sender) -> signal -> receivers: the one getReceivers reads.
_CONNECTIONS: object = getattr(dispatcher, "connections", None)


def has_receivers(signals: SignalManager, signal: object) -> bool:
    """True if any receiver is connected to *signal* from the crawler (or from anyone)."""
    senders = (signals.sender, AnySender)
    table = _CONNECTIONS
    if not isinstance(table, dict):  # a pydispatch without that table: ask it
        return any(
            dispatcher.getReceivers(sender, wanted)
            for sender in senders
            for wanted in (signal, AnySender)
        )
    for sender in senders:
        by_signal = table.get(id(sender))
        if by_signal and (by_signal.get(signal) or by_signal.get(AnySender)):
            return True
    return False


def send_if_heard(signals: SignalManager, signal: object, **kwargs: Any) -> None:
    """``signals.send_catch_log(signal, **kwargs)`` unless nobody would hear it."""
    send = signals.send_catch_log
    if getattr(send, "__func__", None) is not _STOCK_SEND or has_receivers(signals, signal):
        send(signal, **kwargs)
