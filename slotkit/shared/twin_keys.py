"""The key space of the twin store (``slotkit.shared.twin``), with Redis's semantics.

The few Redis structures ``script.lua`` touches, kept in dicts: hashes (a
scope's state among them: :data:`FIELDS`, numbers written by :func:`fmt`),
sorted sets, key expiry (lazy, on the store's clock, as Redis checks a key
when it is touched), a publish channel delivering after each operation, and
the queue of workers waiting for a full scope (the ``wq`` field of a scope's
state hash, ids joined by spaces), with the script's helpers for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from twisted.internet.interfaces import IReactorTime

__all__ = ["CLAIM", "FIELDS", "ScopeState", "TwinKeys", "as_number", "fmt", "ms", "ms_after"]

#: Seconds a worker named for a freed slot holds it against others' asks.
CLAIM = 0.5
#: The numeric fields of a scope's state hash (``load``/``save`` in the script).
FIELDS = ("tat", "hold", "bo", "rec", "ss", "cd", "qw", "qu", "rd", "rc", "rwe", "rt", "rs")


def fmt(value: float) -> str:
    """Numbers as the script writes them: fixed point, six decimals."""
    return f"{value:.6f}"


def ms(moment: float) -> str:
    """*moment* in whole milliseconds, down: what sorted-set ranges stop at.

    Sorted sets score in integer milliseconds (see the script: Redis compares
    integer scores of a small set without parsing them)."""
    return str(math.floor(moment * 1000))


def ms_after(moment: float) -> str:
    """The end of a worker's or a lease's life in whole milliseconds, never before *moment*."""
    return str(math.ceil(moment * 1000))


def as_number(raw: str | None, default: float = 0.0) -> float:
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        return default


class ScopeState:
    """A scope's state hash as numbers (what the script's ``load`` returns).

    ``was`` keeps the numbers as loaded: a save writes only the fields that
    changed, as the script does.
    """

    __slots__ = (*FIELDS, "was")

    was: dict[str, float]

    tat: float
    hold: float
    bo: float
    rec: float
    ss: float
    cd: float
    qw: float
    qu: float
    rd: float
    rc: float
    rwe: float
    rt: float
    rs: float


class TwinKeys:
    """The key space of the twin store: hashes, sorted sets, expiries, a channel."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        #: The store's clock (what ``TIME`` reads).
        self.clock = clock
        self.hashes: dict[str, dict[str, str]] = {}
        self.zsets: dict[str, dict[str, float]] = {}
        #: Key -> the clock time it expires at.
        self.expiry: dict[str, float] = {}
        self.subscribers: list[Callable[[str, str], object]] = []
        self._outbox: list[tuple[str, str]] = []

    # The few Redis primitives, with lazy expiry

    def _live(self, key: str) -> None:
        expires = self.expiry.get(key)
        if expires is not None and self._clock.seconds() >= expires:
            self.hashes.pop(key, None)
            self.zsets.pop(key, None)
            del self.expiry[key]

    def _zset(self, key: str) -> dict[str, float]:
        self._live(key)
        return self.zsets.setdefault(key, {})

    def _pexpire(self, key: str, seconds: float) -> None:
        millis = max(1, math.ceil(seconds * 1000))
        if key in self.hashes or self.zsets.get(key):
            self.expiry[key] = self._clock.seconds() + millis / 1000

    def _zremrange(self, key: str, upto: str) -> None:
        limit = float(upto)
        zset = self._zset(key)
        for member in [m for m, score in zset.items() if score <= limit]:
            del zset[member]
        if not zset:
            self.zsets.pop(key, None)

    def _zadd(self, key: str, score: str, member: str) -> None:
        self._zset(key)[member] = float(score)

    # The queue of workers waiting for a full scope (the 'wq' field of its state)

    def _write_list(self, skey: str, field: str, words: list[str]) -> None:
        """A list in a field of *skey*, words joined by spaces; none: the field goes."""
        if words:
            self.hashes.setdefault(skey, {})[field] = " ".join(words)
            return
        fields = self.hashes.get(skey, {})
        fields.pop(field, None)
        if not fields:  # like Redis, a hash left without fields is gone
            self.hashes.pop(skey, None)
            self.expiry.pop(skey, None)

    def _enqueue(self, skey: str, member: str, ttl: float) -> None:
        self._live(skey)
        queue = self.hashes.get(skey, {}).get("wq")
        if queue is None:
            self.hashes.setdefault(skey, {})["wq"] = member
            if skey not in self.expiry:
                self._pexpire(skey, ttl)
        elif member not in queue.split():
            self._write_list(skey, "wq", [*queue.split(), member])

    def _leave_queue(self, skey: str, member: str) -> None:
        self._live(skey)
        queue = self.hashes.get(skey, {}).get("wq")
        if queue is not None:
            self._write_list(skey, "wq", [other for other in queue.split() if other != member])

    def _alive(self, workers: str, member: str, now: float) -> bool:
        """Whether *member*'s end is ahead (ended workers stay until a heartbeat)."""
        end = self._zset(workers).get(member)
        return end is not None and end > math.floor(now * 1000)

    def _first_waiter(self, skey: str, workers: str, skip: str | None, now: float) -> str | None:
        self._live(skey)
        queue = self.hashes.get(skey, {}).get("wq")
        if queue is None:
            return None
        who, rest = None, []
        for other in queue.split():
            if who is not None or other == skip:
                rest.append(other)
            elif self._alive(workers, other, now):
                who = other
        self._write_list(skey, "wq", rest)
        return who

    # Claims of workers named for a freed slot (the 'nm' field: id and end)

    def _read_claims(
        self, skey: str, workers: str, now: float
    ) -> tuple[list[tuple[str, str]], bool]:
        self._live(skey)
        raw = self.hashes.get(skey, {}).get("nm")
        claims: list[tuple[str, str]] = []
        lapsed = False
        if raw is not None:
            words = raw.split()
            for who, end in zip(words[::2], words[1::2], strict=True):
                if float(end) > now and self._alive(workers, who, now):
                    claims.append((who, end))
                else:
                    lapsed = True
        return claims, lapsed

    def _write_claims(self, skey: str, claims: list[tuple[str, str]]) -> None:
        self._write_list(skey, "nm", [word for claim in claims for word in claim])

    def _drop_claims(
        self,
        skey: str,
        member: str,
        workers: str,
        now: float,
        read: tuple[list[tuple[str, str]], bool] | None = None,
    ) -> None:
        """*member* asked: its claims (and lapsed ones) go; *read*: _read_claims's answer."""
        claims, changed = read if read is not None else self._read_claims(skey, workers, now)
        kept = [(who, end) for who, end in claims if who != member]
        if changed or len(kept) != len(claims):
            self._write_claims(skey, kept)

    def _name(self, skey: str, member: str, workers: str, now: float, message: str) -> None:
        """Wake *member* for a free slot (*message* names the scope) and claim it for it."""
        claims, _ = self._read_claims(skey, workers, now)
        self._write_claims(skey, [*claims, (member, fmt(now + CLAIM))])
        if skey not in self.expiry:  # the hash made anew (see the script)
            self._pexpire(skey, CLAIM + 1)
        self.publish(self.channel_of(workers), f"{message}\t{member}")

    @staticmethod
    def channel_of(workers: str) -> str:
        return workers[:-1] + "ev"

    def ttl(self, key: str) -> float | None:
        """Seconds until *key* expires; ``None`` if it does not exist or never expires."""
        self._live(key)
        expires = self.expiry.get(key)
        if expires is None or (key not in self.hashes and not self.zsets.get(key)):
            return None
        return expires - self._clock.seconds()

    def publish(self, channel: str, message: str) -> None:
        # Like Redis, deliver after the script has run (never from inside it).
        self._outbox.append((channel, message))

    def _deliver(self) -> None:
        while self._outbox:
            channel, message = self._outbox.pop(0)
            for subscriber in list(self.subscribers):
                subscriber(channel, message)
