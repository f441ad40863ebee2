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
  queued) by offering the slot again;
* the one rank that improves unannounced is a quota share: it grows as
  other slots spend the quota. Slots whose heads have equal quota terms
  (:data:`~slotkit.pqueue_quota.Terms`) always have equal shares, so they
  form a *group* with a heap of its own, ordered without the share, and
  one entry in the rank heap for its best slot, filed again whenever the
  group's share changes (:meth:`SlotOrder.refresh`). A quota shared by every
  site of a broad crawl is one group: one entry to refresh per choice, not
  one per site;
* a slot remembered as not ready leaves the rank heap: a finite wait goes
  into a heap of due times and comes back once it has passed; an infinite
  one ("full until a download finishes") comes back when the readiness
  generation changes.

Every slot of the queue is at all times either filed (in the rank heap or in
its group's heap) or remembered as waiting; superseded entries are dropped
when a heap grows to twice its live size.
"""

from __future__ import annotations

import heapq
import itertools
import math

from slotkit.pqueue_quota import Terms

__all__ = ["Rank", "SlotOrder"]

#: Sort key of a slot; smaller goes first (see ``ThrottlingAwarePriorityQueue.rank``).
Rank = tuple[float, ...]

#: Where a rank holds the (negated) quota share; equal within a group.
SHARE = 2

#: Heaps are rebuilt from their live entries once they hold this many more
#: than twice as many entries as are live.
SLACK = 1024

#: An entry of a heap: (rank, slot, entry number).
_Entry = tuple[Rank, str, int]


class _Group:
    """Slots whose heads have equal quota terms (see the module docstring)."""

    def __init__(self, share: float) -> None:
        #: Entries ranked with their share component set to 0.
        self.heap: list[_Entry] = []
        #: Slots whose live entry is in :attr:`heap`.
        self.members: set[str] = set()
        #: The share component (a rank's ``SHARE`` item) of every member now.
        self.share = share
        #: Entry number of the group's entry in the rank heap (``None``: none).
        self.entry: int | None = None


class SlotOrder:
    """The rank heap, the due-time heap and the remembered waits of one queue's slots."""

    def __init__(self) -> None:
        #: Live and superseded entries of slots that may be ready, and of groups.
        self._ranked: list[_Entry] = []
        #: slot -> the entry number of its live entry (in ``_ranked`` or its group's heap).
        self._live: dict[str, int] = {}
        self._numbers = itertools.count()
        #: Quota terms -> the group of slots whose heads have them.
        self._groups: dict[Terms, _Group] = {}
        #: slot -> its group's terms, for grouped slots.
        self._group_of: dict[str, Terms] = {}
        #: Entry number of a group's live entry in ``_ranked`` -> the group's terms.
        self._group_entries: dict[int, Terms] = {}
        #: slot -> (not ready before, readiness generation when remembered).
        self.due: dict[str, tuple[float, int]] = {}
        #: (due time, slot) of the finite waits in ``due``.
        self._dues: list[tuple[float, str]] = []
        #: Slots remembered as waiting for a download to finish (``inf`` in ``due``).
        self._full: set[str] = set()
        #: The readiness generation ``_full`` was last checked against.
        self._generation = 0

    def clear(self) -> None:
        self._ranked.clear()
        self._live.clear()
        self._groups.clear()
        self._group_of.clear()
        self._group_entries.clear()
        self.due.clear()
        self._dues.clear()
        self._full.clear()

    # Slots that may be ready

    def offer(self, slot: str, rank: Rank, group: Terms | None = None) -> None:
        """File *slot* under *rank*, superseding any entry it had.

        *group*: its head's quota terms, if it has any (its rank's share then
        changes with every slot of that group's, see :meth:`refresh`).
        """
        number = next(self._numbers)
        self._live[slot] = number
        self._leave_group(slot, unless=group)
        if group is None:
            self._push(self._ranked, (rank, slot, number), len(self._live))
            return
        found = self._groups.get(group)
        if found is None:
            found = self._groups[group] = _Group(rank[SHARE])
        self._group_of[slot] = group
        found.members.add(slot)
        self._push(found.heap, (_without_share(rank), slot, number), len(found.members))
        if found.share != rank[SHARE]:
            found.share = rank[SHARE]  # the freshest reading holds for every member
            self._file_group(group, found)
        elif found.heap[0][2] == number:
            self._file_group(group, found)  # a new best member

    def groups(self) -> list[Terms]:
        """The quota terms of the groups with filed slots (see :meth:`refresh`)."""
        return list(self._groups)

    def refresh(self, group: Terms, share: float) -> None:
        """Every member of *group* now has the share component *share*."""
        found = self._groups.get(group)
        if found is not None and found.share != share:
            found.share = share
            self._file_group(group, found)

    def offered(self, slot: str) -> bool:
        """Whether *slot* is filed (in the rank heap or its group's)."""
        return slot in self._live

    def take_best(self) -> tuple[Rank, str, Terms | None] | None:
        """Remove and return the best filed slot's rank, the slot and its group
        (``None``: no slot may be ready)."""
        while self._ranked:
            rank, slot, number = heapq.heappop(self._ranked)
            group = self._group_entries.pop(number, None)
            if group is not None:
                best = self._take_from_group(group, rank, slot)
                if best is not None:
                    return best
            elif self._live.get(slot) == number:
                del self._live[slot]
                return rank, slot, None
        return None

    def discard(self, slot: str) -> None:
        """Forget *slot* entirely (its queue is gone, or its wait no longer holds)."""
        self._live.pop(slot, None)
        self._leave_group(slot)
        self.forget_wait(slot)

    def _take_from_group(
        self, group: Terms, filed: Rank, named: str
    ) -> tuple[Rank, str, Terms] | None:
        """The best member of *group*, whose entry was filed under *filed* and named
        after member *named*, if that still holds.

        Otherwise the group is filed again under what its best member's rank
        and name have become (worse: a member left, or got busier; among equal
        ranks the name decides), or dropped if empty.
        """
        found = self._groups[group]
        found.entry = None
        top = self._live_top(found.heap)
        if top is None:
            del self._groups[group]
            return None
        rank = _with_share(top[0], found.share)
        if (rank, top[1]) > (filed, named):
            self._file_group(group, found)
            return None
        slot = heapq.heappop(found.heap)[1]
        del self._live[slot]
        self._leave_group(slot)
        if group in self._groups:
            self._file_group(group, found)
        return rank, slot, group

    def _file_group(self, group: Terms, found: _Group) -> None:
        """File *group*'s entry under its best member's rank, superseding the old one."""
        if found.entry is not None:
            self._group_entries.pop(found.entry, None)
            found.entry = None
        top = self._live_top(found.heap)
        if top is None:
            return
        rank, slot, _ = top
        number = next(self._numbers)
        found.entry = number
        self._group_entries[number] = group
        # Named after its best member: ties go by slot name, as for single slots.
        self._push(
            self._ranked,
            (_with_share(rank, found.share), slot, number),
            len(self._live),
        )

    def _live_top(self, heap: list[_Entry]) -> _Entry | None:
        """The best live entry of a group's *heap*, superseded ones above it dropped."""
        while heap and self._live.get(heap[0][1]) != heap[0][2]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _leave_group(self, slot: str, unless: Terms | None = None) -> None:
        """Take *slot* out of its group's members (not if that is *unless*)."""
        group = self._group_of.get(slot)
        if group is None or group == unless:
            return
        del self._group_of[slot]
        found = self._groups[group]
        found.members.discard(slot)
        if not found.members:
            del self._groups[group]
            if found.entry is not None:
                self._group_entries.pop(found.entry, None)

    def _push(self, heap: list[_Entry], entry: _Entry, live: int) -> None:
        """Push *entry*; rebuild *heap* from its live entries when mostly superseded."""
        heapq.heappush(heap, entry)
        if len(heap) > 2 * live + SLACK:
            kept = [e for e in heap if self._live.get(e[1]) == e[2] or e[2] in self._group_entries]
            heap[:] = kept
            heapq.heapify(heap)

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


def _without_share(rank: Rank) -> Rank:
    return (*rank[:SHARE], 0.0, *rank[SHARE + 1 :])


def _with_share(rank: Rank, share: float) -> Rank:
    return (*rank[:SHARE], share, *rank[SHARE + 1 :])
