"""The per-slot sub-queues of a :class:`~slotkit.pqueue.ThrottlingAwarePriorityQueue`,
in memory or in a job directory (part of :mod:`slotkit.pqueue`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy.pqueues import _path_safe

from slotkit.pqueue_slot import OpenQueues, _SlotQueue

if TYPE_CHECKING:
    from scrapy import Request

__all__ = ["SlotQueues"]


class SlotQueues(dict[str, _SlotQueue]):
    """slot key -> that slot's priority queue, never empty.

    *factory* makes a slot's queue (the priority queue's ``pqfactory``);
    *directory* is the job directory's queue folder (``""``: in memory).
    """

    def __init__(self, factory: Callable[[str, Iterable[int]], _SlotQueue], directory: str) -> None:
        super().__init__()
        self._factory = factory
        self.directory = directory
        #: With a job directory: the slot queues whose files are open.
        self.open_queues = OpenQueues() if directory else None

    def resume(self, state: Mapping[str, Iterable[int]]) -> list[str]:
        """Open the slot queues a closed job left (``close_all()``'s answer); the slots
        with requests left."""
        for slot, startprios in state.items():
            queue = self._factory(slot, startprios)
            if queue:
                self[slot] = queue
            else:  # nothing left on disk for it: never keep an empty slot queue
                queue.close()
        return list(self)

    def push(self, slot: str, request: Request) -> None:
        """Queue *request* in *slot*'s queue, made if need be.

        Raises ``ValueError`` when the request cannot be stored (not
        serializable, or the job directory failed), after which Scrapy's
        scheduler keeps it in memory; no empty slot queue is left behind.
        """
        queue = self.get(slot)
        try:
            if queue is None:
                queue = self[slot] = self._factory(slot, ())
            queue.push(request)
        except Exception as exc:
            if queue is not None and not queue:
                self._drop(slot, queue)
            if isinstance(exc, OSError):
                # A full disk, no file descriptor left: Scrapy's scheduler lets
                # an OSError end the engine's loop, and the crawl never finishes.
                raise ValueError(
                    f"the job directory could not take it ({exc}); it is kept in memory"
                ) from exc
            raise

    def pop_head(self, slot: str) -> tuple[Request | None, bool]:
        """Pop the head of *slot*; also whether that emptied (and dropped) its queue."""
        queue = self[slot]
        request = queue.pop()
        if queue:
            return request, False
        self._drop(slot, queue)
        return request, True

    def _drop(self, slot: str, queue: _SlotQueue) -> None:
        """Forget *slot*, whose *queue* is empty."""
        del self[slot]
        queue.close()
        if self.directory:
            # The slot's directory goes once its queues removed their files.
            with suppress(OSError):
                Path(self.directory, _path_safe(slot)).rmdir()

    def close_all(self) -> dict[str, list[int]]:
        """Close every slot queue; the state to resume them from."""
        state = {slot: queue.close() for slot, queue in self.items()}
        self.clear()
        return state

    def requests(self) -> int:
        """Requests queued in all slots."""
        return sum(len(queue) for queue in self.values())
