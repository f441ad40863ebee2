"""Where the time of one shared acquire goes: the store path alone, on an idle and a busy loop.

Run from the repository root (needs ``redis-server`` on PATH and redis-py)::

    python -m benchmarks.shared_latency

One worker's ``acquire`` (the real script, one scope, "go now" every time)
against a fresh ``redis-server`` on 127.0.0.1, timed from writing the
command to reading the reply, through:

``wire``    slotkit's :class:`~slotkit.shared.client.AsyncioRedisBackend`
            (one pipelined redis-py connection, written at once);
``stock``   redis-py's ``Redis.evalsha`` (pool, ``asyncio.wait_for`` around
            writes when a socket timeout is set, as the first version used).

each on an idle event loop and on a loop kept busy by three tasks that run
1 ms of Python per turn (what a crawler's own work does to a reply waiting
in its socket). The server-side time of the script comes from
``INFO commandstats``. Results go to stdout and
``benchmarks/results/shared_latency.json``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.shared_server import Redis
from benchmarks.shared_workers import ROOT

CALLS = 2000
KEYS = ["{lat}:w", "{lat}:s:a", "{lat}:l:a"]


def argv(i: int) -> list[str]:
    from slotkit.shared.twin import fmt

    out = ["acquire", "", "w0", fmt(5.0), "0", f"l{i}", fmt(60.0), fmt(30.0), fmt(600.0), "1"]
    out += [fmt(1.0), fmt(0.0), "1000000", fmt(-1.0), fmt(60.0), fmt(0.0), fmt(2.0)]
    out += [fmt(1.0), fmt(60.0), fmt(60.0), fmt(1.0), "0", "1", fmt(1.0), fmt(0.0), fmt(0.0), "1"]
    return out


class MonotonicClock:
    def seconds(self) -> float:
        return time.monotonic()


async def busy(stop: list[int]) -> None:
    while not stop:
        began = time.monotonic()
        while time.monotonic() - began < 0.001:
            pass
        await asyncio.sleep(0)


def quantiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    pick = lambda q: round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 3)  # noqa: E731
    return {"p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99)}


async def measure(url: str, client: str, busy_tasks: int) -> dict[str, Any]:
    from twisted.internet.defer import Deferred

    from slotkit.shared.client import AsyncioRedisBackend, _no_retry, script_source

    loop = asyncio.get_running_loop()
    stop: list[int] = []
    times: list[float] = []
    if client == "wire":
        backend = AsyncioRedisBackend(url, 0.25, MonotonicClock())
        await Deferred.asFuture(backend.prepare(), loop)
        tasks = [asyncio.ensure_future(busy(stop)) for _ in range(busy_tasks)]
        for i in range(CALLS):
            await Deferred.asFuture(backend.run(KEYS, argv(i)), loop)
            await asyncio.sleep(0.001)
        times = backend.stats.round_trips
        closing = backend.close()
    else:
        import redis.asyncio as aioredis

        source = script_source()
        sha = hashlib.sha1(source.encode()).hexdigest()
        stock = aioredis.Redis.from_url(
            url, decode_responses=True, socket_timeout=0.25, **_no_retry(asyncio_client=True)
        )
        await stock.script_load(source)
        tasks = [asyncio.ensure_future(busy(stop)) for _ in range(busy_tasks)]
        for i in range(CALLS):
            began = time.monotonic()
            await stock.evalsha(sha, len(KEYS), *KEYS, *argv(i))
            times.append(time.monotonic() - began)
            await asyncio.sleep(0.001)
        closing = None
        await stock.aclose()
    stop.append(1)
    await asyncio.gather(*tasks)
    if closing is not None:
        await Deferred.asFuture(closing, loop)
    return {"client": client, "busy_tasks": busy_tasks, "calls": CALLS, **quantiles(times)}


async def main() -> None:
    import redis.asyncio as aioredis

    redis = Redis()
    results = []
    try:
        for client in ("wire", "stock"):
            for busy_tasks in (0, 3):
                result = await measure(redis.url, client, busy_tasks)
                print(json.dumps(result), flush=True)
                results.append(result)
        info = aioredis.Redis.from_url(redis.url)
        stats = await info.info("commandstats")
        await info.aclose()
        server = {"server_usec_per_evalsha": stats.get("cmdstat_evalsha", {}).get("usec_per_call")}
        print(json.dumps(server))
        results.append(server)
    finally:
        redis.close()
    for result in results:
        result["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    Path(out / "shared_latency.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    import argparse

    # No options: --help (and anything else) is answered before a server starts.
    argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    asyncio.run(main())
