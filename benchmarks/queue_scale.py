"""Cost of one push and one pop of a scheduler priority queue with many slots queued.

A broad crawl (or a ``JOBDIR`` resumed) can hold requests for tens of
thousands of sites at once. This times, in one process and on a
``twisted.internet.task.Clock`` (no crawl, no network):

* ``slotkit``: :class:`slotkit.ThrottlingAwarePriorityQueue` on slotkit's
  downloader, every slot ready;
* ``stock-aware``: Scrapy's ``DownloaderAwarePriorityQueue`` on Scrapy's
  downloader, the queue slotkit's replaces;
* ``stock-default``: Scrapy's ``ScrapyPriorityQueue`` (``SCHEDULER_PRIORITY_QUEUE``'s
  default), which knows no slots at all.

Run from the repository root::

    python -m benchmarks.queue_scale                         # 1,000 / 10,000 / 30,000 slots
    python -m benchmarks.queue_scale --slots 100,5000 --per-slot 4
    python -m benchmarks.queue_scale --quota     # every request also spends a shared quota

With ``--quota``, every request counts in its site's scope and in one
``budget`` scope with a quota (a paid proxy's monthly allowance, say), so
every slot's head has a quota share; Scrapy's queues ignore the scopes.

Figures are microseconds per operation (medians of ``--reps`` runs) and the
ratio of each to ``stock-aware`` (below 1: cheaper).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from scrapy import Request
from scrapy.core.downloader import Downloader as StockDownloader
from scrapy.pqueues import DownloaderAwarePriorityQueue, ScrapyPriorityQueue
from scrapy.squeues import LifoMemoryQueue
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock

from slotkit.downloader import Downloader
from slotkit.pqueue import ThrottlingAwarePriorityQueue

#: No handler is ever used: nothing is downloaded.
NO_HANDLERS = {"DOWNLOAD_HANDLERS": {"http": None, "https": None}}


#: With --quota: one scope every request spends, with a quota that never runs out here.
BUDGET = {"THROTTLING_SCOPES": {"budget": {"quota": 1e9, "concurrency": 10**6}}}


def slotkit_queue(extra: dict[str, Any] | None = None) -> Any:
    settings = {**NO_HANDLERS, "DOWNLOADER": "slotkit.Downloader", **(extra or {})}
    crawler = get_crawler(settings_dict=settings)
    downloader = Downloader(crawler, clock=Clock())
    crawler.engine = SimpleNamespace(  # type: ignore[assignment]
        downloader=downloader,
        _slot=SimpleNamespace(nextcall=SimpleNamespace(schedule=lambda delay=0: None)),
    )
    return ThrottlingAwarePriorityQueue(crawler, LifoMemoryQueue, "", downloader=downloader)


def stock_aware_queue() -> Any:
    crawler = get_crawler(settings_dict=NO_HANDLERS)
    crawler.engine = SimpleNamespace(downloader=StockDownloader(crawler))  # type: ignore[assignment]
    return DownloaderAwarePriorityQueue(crawler, LifoMemoryQueue, "")


def stock_default_queue() -> Any:
    crawler = get_crawler(settings_dict=NO_HANDLERS)
    return ScrapyPriorityQueue(crawler, LifoMemoryQueue, "")


QUEUES: dict[str, Callable[[], Any]] = {
    "slotkit": slotkit_queue,
    "stock-aware": stock_aware_queue,
    "stock-default": stock_default_queue,
}


def measure(
    make: Callable[[], Any], slots: int, per_slot: int, pops: int, *, quota: bool = False
) -> tuple[float, float]:
    """Microseconds per push (of slots * per_slot requests) and per pop (of *pops*)."""
    queue = make()

    def meta(site: int) -> dict[str, Any]:
        return {"throttling_scopes": [f"s{site}.test", "budget"]} if quota else {}

    requests = [
        Request(f"http://s{s}.test/{i}", meta=meta(s))
        for i in range(per_slot)
        for s in range(slots)
    ]
    start = time.perf_counter()
    for request in requests:
        queue.push(request)
    pushed = time.perf_counter() - start
    count = min(pops, len(requests))
    start = time.perf_counter()
    for _ in range(count):
        if queue.pop() is None:
            raise RuntimeError("the queue ran dry")
    popped = time.perf_counter() - start
    return pushed / len(requests) * 1e6, popped / count * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", default="1000,10000,30000", help="comma-separated slot counts")
    parser.add_argument("--per-slot", type=int, default=2, help="requests queued per slot")
    parser.add_argument("--pops", type=int, default=2000, help="pops timed per run")
    parser.add_argument("--reps", type=int, default=3, help="runs per queue and size")
    parser.add_argument(
        "--quota", action="store_true", help="every request also spends one shared quota"
    )
    args = parser.parse_args(argv)
    queues = dict(QUEUES)
    if args.quota:
        queues["slotkit"] = lambda: slotkit_queue(BUDGET)
    header = ("slots", "queue", "us/push", "us/pop", "push ratio", "pop ratio")
    print("{:>7} {:<14} {:>9} {:>9} {:>11} {:>10}".format(*header))
    for slots in (int(part) for part in args.slots.split(",")):
        figures: dict[str, tuple[float, float]] = {}
        for name, make in queues.items():
            runs = [
                measure(make, slots, args.per_slot, args.pops, quota=args.quota)
                for _ in range(args.reps)
            ]
            figures[name] = (
                statistics.median(run[0] for run in runs),
                statistics.median(run[1] for run in runs),
            )
        base_push, base_pop = figures["stock-aware"]
        for name, (push, pop) in figures.items():
            print(
                f"{slots:>7} {name:<14} {push:>9.1f} {pop:>9.1f} "
                f"{push / base_push:>11.3f} {pop / base_pop:>10.3f}"
            )


if __name__ == "__main__":
    main()
