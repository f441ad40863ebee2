"""Head-of-line blocking: a heavily throttled host next to a free one.

``python -m benchmarks.hol_blocking`` crawls, through the real Scrapy engine,
100 requests to ``slow1.bench.test`` (one request per 60 s) queued *before*
100 pages of ``fast.bench.test`` (no limit), with ``CONCURRENT_REQUESTS = 2``;
then the same with four such slow hosts (``--slow-hosts``). Responses come
from :class:`slotkit.testing.InMemoryDownloadHandler` after ``--latency``
seconds (no sockets). For each setup it reports how many fast pages were
done after ``--window`` seconds, when the last one was done, and how many
requests were waiting inside the downloader at that point (each holds a
``CONCURRENT_REQUESTS`` place).

Setups:

``slotkit scheduler``
    ``DOWNLOADER = slotkit.Downloader``, ``SCHEDULER = slotkit.ThrottlingAwareScheduler``.
``stock scheduler (DAPQ)``
    slotkit's downloader, Scrapy's scheduler and its default
    ``DownloaderAwarePriorityQueue``.
``stock scheduler (SPQ)``
    the same with ``ScrapyPriorityQueue``.
``stock Scrapy``
    Scrapy's downloader and scheduler, the delay from ``DOWNLOAD_SLOTS``.

Each setup runs in its own process (a reactor starts once per process);
the child prints one JSON line and exits at once, because a graceful close
would wait for the requests the stock setups hold in the downloader.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

RESULT_PREFIX = "HOL-RESULT "
FAST_HOST = "fast.bench.test"
SLOW_DELAY = 60.0
IN_MEMORY = "slotkit.testing.InMemoryDownloadHandler"


def slow_hosts(count: int) -> list[str]:
    return [f"slow{n}.bench.test" for n in range(1, count + 1)]


def setup_settings(setup: str, slow: list[str]) -> dict[str, Any]:
    """The settings of *setup*, with every host in *slow* limited to one request per 60 s."""
    delays = {host: {"delay": SLOW_DELAY} for host in slow}
    setups: dict[str, dict[str, Any]] = {
        "slotkit scheduler": {
            "DOWNLOADER": "slotkit.Downloader",
            "SCHEDULER": "slotkit.scheduler.ThrottlingAwareScheduler",
            "SCHEDULER_PRIORITY_QUEUE": "slotkit.pqueue.ThrottlingAwarePriorityQueue",
            "THROTTLING_SCOPES": delays,
        },
        "stock scheduler (DAPQ)": {
            "DOWNLOADER": "slotkit.Downloader",
            "THROTTLING_SCOPES": delays,
        },
        "stock scheduler (SPQ)": {
            "DOWNLOADER": "slotkit.Downloader",
            "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue",
            "THROTTLING_SCOPES": delays,
        },
        "stock Scrapy": {"DOWNLOAD_SLOTS": delays},
    }
    return setups[setup]


SETUPS = ("slotkit scheduler", "stock scheduler (DAPQ)", "stock scheduler (SPQ)", "stock Scrapy")


def child(setup: str, requests: int, latency: float, window: float, n_slow: int) -> None:
    """Run one setup in this process and print its result line."""
    from scrapy import Request, Spider, signals
    from scrapy.crawler import CrawlerProcess
    from scrapy.http import Response

    class HolSpider(Spider):
        name = "hol"

        async def start(self) -> AsyncIterator[Any]:
            for host in slow:
                for n in range(requests):
                    yield Request(f"http://{host}/{n}", dont_filter=True)
            for n in range(requests):
                yield Request(f"http://{FAST_HOST}/{n}", dont_filter=True)

        def parse(self, response: Response, **kwargs: Any) -> None:
            pass

    slow = slow_hosts(n_slow)
    settings = {
        "DOWNLOAD_HANDLERS": {"http": IN_MEMORY, "https": IN_MEMORY},
        "INMEMORY_LATENCY": latency,
        "CONCURRENT_REQUESTS": 2,
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        "DOWNLOAD_DELAY_JITTER": 0,
        "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False,
        **setup_settings(setup, slow),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(HolSpider)
    state: dict[str, Any] = {"fast": 0, "slow": 0, "started": None, "fast_done_at": None}

    def now() -> float:
        from twisted.internet import reactor

        return float(reactor.seconds())

    def engine_started() -> None:
        from twisted.internet import reactor

        state["started"] = now()
        reactor.callLater(window, report)

    def response_received(response: Response, request: Request, spider: Spider) -> None:
        host = "fast" if FAST_HOST in request.url else "slow"
        state[host] += 1
        if host == "fast" and state["fast"] == requests and state["fast_done_at"] is None:
            state["fast_done_at"] = now() - state["started"]

    def report() -> None:
        stats = crawler.stats.get_stats() if crawler.stats else {}
        downloader = crawler.engine.downloader
        gate = getattr(downloader, "gate", None)
        if gate is not None:
            waiting = len(gate.waiting)
        else:
            waiting = sum(len(slot.queue) for slot in downloader.slots.values())
        result = {
            "setup": setup,
            "fast_in_window": state["fast"],
            "slow_in_window": state["slow"],
            "all_fast_done_after": state["fast_done_at"],
            "waiting_in_downloader": waiting,
            "held_back": stats.get("throttling/scheduler/held_back", 0),
            "wakeups": stats.get("throttling/scheduler/wakeups", 0),
        }
        sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
        sys.stdout.flush()
        os._exit(0)  # a graceful close would wait for requests held in the downloader

    crawler.signals.connect(engine_started, signals.engine_started)
    crawler.signals.connect(response_received, signals.response_received)
    process.crawl(crawler)
    process.start()


def run(setup: str, args: argparse.Namespace, n_slow: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.hol_blocking",
        "--child",
        setup,
        "--requests",
        str(args.requests),
        "--latency",
        str(args.latency),
        "--window",
        str(args.window),
        "--slow-hosts",
        str(n_slow),
    ]
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=args.window + 60, check=False
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])  # type: ignore[no-any-return]
    raise RuntimeError(f"{setup}: no result (exit {proc.returncode})\n{proc.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="requests per host")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per response")
    parser.add_argument("--window", type=float, default=8.0, help="seconds to watch")
    parser.add_argument(
        "--slow-hosts", default="1,4", help="comma-separated counts of throttled hosts"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.requests, args.latency, args.window, int(args.slow_hosts))
        return 0
    for n_slow in (int(part) for part in str(args.slow_hosts).split(",")):
        print(
            f"\n{n_slow} slow host(s) x {args.requests} requests (delay {SLOW_DELAY:g} s) "
            f"queued before {args.requests} to {FAST_HOST}; CONCURRENT_REQUESTS = 2; "
            f"latency {args.latency:g} s; window {args.window:g} s"
        )
        header = (
            f"{'setup':<24} {'fast done':>10} {'slow done':>10} {'all fast after':>15} "
            f"{'waiting in downloader':>22}"
        )
        print(header)
        print("-" * len(header))
        for setup in SETUPS:
            r = run(setup, args, n_slow)
            after = r["all_fast_done_after"]
            after_text = f"{after:.2f} s" if after is not None else f"> {args.window:g} s"
            print(
                f"{setup:<24} {r['fast_in_window']:>6}/{args.requests:<3} "
                f"{r['slow_in_window']:>10} {after_text:>15} {r['waiting_in_downloader']:>22}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
