"""One download slot's priority queue (part of :mod:`slotkit.pqueue`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

from queuelib.queue import LifoDiskQueue
from scrapy.pqueues import ScrapyPriorityQueue

if TYPE_CHECKING:
    from scrapy import Request


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
