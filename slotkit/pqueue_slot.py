"""One download slot's priority queue, and resuming a job of Scrapy's
``ScrapyPriorityQueue`` (part of :mod:`slotkit.pqueue`)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, cast

from queuelib.queue import LifoDiskQueue
from scrapy.pqueues import ScrapyPriorityQueue

if TYPE_CHECKING:
    from scrapy import Request

    from slotkit.pqueue_readiness import Readiness

logger = logging.getLogger("slotkit")

#: What the key of a slot's delayed sub-queue adds to the slot's (see
#: sub_queue_key).
DELAYED = " (throttling_delay)"


class CannotPeek(TypeError):
    """The scheduler's queue classes have no working ``peek()``: a setup error."""


class _SlotQueue(ScrapyPriorityQueue):
    """One slot's priority queue, whose :meth:`peek` agrees with :meth:`pop`.

    Scrapy 2.19's ``peek`` looks at the start-request queue of the current
    priority first while ``pop`` takes the other queue first; the readiness
    check must look at the request that will really be popped.
    """

    def peek(self) -> Request | None:
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
    runs, its slot's delayed sub-queue.

    The delayed request waits in the scheduler rather than in the downloader,
    where it would hold a ``CONCURRENT_REQUESTS`` place, and its slot's other
    requests go on meanwhile (a delayed head would hold them back). One
    delayed sub-queue per slot, as many files as Scrapy's own per-slot
    queues: delayed requests of one slot leave in queue order (one due later
    can hold back one due sooner behind it, never the reverse).
    """
    slot = readiness.slot_of(request)
    return f"{slot}{DELAYED}" if readiness.delay_left(request) > 0 else slot


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
