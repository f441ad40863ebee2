"""The shared throttle: one script call per request, local fallback when the store is down.

How one request passes (after the local gate admitted it):

1. :meth:`SharedThrottle.reserve` runs ``acquire`` for all of its scopes in
   one call. The store answers with a relative wait and, if it could, a
   *reservation*: the request's place in every scope's schedule and a
   concurrency lease, taken atomically.
2. The request waits that long on the crawl's clock, then goes. A ``hold``
   or a backoff ``step`` published meanwhile for one of its scopes (another
   worker saw a 429) cancels the reservation: the lease is given back and
   step 1 is redone.
   A ``full`` answer queues this worker for the scope in the store and
   waits for a ``free`` message naming it (or ``full_poll``); a ``wait``
   answer (quota, or beyond the horizon) waits and asks again.
3. :meth:`SharedThrottle.release` gives the leases back once the download
   ended. A release does not make a call of its own if it can help it: it
   rides on the next call this worker makes within ``release_linger``, and
   only goes alone after that (at once when its scope had no free slot).
   So a busy crawl costs about one call per request.

Store down: a failed call sends its request through the local fallback gate
(the :attr:`SharedScopeManager.fallback` managers at 1/N of the shared
limits), so nothing is lost and nothing goes unthrottled. After
``failures`` failures in a row, or any failure when the last success is
older than ``fallback_after``, every request takes the fallback until a
heartbeat succeeds again; then the holds this worker knows are written
back, the leases it could not give back are released, and the shared path
resumes.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import CancelledError, DeferredLock
from twisted.python.failure import Failure

from slotkit.gate import GateClosedError
from slotkit.handover import take
from slotkit.registry import Scope
from slotkit.shared.link import FALLBACK, SHARED, StoreLink
from slotkit.shared.manager import SharedScopeManager
from slotkit.shared.options import Pass, ThrottleOptions
from slotkit.shared.twin import fmt

if TYPE_CHECKING:
    from scrapy import Request

logger = logging.getLogger("slotkit")

#: What a request's caller giving up raises into it, on either kind of reactor.
_CANCELLED = (asyncio.CancelledError, CancelledError)

__all__ = ["FALLBACK", "SHARED", "Pass", "SharedThrottle", "ThrottleOptions"]


class AcquireReplyError(ValueError):
    """The store answered an acquire, but not as slotkit's script does."""


def parse_acquire(reply: object) -> tuple[str, float, list[float], list[int]]:
    """An acquire's reply: its status, wait, holds and slots left per scope.

    The script answers ``[status, count, wait, hold, left, hold, left, ...]``;
    anything else (another script behind the same SHA, a proxy's answer) is
    an :class:`AcquireReplyError` naming what came.
    """
    try:
        items = list(reply)  # type: ignore[call-overload]
        status, wait = str(items[0]), float(items[2])
        holds = [float(hold) for hold in items[3::2]]
        slots_left = [int(left) for left in items[4::2]]
    except (TypeError, ValueError, IndexError, OverflowError):
        pass
    else:
        if status in ("ok", "wait", "full") and math.isfinite(wait) and wait >= 0:
            return status, wait, holds, slots_left
    raise AcquireReplyError(
        f"the shared store answered an acquire with {reply!r:.200}, which is not what "
        "slotkit's script returns"
    )


class SharedThrottle(StoreLink):
    """Drives the store for one crawler: reservations, releases, backoff, fallback."""

    #: Whether an odd acquire reply was logged (once per crawler).
    _warned_bad_reply = False

    # The path of one request

    async def reserve(
        self, request: Request, scopes: Sequence[Scope], amounts: Sequence[float | None]
    ) -> Pass:
        """Wait until the shared store (or, when it is down, the fallback) admits *request*."""
        managers = [scope.manager for scope in scopes]
        shared = [m for m in managers if isinstance(m, SharedScopeManager)]
        ids = [m.scope_id or "" for m in shared]
        amounts_of = [a for m, a in zip(managers, amounts, strict=True) if m in shared]
        ticket = Pass(ids, shared, amounts_of)
        if not shared:
            return ticket
        try:
            if self._stopping:
                raise GateClosedError("the downloader closed")
            if self.mode == FALLBACK and await self._reserve_locally(request, ticket):
                return ticket
            locks = [self._turns.setdefault(s, DeferredLock()) for s in sorted(set(ids))]
            taken: list[DeferredLock] = []
            try:
                for lock in locks:  # always in the same order: no deadlock between requests
                    # (released at once if a cancel beats this coroutine to it)
                    taken.append(await take(lock.acquire(), DeferredLock.release))
                return await self._reserve(request, ticket)
            finally:
                for lock in reversed(taken):
                    lock.release()
        except GateClosedError:
            if not self._stopping:
                raise
            # One message for every way a wait at the store is cut off, naming
            # why, as the local gate's does (the fallback's gate says its own).
            raise GateClosedError(
                f"{self._stop_reason} while {request} waited for its throttling "
                f"scopes {sorted(set(ids))} at the shared store; it was not sent"
            ) from None

    async def _reserve(self, request: Request, ticket: Pass) -> Pass:
        keys = self._keys(ticket.scope_ids)
        while True:
            if self._stopping:
                raise GateClosedError("the downloader closed")
            if self.mode == FALLBACK:
                if await self._reserve_locally(request, ticket):
                    return ticket
                continue  # the store came back while the request waited
            lease = f"{self.worker_id}:{next(self._leases)}"
            o = self.options
            args = [lease, fmt(o.lease_ttl), fmt(o.horizon), fmt(o.key_ttl), str(len(keys) // 2)]
            intervals = []
            for manager, amount in zip(ticket.managers, ticket.amounts, strict=True):
                scope_args, interval = manager.script_args(amount)
                args += scope_args
                intervals.append(interval)
            self.acquires += 1
            seen = self.event_count
            try:
                status, wait, holds, slots_left = parse_acquire(
                    await self._ask(keys, args, ticket.scope_ids)
                )
            except _CANCELLED:
                # Its caller gave up: the script may have run, and taken a lease.
                self._give_back(ticket, lease, now=True)
                raise
            except AcquireReplyError as exc:
                # The store answered, but not as slotkit's script does: its
                # lease (if any) goes back, and the worker falls back as if
                # the call had failed (staying shared, the next good reply
                # would send the waiters straight back to ask again).
                self._give_back(ticket, lease, now=True)
                self._note_bad_reply(exc)
                if self.mode == SHARED:
                    self.switch.enter_fallback(self.clock.seconds(), Failure(exc))
                if await self._reserve_locally(request, ticket):
                    return ticket
                continue
            except Exception:
                # The script may still have run (a frozen store that thawed):
                # give that lease back once the store answers again.
                self._give_back(ticket, lease, now=False)
                if self._stopping:
                    raise GateClosedError("the downloader closed") from None
                if await self._reserve_locally(request, ticket):
                    return ticket
                continue
            if self._stopping:
                # The spider closed while the reply was on its way: a
                # reservation now would send the request after the close.
                self._give_back(ticket, lease, now=True)
                raise GateClosedError("the downloader closed")
            now = self.clock.seconds()
            for manager, hold in zip(ticket.managers, holds, strict=False):
                if hold > 0:
                    manager.note_hold(now + hold)
            if status == "ok":
                if wait > 0:
                    ticket.waited = True
                    due = now + wait + o.hold_guard
                    # A hold, or a backoff step, published meanwhile: the
                    # reserved time no longer holds.
                    sleep = self.sleeps.sleep(due - now, ticket.scope_ids, ("hold", "step"))
                    try:
                        outcome = await maybe_deferred_to_future(sleep.deferred)
                    except BaseException:
                        # Cancelled, or the crawl closing: the lease it holds
                        # would keep a slot from every worker until it expired.
                        self._give_back(ticket, lease, now=True)
                        raise
                    lateness = self.clock.seconds() - due
                    allowed = max(o.late_min, o.late_fraction * min(intervals, default=0.0))
                    if lateness > o.late_min:
                        self.late += 1
                    at = self.clock.seconds()
                    held = any(
                        max(m.hold_until, m.fallback.hold_until) > at for m in ticket.managers
                    )
                    if outcome != "timer" or held or (lateness > allowed and self.mode == SHARED):
                        # A hold arrived (or the store went down) while waiting,
                        # or the timer fired far too late: give the reservation
                        # back and ask again.
                        self.reasks += 1
                        self._give_back(ticket, lease, now=True)
                        continue
                ticket.lease = lease
                ticket.urgent = any(left <= 0 for left in slots_left)
                self._dispatched(ticket)
                return ticket
            self.reasks += 1
            if status == "full" and any(self.freed.get(i, -1) > seen for i in ticket.scope_ids):
                continue  # a slot was freed while the reply was on its way: ask again now
            ticket.waited = True
            kinds = ("free", "hold") if status == "full" else ("hold",)
            wait = min(wait, o.full_poll) if status == "full" else wait
            sleep = self.sleeps.sleep(wait, ticket.scope_ids, kinds)
            await maybe_deferred_to_future(sleep.deferred)

    def _note_bad_reply(self, error: AcquireReplyError) -> None:
        """Say once that the store answers oddly (another script behind the SHA, a proxy)."""
        if not self._warned_bad_reply:
            self._warned_bad_reply = True
            logger.warning("slotkit: %s; such requests are throttled locally", error)

    async def _ask(self, keys: list[str], args: list[str], scope_ids: Sequence[str]) -> list[str]:
        """One ``acquire`` call, counted in :attr:`asking` while it is on its way."""
        self.asking.update(scope_ids)
        try:
            return await maybe_deferred_to_future(self._call(keys, "acquire", args))
        finally:
            self.asking.subtract(scope_ids)
            for scope_id in scope_ids:
                if self.asking[scope_id] <= 0:
                    del self.asking[scope_id]

    async def _reserve_locally(self, request: Request, ticket: Pass) -> bool:
        """Admit *ticket* through the fallback gate; False if the store came back first."""
        if not await self.local.admit(request, ticket):
            return False  # asks the store (or meets _stopping) in the caller's loop
        self.fallback_requests += 1
        for manager, amount in zip(ticket.managers, ticket.amounts, strict=True):
            if manager.quota is not None:
                manager.untold_units += 1.0 if amount is None else amount
        ticket.sent_at = self.clock.seconds()
        if self.switch.store_back:
            self.switch.adopt(ticket.sent_at, [ticket], ticket.managers)
        return True

    def _dispatched(self, ticket: Pass) -> None:
        now = self.clock.seconds()
        ticket.sent_at = now
        for manager, amount in zip(ticket.managers, ticket.amounts, strict=True):
            manager.fallback.record_sent(now, amount)

    def release(self, ticket: Pass) -> None:
        """Give back what *ticket* holds (exactly once)."""
        if self.local.release(ticket):
            if ticket.lease is not None:  # the store took it on at the re-sync
                lease, ticket.lease = ticket.lease, None
                self._give_back(ticket, lease, now=True)
            return
        if ticket.lease is None:
            return
        lease, ticket.lease = ticket.lease, None
        now = self.clock.seconds()
        for manager in ticket.managers:
            manager.fallback.record_done(now)
            self.local.poke(manager.scope_id or "")
        self._give_back(ticket, lease, now=ticket.urgent)

    # Feedback

    def backoff(self, manager: SharedScopeManager, delay: float | None, now: float) -> None:
        """Share a hold (*delay* seconds) or a backoff step (``None``) of *manager*'s scope."""
        if manager.scope_id is None or self.mode != SHARED:
            return  # the fallback manager already has it; written back on resync
        from slotkit.shared.downloader import current_pass

        ticket = current_pass.get()
        age = now - ticket.sent_at if ticket is not None else 0.0
        hold = -1.0 if delay is None else max(0.0, delay)
        if hold > 0:
            # This worker's own reservations for the scope stop now, not when
            # the store's "hold" message comes back a round trip later.
            self.sleeps.event("hold", manager.scope_id)
        self._send_backoff([manager.scope_id], [manager], hold, age)

    def reconcile_quota(
        self, manager: SharedScopeManager, consumed: float | None, remaining: float | None
    ) -> None:
        """Share the server's quota figures for *manager*'s scope."""
        if manager.scope_id is None or manager.quota is None or self.mode != SHARED:
            return
        args = [
            fmt(self.options.key_ttl),
            "1",
            fmt(consumed or 0.0),
            fmt(-1.0 if remaining is None else remaining),
            fmt(manager.quota),
            fmt(manager.window),
        ]
        self._call(self._keys([manager.scope_id]), "quota", args).addErrback(lambda _: None)
