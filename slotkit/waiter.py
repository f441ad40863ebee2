"""A request at the gate, and the ticket it becomes (part of :mod:`slotkit.gate`).

:class:`Waiter` is both: the gate parks it on scopes while it waits, and hands
it back as the ticket the downloader releases after the transfer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy import Request
    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import IDelayedCall

    from slotkit.registry import Scope

__all__ = ["Waiter", "WaiterKey"]

#: Sort key of a waiter: ``(-priority, arrival minus quota head start, sequence)``;
#: smaller goes first.
WaiterKey = tuple[int, float, int]


class Waiter:
    """A request at the gate; once dispatched it is also the ticket to release."""

    __slots__ = (
        "request",
        "scopes",
        "amounts",
        "key",
        "deferred",
        "parked_on",
        "cancelled",
        "dispatched",
        "delay_call",
        "enqueued_at",
        "sent_at",
        "left_at",
        "released",
    )

    def __init__(
        self,
        request: Request,
        scopes: Sequence[Scope],
        amounts: Sequence[float | None],
        key: WaiterKey,
    ) -> None:
        self.request = request
        self.scopes = scopes
        self.amounts = amounts
        self.key = key
        self.deferred: Deferred[Waiter] | None = None
        self.parked_on: Scope | None = None
        self.cancelled = False
        self.dispatched = False
        self.delay_call: IDelayedCall | None = None
        self.enqueued_at = 0.0
        #: When the request was dispatched (valid once ``dispatched``).
        self.sent_at = 0.0
        #: When it left for the network: ``sent_at``, or later when another
        #: layer made it wait after the gate (the shared store's reservation).
        self.left_at = 0.0
        self.released = False

    def __lt__(self, other: Waiter) -> bool:  # heap ties never reach here; keys are unique
        return self.key < other.key
