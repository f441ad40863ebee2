"""Soak benchmark: a million requests over 100,000 scopes, in memory.

``python -m benchmarks.soak`` drives slotkit's in-memory path (what
:class:`slotkit.Downloader` does per request, without the Scrapy engine):
``registry.scopes_for`` → ``gate.try_acquire`` (``gate.acquire`` when that
fails) → ``gate.release``, with scope managers built the way the downloader
builds them (``ThrottlingSettings.scope_config`` → ``create_scope_manager``),
default settings and a :class:`~slotkit.registry.ScopeRegistry` limit of
10,000 (``THROTTLING_SCOPE_LIMIT``). A window of ``--window`` requests stays
in flight (``CONCURRENT_REQUESTS``); the clock moves 1 ms per request. The
large soak runs twice: ``round-robin`` over all scope ids, so with 100,000
scopes and a limit of 10,000 every request creates a scope and evicts one
(the registry's worst case); and ``sites``, 100 sites at a time, each given
its ten requests (interleaved) before the next takes its place, so one
request in ten creates a scope (a broad crawl of small sites).

Measured:

1. **per-request cost** (µs, wall clock, GC on) at 100 and at 100,000
   scopes, per 100k-request chunk; the ratio uses the median chunk after
   the first (warm-up). Target: ratio ≤ 1.2.
2. **memory over time**: tracemalloc's current size and the process RSS
   every 100k requests, in a separate run (tracemalloc slows Python down).
   Target: flat once the registry is full.
3. **bytes per idle scope**: N scopes created (limit above N, so none is
   evicted), fresh and after one request each, diffed with tracemalloc,
   with the top allocation sites. Target: ≤ 1 KB.
4. a smaller crawl through the **real engine** (``benchmarks._child``, the
   in-memory download handler, one process per crawl) at 100 and 10,000
   hosts with ``THROTTLING_SCOPE_LIMIT = 1000``.
5. the same million requests **through** ``slotkit.Downloader.fetch()``
   (Scrapy's default downloader middlewares, the registry, the gate and
   :class:`slotkit.testing.InMemoryDownloadHandler` on the asyncio reactor's
   loop; no engine, no scheduler): per-request cost at 100 and 100,000
   scopes, both patterns, limit 10,000, and RSS per chunk. Requests are
   built in batches outside the timed part; the handler's dispatch log is
   cleared after each batch.

When a target is missed (or with ``--profile``), cProfile runs on a shorter
round-robin soak and its top functions are printed and saved.
The table goes to stdout, the data to ``benchmarks/results/soak.json``
(``soak-quick.json`` with ``--quick``, a smoke run of about a minute).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import io
import json
import os
import platform
import pstats
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scrapy.settings import Settings
from twisted.internet.task import Clock

from benchmarks.stats import median
from slotkit.gate import Gate, Waiter
from slotkit.registry import Scope, ScopeRegistry
from slotkit.scope_managers import create_scope_manager
from slotkit.settings import DOMAIN, ThrottlingSettings

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TICK = 0.001  # clock step per request (seconds)
AMOUNTS: list[float | None] = [None]
COST_RATIO_TARGET = 1.2
IDLE_BYTES_TARGET = 1024
#: Growth of tracemalloc's current size after warm-up that still counts as flat.
FLAT_TOLERANCE = 0.05


class Request:
    """What the gate needs of a request: identity (it is hashed) and a repr."""

    __slots__ = ("__weakref__", "number")

    def __init__(self, number: int) -> None:
        self.number = number

    def __repr__(self) -> str:
        return f"<Request {self.number}>"


def rss_bytes() -> int:
    """The resident set size of this process now (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# ----------------------------------------------------------------- the in-memory path


class Soak:
    """A gate, a registry and scope managers on a Clock, as the downloader wires them."""

    def __init__(self, limit: int) -> None:
        self.clock = Clock()
        self.clock.advance(1_750_000_000.0)  # a reactor's clock reads epoch seconds
        self.settings = ThrottlingSettings.from_settings(
            Settings({"THROTTLING_SCOPE_LIMIT": limit})
        )
        self.gate = Gate(self.clock)
        self.registry = ScopeRegistry(
            self.new_scope,
            self.clock,
            limit=self.settings.scope_limit,
            max_idle=self.settings.scope_max_idle,
        )
        self.fallbacks = 0

    def new_scope(self, scope_id: str) -> Scope:
        """Downloader._new_scope without robots.txt and JOBDIR."""
        config = self.settings.scope_config(scope_id, DOMAIN)
        manager = create_scope_manager(None, config)  # type: ignore[arg-type]
        return Scope(scope_id, manager, DOMAIN)

    def run(
        self,
        requests: int,
        scope_ids: list[str],
        window: int,
        checkpoint: int,
        on_checkpoint: Callable[[int, float], None],
        pattern: str = "round-robin",
    ) -> None:
        """Send *requests* over *scope_ids* in *pattern* order, *window* in flight at a time."""
        registry, gate, clock = self.registry, self.gate, self.clock
        in_flight: deque[Waiter] = deque()
        order = scope_order(pattern, requests, len(scope_ids), window)
        started = time.perf_counter()
        for number in range(requests):
            scopes = registry.scopes_for((scope_ids[order(number)],))
            request = Request(number)
            ticket = gate.try_acquire(request, scopes, AMOUNTS)  # type: ignore[arg-type]
            if ticket is None:
                self.fallbacks += 1
                gate.acquire(request, scopes, AMOUNTS).addCallback(in_flight.append)  # type: ignore[arg-type]
            else:
                in_flight.append(ticket)
            if len(in_flight) >= window:
                gate.release(in_flight.popleft())
            if number % 100 == 99:
                clock.advance(100 * TICK)
            if (number + 1) % checkpoint == 0:
                now = time.perf_counter()
                on_checkpoint(number + 1, now - started)
                started = time.perf_counter()
        while in_flight:
            gate.release(in_flight.popleft())


def scope_order(pattern: str, requests: int, scopes: int, active: int) -> Callable[[int], int]:
    """Which scope request *n* goes to.

    ``round-robin``: n mod scopes; with more scopes than the limit, every
    request creates a scope (the registry's worst case). ``sites``: *active*
    sites at a time, interleaved, each getting its requests / scopes share
    before the next site takes its place (a crawl of many small sites).
    """
    if pattern == "round-robin":
        return lambda n: n % scopes
    burst = max(1, requests // scopes)
    return lambda n: ((n // (active * burst)) * active + n % active) % scopes


def scope_names(count: int) -> list[str]:
    return [f"h{index}.bench.test" for index in range(count)]


def cost_run(
    requests: int,
    scopes: int,
    limit: int,
    window: int,
    checkpoint: int,
    *,
    pattern: str = "round-robin",
) -> dict[str, Any]:
    """Per-request cost per chunk, with RSS at each checkpoint (no tracemalloc)."""
    gc.collect()
    soak = Soak(limit)
    names = scope_names(scopes)
    chunks: list[dict[str, Any]] = []

    def checkpoint_cb(done: int, seconds: float) -> None:
        chunks.append(
            {
                "requests": done,
                "us_per_request": seconds / checkpoint * 1e6,
                "rss_mib": rss_bytes() / 2**20,
                "live_scopes": len(soak.registry),
                "evicted": soak.registry.evicted,
            }
        )

    soak.run(requests, names, window, checkpoint, checkpoint_cb, pattern)
    steady = [chunk["us_per_request"] for chunk in chunks[1:]] or [chunks[0]["us_per_request"]]
    return {
        "scopes": scopes,
        "pattern": pattern,
        "requests": requests,
        "limit": limit,
        "created": soak.registry.evicted + len(soak.registry),
        "us_per_request_median": median(steady),
        "chunks": chunks,
        "fallbacks": soak.fallbacks,
        "evicted": soak.registry.evicted,
        "live_scopes": len(soak.registry),
    }


def memory_run(
    requests: int, scopes: int, limit: int, window: int, checkpoint: int
) -> dict[str, Any]:
    """tracemalloc's current size and RSS every *checkpoint* requests."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    soak = Soak(limit)
    names = scope_names(scopes)
    base_with_names = tracemalloc.get_traced_memory()[0]
    curve: list[dict[str, Any]] = []

    def checkpoint_cb(done: int, seconds: float) -> None:
        curve.append(
            {
                "requests": done,
                "traced_mib": (tracemalloc.get_traced_memory()[0] - base_with_names) / 2**20,
                "rss_mib": rss_bytes() / 2**20,
                "live_scopes": len(soak.registry),
            }
        )

    try:
        soak.run(requests, names, window, checkpoint, checkpoint_cb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Flat: after the registry filled up (warm-up), the traced size stays within a few %.
    warm = [point for point in curve if point["live_scopes"] >= min(limit, scopes)]
    warm = warm[1:] if len(warm) > 2 else warm
    growth = (
        (warm[-1]["traced_mib"] - warm[0]["traced_mib"]) / warm[0]["traced_mib"]
        if len(warm) >= 2 and warm[0]["traced_mib"] > 0
        else 0.0
    )
    return {
        "scopes": scopes,
        "requests": requests,
        "limit": limit,
        "setup_mib": (base_with_names - base) / 2**20,  # the soak objects and the id list
        "curve": curve,
        "peak_traced_mib": (peak - base_with_names) / 2**20,
        "growth_after_warmup": growth,
        "flat": abs(growth) <= FLAT_TOLERANCE,
    }


def idle_scope_bytes(count: int, top: int = 8) -> dict[str, Any]:
    """Bytes per idle live scope: *count* scopes created (none evicted), diffed with tracemalloc."""
    gc.collect()
    soak = Soak(count * 2)
    names = scope_names(count)
    for name in names[:10]:  # first-use allocations (caches, interned config) out of the diff
        soak.registry.scopes_for((name,))
    tracemalloc.start(1)
    try:
        before = tracemalloc.take_snapshot()
        for name in names[10:]:
            soak.registry.scopes_for((name,))
        gc.collect()
        fresh = tracemalloc.take_snapshot()
        # The same scopes after one request each: still idle, now with a send recorded.
        for number, name in enumerate(names[10:]):
            scopes = soak.registry.scopes_for((name,))
            ticket = soak.gate.try_acquire(Request(number), scopes, AMOUNTS)  # type: ignore[arg-type]
            assert ticket is not None
            soak.gate.release(ticket)
        gc.collect()
        used = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    created = count - 10
    assert len(soak.registry) == count
    fresh_diff = fresh.compare_to(before, "lineno")
    used_diff = used.compare_to(before, "lineno")
    return {
        "count": created,
        "bytes_fresh": sum(stat.size_diff for stat in fresh_diff) / created,
        "bytes_used": sum(stat.size_diff for stat in used_diff) / created,
        "top_sites": [
            {
                "site": f"{Path(stat.traceback[0].filename).name}:{stat.traceback[0].lineno}",
                "bytes_per_scope": stat.size_diff / created,
            }
            for stat in sorted(used_diff, key=lambda stat: -stat.size_diff)[:top]
        ],
    }


def profile_run(requests: int, scopes: int, limit: int, window: int, top: int = 15) -> str:
    """cProfile of a shorter soak; the top functions by internal time."""
    soak = Soak(limit)
    names = scope_names(scopes)
    profiler = cProfile.Profile()
    profiler.enable()
    soak.run(requests, names, window, requests, lambda done, seconds: None)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def engine_runs(requests: int, hosts: list[int], limit: int) -> list[dict[str, Any]]:
    """The same traffic shape through the real Scrapy engine, one child process per crawl."""
    from benchmarks.cli import THROUGHPUT_SETTINGS, run_child

    results = []
    for count in hosts:
        spec = {
            "kind": "throughput",
            "downloader": "slotkit.Downloader",
            "requests": requests,
            "hosts": count,
            "settings": {
                **THROUGHPUT_SETTINGS,
                "CONCURRENT_REQUESTS": 100,
                "THROTTLING_SCOPE_LIMIT": limit,
            },
        }
        result = run_child(spec, timeout=3600, verbose=False)
        results.append(result)
    return results


# ----------------------------------------------------------------- through Downloader.fetch()

IN_MEMORY = "slotkit.testing.InMemoryDownloadHandler"
ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
#: Requests built at a time, outside the timed part (a spider builds them, not the downloader).
FETCH_BATCH = 10_000


def fetch_run(
    requests: int,
    scopes: int,
    limit: int,
    window: int,
    checkpoint: int,
    *,
    pattern: str = "round-robin",
) -> dict[str, Any]:
    """Per-request cost through ``slotkit.Downloader.fetch()``, chunk by chunk.

    The real request path minus the engine and the scheduler: Scrapy's
    default downloader middlewares, the scope registry, the gate and
    :class:`slotkit.testing.InMemoryDownloadHandler`, on the asyncio reactor's
    loop (what a crawl runs on). Throttling time is a Clock moved as in the
    registry-level soak, so no delay or idle time differs between the two.
    """
    from scrapy.utils.reactor import install_reactor, is_reactor_installed

    if not is_reactor_installed():
        install_reactor(ASYNCIO_REACTOR)
    import asyncio

    from scrapy.utils.asyncio import is_asyncio_available  # noqa: F401  (needs the reactor)

    gc.collect()
    loop = asyncio.get_event_loop()
    return loop.run_until_complete(
        _fetch_soak(requests, scopes, limit, window, checkpoint, pattern)
    )


def _fetch_downloader(limit: int, window: int) -> tuple[Any, Clock, Any]:
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from slotkit import Downloader
    from slotkit.testing import get_recorder

    crawler = get_crawler(
        Spider,
        settings_dict={
            "DOWNLOAD_HANDLERS": {"http": IN_MEMORY, "https": IN_MEMORY},
            "THROTTLING_SCOPE_LIMIT": limit,
            "CONCURRENT_REQUESTS": window,
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "WARNING",
        },
    )
    crawler.spider = crawler._create_spider("soak")
    clock = Clock()
    clock.advance(1_750_000_000.0)
    return Downloader(crawler, clock=clock), clock, get_recorder(crawler)


async def _fetch_soak(
    requests: int, scopes: int, limit: int, window: int, checkpoint: int, pattern: str
) -> dict[str, Any]:
    from scrapy import Request as ScrapyRequest
    from scrapy.utils.defer import maybe_deferred_to_future

    downloader, clock, recorder = _fetch_downloader(limit, window)
    names = scope_names(scopes)
    order = scope_order(pattern, requests, scopes, window)
    pending: deque[Any] = deque()
    chunks: list[dict[str, Any]] = []
    failed = 0
    timed = 0.0  # seconds spent in fetch() and awaiting responses, this chunk
    for start in range(0, requests, FETCH_BATCH):
        end = min(requests, start + FETCH_BATCH)
        batch = [ScrapyRequest(f"http://{names[order(n)]}/{n}") for n in range(start, end)]
        began = time.perf_counter()
        for number, request in enumerate(batch, start):
            pending.append(downloader.fetch(request))
            if len(pending) >= window:
                response = await maybe_deferred_to_future(pending.popleft())
                failed += response.status != 200
            if number % 100 == 99:
                clock.advance(100 * TICK)
            if (number + 1) % checkpoint == 0:
                timed += time.perf_counter() - began
                chunks.append(
                    {
                        "requests": number + 1,
                        "us_per_request": timed / checkpoint * 1e6,
                        "rss_mib": rss_bytes() / 2**20,
                        "live_scopes": len(downloader.registry),
                        "evicted": downloader.registry.evicted,
                    }
                )
                timed = 0.0
                began = time.perf_counter()
        timed += time.perf_counter() - began
        del batch
        # The handler's recorder logs every dispatch; the soak is not about it.
        recorder.clear()
    while pending:
        response = await maybe_deferred_to_future(pending.popleft())
        failed += response.status != 200
    downloader.close()
    steady = [chunk["us_per_request"] for chunk in chunks[1:]] or [chunks[0]["us_per_request"]]
    return {
        "scopes": scopes,
        "pattern": pattern,
        "requests": requests,
        "limit": limit,
        "created": downloader.registry.evicted + len(downloader.registry),
        "us_per_request_median": median(steady),
        "chunks": chunks,
        "failed": failed,
        "evicted": downloader.registry.evicted,
        "live_scopes": len(downloader.registry),
    }


# ----------------------------------------------------------------- report


def _table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke size (~1 min)")
    parser.add_argument("--requests", type=int, help="requests per soak (default 1,000,000)")
    parser.add_argument("--scopes", type=int, help="scopes of the large soak (default 100,000)")
    parser.add_argument("--limit", type=int, help="THROTTLING_SCOPE_LIMIT (default 10,000)")
    parser.add_argument("--window", type=int, default=100, help="requests in flight (100)")
    parser.add_argument("--reps", type=int, help="repetitions of each cost run (3; quick: 1)")
    parser.add_argument("--idle", type=int, help="scopes for bytes per idle scope (100,000)")
    parser.add_argument("--no-engine", action="store_true", help="skip the real-engine crawls")
    parser.add_argument("--engine-requests", type=int, help="requests per engine crawl (50,000)")
    parser.add_argument("--no-fetch", action="store_true", help="skip the Downloader.fetch() soak")
    parser.add_argument("--fetch-requests", type=int, help="requests per fetch() soak (--requests)")
    parser.add_argument("--fetch-reps", type=int, default=1, help="repetitions of each fetch() run")
    parser.add_argument("--only-fetch", action="store_true", help="run only the fetch() soak")
    parser.add_argument("--profile", action="store_true", help="profile even if targets are met")
    parser.add_argument("--name", help="results/<name>.json (default soak or soak-quick)")
    args = parser.parse_args(argv)

    quick = args.quick
    args.reps = args.reps or (1 if quick else 3)
    requests = args.requests or (100_000 if quick else 1_000_000)
    large = args.scopes or (10_000 if quick else 100_000)
    limit = args.limit or (1_000 if quick else 10_000)
    small = 100
    checkpoint = max(1, requests // 10)
    idle = args.idle or (10_000 if quick else 100_000)
    engine_requests = args.engine_requests or (3_000 if quick else 50_000)
    engine_hosts = [100, 1_000 if quick else 10_000]
    engine_limit = 100 if quick else 1_000
    fetch_requests = args.fetch_requests or requests
    if args.only_fetch:
        args.no_engine = True
    result: dict[str, Any] = {
        "argv": sys.argv,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "params": {
            "requests": requests,
            "scopes": [small, large],
            "limit": limit,
            "window": args.window,
            "tick_s": TICK,
            "checkpoint": checkpoint,
            "reps": args.reps,
            "fetch_requests": 0 if args.no_fetch else fetch_requests,
            "fetch_reps": args.fetch_reps,
        },
    }
    try:
        from benchmarks._child import source_digest

        result["slotkit_digest"] = source_digest()
    except Exception:  # the digest is a nicety
        pass

    # 4. The real engine, run first while this process is still small: on Linux a
    # child's ru_maxrss starts from its parent's high-water mark at fork.
    if not args.no_engine:
        engine = engine_runs(engine_requests, engine_hosts, engine_limit)
        result["engine"] = engine
        print(
            f"real engine ({engine_requests:,} requests, InMemoryDownloadHandler, "
            f"THROTTLING_SCOPE_LIMIT={engine_limit:,}, CONCURRENT_REQUESTS=100)"
        )
        _table(
            ["hosts", "req/s", "req/CPU-s", "max RSS MiB", "problems"],
            [
                [
                    f"{run.get('hosts', 0):,}",
                    f"{run.get('rps') or 0:.0f}",
                    f"{run.get('rpcs') or 0:.0f}",
                    f"{run.get('max_rss_kib', 0) / 1024:.0f}",
                    "; ".join(run.get("problems", [])) or "-",
                ]
                for run in engine
            ],
        )
        if len(engine) == 2 and engine[0].get("rpcs") and engine[1].get("rpcs"):
            result["engine_cost_ratio"] = engine[0]["rpcs"] / engine[1]["rpcs"]
            print(
                f"  CPU cost ratio {engine_hosts[1]:,}/{engine_hosts[0]} hosts: "
                f"{result['engine_cost_ratio']:.2f}"
            )

    plan = [(small, "round-robin"), (large, "round-robin"), (large, "sites")]
    targets: dict[str, bool] = {}
    if not args.only_fetch:
        print(f"\nsoak: {requests:,} requests, {small} vs {large:,} scopes, limit {limit:,}")
        # 1. Per-request cost: the baseline, then the large soak in both patterns.
        costs = cost_reps(
            plan,
            args.reps,
            lambda scopes, pattern: cost_run(
                requests, scopes, limit, args.window, checkpoint, pattern=pattern
            ),
        )
        result["cost"] = costs
        result["cost_ratio"] = costs[1]["ratio"]
        result["cost_ratio_sites"] = costs[2]["ratio"]
        print(f"\nper-request cost (median over {args.reps} reps of the median chunk; GC on)")
        cost_table(costs, small, large)
        targets["cost_ratio"] = costs[1]["ratio"] <= COST_RATIO_TARGET
        targets |= memory_and_idle(args, result, requests, small, large, limit, checkpoint, idle)

    # 5. Through Downloader.fetch(), last: it installs the asyncio reactor here.
    if not args.no_fetch:
        fetch_checkpoint = max(1, fetch_requests // 10)
        print(
            f"\nDownloader.fetch() soak: {fetch_requests:,} requests, {small} vs {large:,} "
            f"scopes, limit {limit:,}, {args.window} in flight (middlewares + gate + "
            "InMemoryDownloadHandler, no engine)"
        )
        fetch = cost_reps(
            plan,
            args.fetch_reps,
            lambda scopes, pattern: fetch_run(
                fetch_requests, scopes, limit, args.window, fetch_checkpoint, pattern=pattern
            ),
        )
        result["fetch"] = fetch
        result["fetch_cost_ratio"] = fetch[1]["ratio"]
        result["fetch_cost_ratio_sites"] = fetch[2]["ratio"]
        print(f"\nper-request cost through fetch() (median over {args.fetch_reps} reps)")
        cost_table(fetch, small, large)
        print("RSS (MiB) per chunk through fetch():")
        _table(
            ["requests"] + [f"{run['scopes']:,} {run['pattern']}" for run in fetch],
            [
                [f"{chunk['requests']:,}"]
                + [f"{run['chunks'][index]['rss_mib']:.0f}" for run in fetch]
                for index, chunk in enumerate(fetch[0]["chunks"])
            ],
        )
        targets["fetch_cost_ratio"] = fetch[1]["ratio"] <= COST_RATIO_TARGET
        targets["fetch_cost_ratio_sites"] = fetch[2]["ratio"] <= COST_RATIO_TARGET

    result["targets_met"] = targets
    print("\ntargets:", ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in targets.items()))
    if not args.only_fetch and (args.profile or not all(targets.values())):
        profiled = min(requests, 200_000)
        print(f"\ncProfile, {profiled:,} requests over {large:,} scopes (top by own time):")
        text = profile_run(profiled, large, limit, args.window)  # round-robin: the worst case
        result["profile_large"] = text
        print("\n".join(text.splitlines()[:40]))

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    name = args.name or "-".join(
        ["soak", *(["fetch"] if args.only_fetch else []), *(["quick"] if quick else [])]
    )
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwrote {path}")
    return 0


def cost_reps(
    plan: list[tuple[int, str]], reps: int, run_one: Callable[[int, str], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Run every (scopes, pattern) of *plan* *reps* times; medians and ratios to the first."""
    # Repetitions take turns (rotated order), so slow drift of the machine hits every variant.
    runs_of: list[list[dict[str, Any]]] = [[] for _ in plan]
    for rep in range(reps):
        for index in [(rep + offset) % len(plan) for offset in range(len(plan))]:
            scopes, pattern = plan[index]
            run = run_one(scopes, pattern)
            runs_of[index].append(run)
            print(
                f"  rep {rep + 1}: {scopes:,} scopes {pattern}: "
                f"{run['us_per_request_median']:.2f} µs (load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
    costs = []
    for runs in runs_of:
        values = [run["us_per_request_median"] for run in runs]
        costs.append(
            {
                **runs[0],
                "us_per_request_median": median(values),
                "us_per_request_reps": values,
                "runs": runs,
            }
        )
    for run in costs:
        run["ratio"] = run["us_per_request_median"] / costs[0]["us_per_request_median"]
    return costs


def cost_table(costs: list[dict[str, Any]], small: int, large: int) -> None:
    _table(
        ["scopes", "pattern", "µs/request", "min-max", "ratio", "scopes created"],
        [
            [
                f"{run['scopes']:,}",
                run["pattern"],
                f"{run['us_per_request_median']:.2f}",
                f"{min(run['us_per_request_reps']):.1f}-{max(run['us_per_request_reps']):.1f}",
                f"{run['ratio']:.2f}",
                f"{run['created']:,}",
            ]
            for run in costs
        ],
    )
    print(
        f"ratio {large:,}/{small} scopes: {costs[1]['ratio']:.2f} round-robin, "
        f"{costs[2]['ratio']:.2f} sites (target <= {COST_RATIO_TARGET})"
    )


def memory_and_idle(
    args: argparse.Namespace,
    result: dict[str, Any],
    requests: int,
    small: int,
    large: int,
    limit: int,
    checkpoint: int,
    idle: int,
) -> dict[str, bool]:
    """Sections 2 and 3; returns their targets."""
    # 2. Memory over time.
    memory = [
        memory_run(requests, small, limit, args.window, checkpoint),
        memory_run(requests, large, limit, args.window, checkpoint),
    ]
    result["memory"] = memory
    print("\nmemory over time (MiB: tracemalloc current above the set-up and id list / RSS)")
    headers = ["requests"] + [f"{run['scopes']:,} scopes traced/rss" for run in memory]
    rows = []
    for index, point in enumerate(memory[0]["curve"]):
        row = [f"{point['requests']:,}"]
        for run in memory:
            other = run["curve"][index]
            row.append(f"{other['traced_mib']:.1f} / {other['rss_mib']:.0f}")
        rows.append(row)
    _table(headers, rows)
    for run in memory:
        print(
            f"  {run['scopes']:,} scopes: growth after warm-up {run['growth_after_warmup']:+.1%} "
            f"({'flat' if run['flat'] else 'NOT flat'}), peak {run['peak_traced_mib']:.1f} MiB"
        )

    # 3. Bytes per idle scope.
    idle_run = idle_scope_bytes(idle)
    result["idle_scope"] = idle_run
    print(
        f"\nbytes per idle scope ({idle:,} scopes; target <= {IDLE_BYTES_TARGET}): "
        f"{idle_run['bytes_fresh']:.0f} fresh, {idle_run['bytes_used']:.0f} after a request"
    )
    print("  where the bytes go (after a request):")
    for site in idle_run["top_sites"]:
        print(f"    {site['bytes_per_scope']:8.0f}  {site['site']}")

    return {
        "memory_flat": all(run["flat"] for run in memory),
        "idle_scope_bytes": idle_run["bytes_used"] <= IDLE_BYTES_TARGET,
    }


if __name__ == "__main__":
    sys.exit(main())
