"""One download slot's priority queue, the open files of a job's slot
queues, and resuming a job of Scrapy's ``ScrapyPriorityQueue`` (part of
:mod:`slotkit.pqueue`).

In a ``JOBDIR`` every slot's queue keeps a file open per priority, as
Scrapy's ``DownloaderAwarePriorityQueue`` does: a broad crawl with requests
for 30,000 sites queued ran out of file descriptors. :class:`OpenQueues`
keeps a bounded number of them open and closes the least recently used
(:meth:`_SlotQueue.sleep`); a closed one opens again when next pushed to or
popped from.
"""

from __future__ import annotations

import errno
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any, cast

from queuelib.queue import FifoDiskQueue, LifoDiskQueue
from scrapy.pqueues import ScrapyPriorityQueue

if TYPE_CHECKING:
    from scrapy import Request

    from slotkit.pqueue_readiness import Readiness

logger = logging.getLogger("slotkit")

#: What the key of a slot's delayed sub-queue adds to the slot's (see
#: sub_queue_key).
DELAYED = " (throttling_delay)"
#: What the key of a slot's sub-queue of HTTP cache hits adds to the slot's.
CACHED = " (http cache)"


class CannotPeek(TypeError):
    """The scheduler's queue classes have no working ``peek()``: a setup error."""


class OpenQueues:
    """The slot queues of one job directory whose files are open, least
    recently used first; they hold at most *limit* files open, the most
    recently used one alone excepted."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = open_queue_limit() if limit is None else limit
        #: Open slot queue -> how many files it holds open.
        self._open: OrderedDict[_SlotQueue, int] = OrderedDict()
        self._count = 0

    def used(self, queue: _SlotQueue) -> None:
        """*queue* was opened or used: it goes last; the first ones close if too many are open."""
        files = queue.open_files()
        self._count += files - self._open.pop(queue, 0)
        self._open[queue] = files
        while self._count > self.limit and len(self._open) > 1:
            oldest = next(iter(self._open))
            if oldest is queue:  # pragma: no cover - queue was just moved last
                break
            self._count -= self._open.pop(oldest)
            oldest.sleep()

    def closed(self, queue: _SlotQueue) -> None:
        self._count -= self._open.pop(queue, 0)

    def close_all_but(self, queue: _SlotQueue) -> None:
        """Close every open slot queue but *queue* (the process is out of descriptors)."""
        for other in [q for q in self._open if q is not queue]:
            self._count -= self._open.pop(other)
            other.sleep()

    def __len__(self) -> int:
        """Files open."""
        return self._count


def open_queue_limit() -> int:
    """Files a job's slot queues may keep open: a quarter of the process's file
    descriptors (sockets and the rest need the others)."""
    try:
        import resource
    except ImportError:  # pragma: no cover
        return 128
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:  # pragma: no cover
        return 4096
    return max(16, soft // 4)


class _SlotQueue(ScrapyPriorityQueue):
    """One slot's priority queue, whose :meth:`peek` agrees with :meth:`pop`,
    and whose files may be closed while it is not used (see :class:`OpenQueues`).

    Scrapy 2.19's ``peek`` looks at the start-request queue of the current
    priority first while ``pop`` takes the other queue first; the readiness
    check must look at the request that will really be popped.
    """

    def __init__(self, *args: Any, open_queues: OpenQueues | None = None, **kwargs: Any) -> None:
        #: The job's open queues (``None``: in memory, never closed early).
        self._open_queues = open_queues
        #: While asleep: the priorities left on disk and the request count.
        self._asleep: tuple[list[int], int] | None = None
        super().__init__(*args, **kwargs)
        if open_queues is not None:
            open_queues.used(self)

    def open_files(self) -> int:
        """Files its downstream queues hold open (a FIFO disk queue has two: head and tail)."""
        return sum(
            2 if isinstance(queue, FifoDiskQueue) else 1
            for queues in (self.queues, self._start_queues)
            for queue in queues.values()
        )

    def sleep(self) -> None:
        """Close this queue's files, keeping what :meth:`_wake` needs to reopen them."""
        if self._asleep is None:
            size = len(self)
            self._asleep = (super().close(), size)
            self.queues, self._start_queues, self.curprio = {}, {}, None

    def _wake(self) -> None:
        if self._asleep is not None:
            prios = self._asleep[0]
            self._making_room(lambda: self._reopen(prios))
            self._asleep = None
        self._used()

    def _making_room(self, opening: Callable[[], None]) -> None:
        """Run *opening*; out of file descriptors (sockets take them too), close
        the other sub-queues and run it once more."""
        try:
            opening()
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or self._open_queues is None:
                raise
            self._open_queues.close_all_but(self)
            opening()

    def _reopen(self, prios: list[int]) -> None:
        """Open the downstream queues of *prios* again, or none of them."""
        try:
            self.init_prios(prios)
        except BaseException:
            # Stay asleep: what is on disk is still all there is to know.
            self._drop_queues(lambda queue: True)
            self.curprio = None
            raise

    def _drop_queues(self, which: Callable[[Any], bool]) -> None:
        """Close and forget the downstream queues *which* selects."""
        for queues in (self.queues, self._start_queues):
            for prio in [p for p, queue in queues.items() if which(queue)]:
                with suppress(OSError):
                    queues.pop(prio).close()

    def push(self, request: Request) -> None:
        self._wake()
        try:
            # A new priority opens a file.
            self._making_room(lambda: super(_SlotQueue, self).push(request))
        except BaseException:
            # A refused request (not serializable) leaves no empty downstream
            # queue behind: peek() would stop at it, at a stale current priority.
            self._drop_queues(lambda queue: not queue)
            raise
        finally:
            self._used()

    def pop(self) -> Request | None:
        self._wake()
        try:
            return super().pop()
        finally:
            self._used()

    def _used(self) -> None:
        if self._open_queues is not None:
            self._open_queues.used(self)  # a priority's queue may have opened or closed

    def close(self) -> list[int]:
        if self._asleep is not None:
            return self._asleep[0]
        if self._open_queues is not None:
            self._open_queues.closed(self)
        return super().close()

    def __len__(self) -> int:
        return self._asleep[1] if self._asleep is not None else super().__len__()

    def peek(self) -> Request | None:
        self._wake()
        prio = self.curprio
        if prio is None:
            return None
        if prio not in self.queues and prio not in self._start_queues:
            # pop() would first move on to the best non-empty priority.
            live = [p for qs in (self.queues, self._start_queues) for p, q in qs.items() if q]
            if not live:
                return None
            prio = min(live)
        queue = self.queues.get(prio) or self._start_queues[prio]
        try:
            request = cast("Request | None", queue.peek())  # type: ignore[attr-defined]
        except (AttributeError, NotImplementedError) as exc:
            queue_cls = type(queue)
            raise CannotPeek(
                "ThrottlingAwarePriorityQueue needs queues that can peek; "
                f"{queue_cls.__module__}.{queue_cls.__qualname__} cannot. "
                "Use one of Scrapy's SCHEDULER_DISK_QUEUE / SCHEDULER_MEMORY_QUEUE "
                "classes (queuelib >= 1.6.2) or add a peek() method."
            ) from exc
        if isinstance(queue, LifoDiskQueue):
            # queuelib's peek leaves the file 4 bytes short of its end, where
            # the next push would write, over the last record's length: the
            # job's queue would be corrupt (OSError on a later pop).
            queue.f.seek(0, os.SEEK_END)
        return request


def sub_queue_key(readiness: Readiness, request: Request) -> str:
    """The sub-queue of *request*: its slot's, or while its ``throttling_delay``
    runs, its slot's delayed sub-queue, or if the HTTP cache will answer it, its
    slot's cached sub-queue, which is always ready (see :mod:`slotkit.cache_hits`).

    The delayed request waits in the scheduler rather than in the downloader,
    where it would hold a ``CONCURRENT_REQUESTS`` place, and its slot's other
    requests go on meanwhile (a delayed head would hold them back). One
    delayed sub-queue per slot, as many files as Scrapy's own per-slot
    queues: delayed requests of one slot leave in queue order (one due later
    can hold back one due sooner behind it, never the reverse).
    """
    slot = readiness.slot_of(request)
    if readiness.cache_answers(request):
        # First: the cache answers before the downloader would start the delay.
        return f"{slot}{CACHED}"
    return f"{slot}{DELAYED}" if readiness.delay_left(request) > 0 else slot


def leading_scope(slot: str, scopes: Mapping[str, float | None] | None) -> str:
    """The scope *slot* is led by: itself, or for the sub-queue of a set of
    scopes (``"api & users"``, see ``Downloader.queue_key``), the first scope
    of its head (*scopes*), which the key names first."""
    if scopes and len(scopes) > 1 and slot not in scopes:
        return next(iter(scopes))
    return slot


def resume_legacy_job(queue: Any, startprios: list[int]) -> None:
    """Move the requests of a job saved by ``ScrapyPriorityQueue`` into *queue*'s
    per-slot queues (a ``ThrottlingAwarePriorityQueue``)."""
    if not all(isinstance(p, int) for p in startprios):
        raise ValueError(
            f"{type(queue).__name__} cannot resume this job directory: its queue state "
            f"{startprios!r} was written by an unknown priority queue. Resume it with the "
            "SCHEDULER_PRIORITY_QUEUE it was started with, or start a new JOBDIR."
        )
    legacy = ScrapyPriorityQueue(
        queue.crawler,
        queue.downstream_queue_cls,
        queue.key,
        startprios,
        start_queue_cls=queue._start_queue_cls,
    )
    moved = 0
    while (request := legacy.pop()) is not None:
        queue.push(request)
        moved += 1
    legacy.close()
    logger.info("slotkit: moved %d queued requests into per-slot queues", moved)
