"""One benchmark crawl, run in a fresh process.

Invoked by :mod:`benchmarks.cli` as ``python -m benchmarks._child SPEC``,
where ``SPEC`` is a JSON object with these keys:

``kind``
    ``"throughput"``, ``"delay"``, or ``"timer"``: no crawl, just a chain of
    plain ``reactor.callLater(delay)`` calls on the reactor Scrapy installs,
    whose lateness is the floor any downloader's delay precision sits on.
``downloader``
    Import path for the ``DOWNLOADER`` setting.
``requests``, ``hosts``
    How many requests to send, spread round-robin over how many host names.
``settings``
    Extra Scrapy settings (applied last).

The child prints exactly one line starting with :data:`RESULT_PREFIX`
followed by a JSON object to stdout; Scrapy's own logging goes to stderr.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import resource
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from scrapy import Request, Spider, signals
from scrapy.crawler import AsyncCrawlerProcess, Crawler
from scrapy.http import Response
from scrapy.utils.reactor import install_reactor

import slotkit.testing as slotkit_testing
from benchmarks._shared import RESULT_PREFIX
from benchmarks.stats import median, percentile
from slotkit.testing import get_recorder

DEFAULT_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"

IN_MEMORY = "slotkit.testing.InMemoryDownloadHandler"

BASE_SETTINGS: dict[str, Any] = {
    "DOWNLOAD_HANDLERS": {"http": IN_MEMORY, "https": IN_MEMORY},
    "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": False,
}


def source_digest() -> str:
    """Return a short digest of slotkit's sources, to spot edits between runs."""
    digest = hashlib.sha256()
    package = Path(slotkit_testing.__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def host_name(index: int) -> str:
    """Return the benchmark host name number *index* (never resolved)."""
    return f"h{index}.bench.test"


class BenchSpider(Spider):
    """Spider yielding ``requests`` URLs spread over ``hosts`` host names."""

    name = "bench"

    def __init__(self, requests: int, hosts: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n_requests = requests
        self.n_hosts = hosts

    async def start(self) -> AsyncIterator[Any]:
        """Yield the requests, cycling over the hosts."""
        for i in range(self.n_requests):
            host = host_name(i % self.n_hosts)
            yield Request(f"http://{host}/page/{i}", dont_filter=True)

    def parse(self, response: Response, **kwargs: Any) -> None:
        """Ignore the response."""


class _Timer:
    """Receives engine signals and takes wall-clock readings."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.closed: float | None = None
        self.cpu_started = 0.0
        self.cpu_closed = 0.0

    def engine_started(self) -> None:
        self.started = time.perf_counter()
        self.cpu_started = time.process_time()

    def spider_closed(self) -> None:
        self.closed = time.perf_counter()
        self.cpu_closed = time.process_time()


def _delay_analysis(times: list[float], delay: float) -> dict[str, Any]:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    overshoot_ms = [(g - delay) * 1000.0 for g in gaps]
    return {
        "gaps": len(gaps),
        "short_gaps": sum(1 for g in gaps if g < delay),
        # Shorter by over 1 ms: beyond event-loop/scheduler noise on a busy machine.
        "short_gaps_1ms": sum(1 for g in gaps if g < delay - 0.001),
        "min_gap_ms": min(gaps) * 1000.0 if gaps else None,
        "overshoot_p50_ms": percentile(overshoot_ms, 50),
        "overshoot_p99_ms": percentile(overshoot_ms, 99),
        "overshoot_max_ms": max(overshoot_ms) if overshoot_ms else None,
        "overshoot_median_ms": median(overshoot_ms),
        "span_s": times[-1] - times[0] if times else 0.0,
    }


def run_timer(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``requests`` chained ``callLater(delay)`` calls on Scrapy's default reactor.

    The "gap" between two calls is measured the way the delay benchmark
    measures dispatches, so its overshoot is directly comparable: whatever
    a downloader adds on top of it is the downloader's own.
    """
    install_reactor(DEFAULT_REACTOR)
    from twisted.internet import reactor

    delay = float(spec["settings"]["DOWNLOAD_DELAY"])
    clock: Any = reactor
    times: list[float] = []

    def tick() -> None:
        times.append(clock.seconds())
        if len(times) >= spec["requests"]:
            clock.stop()
        else:
            clock.callLater(delay, tick)

    clock.callWhenRunning(tick)
    clock.run(installSignalHandlers=False)
    result: dict[str, Any] = {
        "kind": "timer",
        "downloader": "reactor",
        "requests": spec["requests"],
        "delay_s": delay,
        "problems": [],
    }
    result.update(_delay_analysis(times, delay))
    return result


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the crawl described by *spec* and return its measurements."""
    if spec["kind"] == "timer":
        return run_timer(spec)
    settings = {**BASE_SETTINGS, "DOWNLOADER": spec["downloader"], **spec["settings"]}
    process = AsyncCrawlerProcess(settings)
    crawler: Crawler = process.create_crawler(BenchSpider)
    timer = _Timer()
    crawler.signals.connect(timer.engine_started, signals.engine_started)
    crawler.signals.connect(timer.spider_closed, signals.spider_closed)
    recorder = get_recorder(crawler)
    process.crawl(crawler, requests=spec["requests"], hosts=spec["hosts"])
    process.start(install_signal_handlers=False)

    stats = crawler.stats.get_stats() if crawler.stats else {}
    n = spec["requests"]
    result: dict[str, Any] = {
        "kind": spec["kind"],
        "downloader": spec["downloader"],
        "requests": n,
        "hosts": spec["hosts"],
        "dispatched": len(recorder.log),
        "responses": stats.get("response_received_count", 0),
        "finish_reason": stats.get("finish_reason"),
        "downloader_exceptions": stats.get("downloader/exception_count", 0),
        "peak_total_in_flight": recorder.peak_total_in_flight,
        "peak_in_flight_per_host": max(recorder.peak_in_flight.values(), default=0),
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "slotkit_digest": source_digest(),
    }
    problems = []
    if timer.started is None or timer.closed is None:
        problems.append("engine_started/spider_closed signal not seen")
    else:
        wall = timer.closed - timer.started
        result["wall_s"] = wall
        result["rps"] = n / wall if wall > 0 else None
        cpu = timer.cpu_closed - timer.cpu_started
        result["cpu_s"] = cpu
        result["rpcs"] = n / cpu if cpu > 0 else None
    if result["finish_reason"] != "finished":
        problems.append(f"finish_reason={result['finish_reason']!r}")
    if result["responses"] != n:
        problems.append(f"{result['responses']} responses for {n} requests")
    if result["dispatched"] != n:
        problems.append(f"{result['dispatched']} dispatches for {n} requests")
    if spec["kind"] == "delay":
        delay = float(spec["settings"]["DOWNLOAD_DELAY"])
        result["delay_s"] = delay
        result.update(_delay_analysis(recorder.times(), delay))
    result["problems"] = problems
    return result


def main(argv: list[str]) -> int:
    """Run the spec given as the first argument and print the result line."""
    spec = json.loads(argv[1])
    result = run(spec)
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
