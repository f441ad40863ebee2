"""Which slot of a priority queue to ask next, without looking at every slot
(part of :mod:`slotkit.pqueue`).

A broad crawl queues requests for tens of thousands of sites at once; ranking
every slot on every pop made one pop cost 15 ms with 10,000 slots queued and
67 ms with 30,000. :class:`SlotOrder` keeps the slots in a heap instead:

* a slot that may be ready has one *live* entry in the rank heap, filed under
  the rank it had when it was offered. Offering a slot again supersedes its
  entry (the old one is skipped when it surfaces);
* the queue checks the rank of an entry that surfaces: a rank that grew
  worse meanwhile (its scope got busier) is filed again, so the first entry
  whose rank still holds is the best slot, as far as ranks only worsen
  unannounced. Those that improve are announced (a request of one of the
  slot's scopes left the downloader, a request of higher priority was
  queued) by offering the slot again; slots whose head spends a quota,
  whose share grows as others spend it, are ranked again at every choice;
* a slot remembered as not ready leaves the rank heap: a finite wait goes
  into a heap of due times and comes back once it has passed; an infinite
  one ("full until a download finishes") comes back when the readiness
  generation changes.

Every slot of the queue is at all times either in the rank heap or
remembered as waiting; superseded entries are dropped when the heaps grow to
twice their live size.
"""

from __future__ import annotations

import heapq
import itertools
import math

__all__ = ["Rank", "SlotOrder"]

#: Sort key of a slot; smaller goes first (see ``ThrottlingAwarePriorityQueue.rank``).
Rank = tuple[float, ...]

#: Heaps are rebuilt from their live entries once they hold this many more
#: than twice as many entries as are live.
SLACK = 1024


class SlotOrder:
    """The rank heap, the due-time heap and the remembered waits of one queue's slots."""

    def __init__(self) -> None:
        #: (rank, slot, entry number) of slots that may be ready.
        self._ranked: list[tuple[Rank, str, int]] = []
        #: slot -> the entry number of its live entry in ``_ranked``.
        self._live: dict[str, int] = {}
        self._numbers = itertools.count()
        #: slot -> (not ready before, readiness generation when remembered).
        self.due: dict[str, tuple[float, int]] = {}
        #: (due time, slot) of the finite waits in ``due``.
        self._dues: list[tuple[float, str]] = []
        #: Slots ranked again at every choice (their rank improves unannounced).
        self._recheck: set[str] = set()
        #: Slots remembered as waiting for a download to finish (``inf`` in ``due``).
        self._full: set[str] = set()
        #: The readiness generation ``_full`` was last checked against.
        self._generation = 0

    def clear(self) -> None:
        self._ranked.clear()
        self._live.clear()
        self._recheck.clear()
        self.due.clear()
        self._dues.clear()
        self._full.clear()

    # Slots that may be ready

    def offer(self, slot: str, rank: Rank, *, recheck: bool = False) -> None:
        """File *slot* under *rank*, superseding any entry it had; with *recheck*,
        :meth:`to_recheck` names it until it is filed without."""
        if recheck:
            self._recheck.add(slot)
        else:
            self._recheck.discard(slot)
        number = next(self._numbers)
        self._live[slot] = number
        heapq.heappush(self._ranked, (rank, slot, number))
        if len(self._ranked) > 2 * len(self._live) + SLACK:
            self._ranked = [entry for entry in self._ranked if self._live.get(entry[1]) == entry[2]]
            heapq.heapify(self._ranked)

    def offered(self, slot: str) -> bool:
        """Whether *slot* has a live entry in the rank heap."""
        return slot in self._live

    def to_recheck(self) -> list[str]:
        """The filed slots whose rank may have improved unannounced."""
        return [slot for slot in self._recheck if slot in self._live]

    def take_best(self) -> tuple[Rank, str] | None:
        """Remove and return the best live entry (``None``: no slot may be ready)."""
        while self._ranked:
            rank, slot, number = heapq.heappop(self._ranked)
            if self._live.get(slot) == number:
                del self._live[slot]
                return rank, slot
        return None

    def discard(self, slot: str) -> None:
        """Forget *slot* entirely (its queue is gone, or its wait no longer holds)."""
        self._live.pop(slot, None)
        self._recheck.discard(slot)
        self.forget_wait(slot)

    # Slots remembered as waiting

    def remember_wait(self, slot: str, due: float, generation: int) -> None:
        """*slot* is not ready before *due* (``inf``: until the generation changes)."""
        self.due[slot] = (due, generation)
        if math.isinf(due):
            self._full.add(slot)
        else:
            heapq.heappush(self._dues, (due, slot))
            if len(self._dues) > 2 * len(self.due) + SLACK:
                self._dues = [(d, s) for d, s in self._dues if self.due.get(s, (None,))[0] == d]
                heapq.heapify(self._dues)

    def forget_wait(self, slot: str) -> bool:
        """Drop what is remembered of *slot*'s wait; whether there was something."""
        cached = self.due.pop(slot, None)
        if cached is None:
            return False
        if math.isinf(cached[0]):
            self._full.discard(slot)
        return True

    def waits_finitely(self, slot: str) -> bool:
        cached = self.due.get(slot)
        return cached is not None and not math.isinf(cached[0])

    def due_again(self, now: float, generation: int) -> list[str]:
        """The slots whose remembered wait is over by *now* or by a new *generation*;
        they are forgotten as waiting, for the caller to offer again."""
        released: list[str] = []
        dues = self._dues
        while dues and dues[0][0] <= now:
            due, slot = heapq.heappop(dues)
            cached = self.due.get(slot)
            if cached is not None and cached[0] == due:
                del self.due[slot]
                released.append(slot)
        if self._full and generation != self._generation:
            self._generation = generation
            for slot in [s for s in self._full if self.due[s][1] != generation]:
                del self.due[slot]
                self._full.discard(slot)
                released.append(slot)
        return released

    def soonest(self, now: float) -> tuple[float, str | None]:
        """Seconds until the soonest remembered finite wait ends, and its slot;
        ``(inf, a slot waiting for a download)`` or ``(inf, None)`` without one."""
        dues = self._dues
        while dues:
            due, slot = dues[0]
            cached = self.due.get(slot)
            if cached is not None and cached[0] == due:
                return max(0.0, due - now), slot
            heapq.heappop(dues)
        return math.inf, next(iter(self._full), None)
