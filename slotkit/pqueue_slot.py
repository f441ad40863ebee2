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

logger = logging.getLogger("slotkit")


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
        request = cast("Request | None", queue.peek())  # type: ignore[attr-defined]
        if isinstance(queue, LifoDiskQueue):
            # queuelib's peek leaves the file 4 bytes short of its end, where
            # the next push would write, over the last record's length: the
            # job's queue would be corrupt (OSError on a later pop).
            queue.f.seek(0, os.SEEK_END)
        return request


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
