"""Shared throttling across processes: N real Scrapy workers, one Redis, one recording server.

Run from the repository root with the dev venv (needs ``redis-server`` on PATH and redis-py)::

    python -m benchmarks.shared_workers                  # N = 4 and 8, every scenario
    python -m benchmarks.shared_workers --workers 4 --scenarios rate,baseline

Scenarios (each in fresh processes, against a fresh ``redis-server`` on 127.0.0.1):

``rate``      two hosts, each configured at ``--delay`` (default 0.05 s → 20 req/s, no
              jitter, concurrency 2N); the aggregate per-host rate while every worker
              runs, each worker's share, store calls and commands per request, the
              p50/p99 of one acquire round trip (in the worker, and the server's own
              time running the script, from its SLOWLOG), and the event loop's lag.
``baseline``  the same crawl without ``THROTTLING_REDIS_URL`` (about N times the rate).
``skew``      ``rate`` with one worker's clock 2 s ahead (``SLOTKIT_BENCH_SKEW``, set
              for that worker only, offsets its reactor's time before the crawl starts).
``conc``      one host, shared concurrency 2, no delay, 50 ms responses: the server counts
              how often more than 2 requests of the host were in progress (violations).
``retry``     once every worker crawls, the server answers one request with 429 +
              ``Retry-After: 3``; reports each
              worker's first request after it, when the hold reached Redis, and for any
              early arrival when it left its worker.
``kill``      ``redis-server`` is killed mid-crawl and restarted (empty) 3 s later: every
              request still gets its response (none lost); when each worker fell back
              and re-synced.
``freeze``    the same with the server frozen (SIGSTOP) for 3 s, then thawed.

``-s KEY=VALUE`` (repeatable) adds a Scrapy setting to every worker, e.g.
``-s THROTTLING_REDIS_GC_FREEZE=false`` for an A/B run.

Each scenario also reports how long each worker took to exit after its spider
closed, the load average, and how busy the machine was (``machine``: CPU busy,
time stolen by the hypervisor, time some runnable task waited for a CPU). Results go to stdout and
``benchmarks/results/<--out>`` (default ``shared_workers.json``); the recording
server and the Redis process live in ``benchmarks/shared_server.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.shared_analysis import analyse, pct
from benchmarks.shared_server import MachineLoad, Recorder, Redis

RESULT = "SHARED-RESULT "
SKEW_ENV = "SLOTKIT_BENCH_SKEW"
ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- one worker


def child(spec: dict[str, Any]) -> None:
    from scrapy import Request, Spider, signals
    from scrapy.crawler import AsyncCrawlerProcess

    worker = spec["worker"]
    hosts = spec["hosts"]
    port = spec["port"]

    class WorkerSpider(Spider):
        name = "shared-bench"

        async def start(self):
            for i in range(spec["requests"]):
                host = hosts[i % len(hosts)]
                yield Request(
                    f"http://{host}:{port}/{worker}/{i}",
                    headers={"X-Worker": worker},
                    dont_filter=True,
                )

        def parse(self, response, **kwargs):
            self.crawler.stats.inc_value("bench/responses")

    settings = {
        "DOWNLOADER": spec["downloader"],
        "THROTTLING_SCOPES": dict.fromkeys(hosts, spec["scope"]),
        "CONCURRENT_REQUESTS": 32,
        "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "RETRY_ENABLED": True,
        "HTTPERROR_ALLOW_ALL": True,
        "COOKIES_ENABLED": False,
        # No jitter: the rate over a few seconds is then exact enough to compare.
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        **spec.get("settings", {}),
    }
    process = AsyncCrawlerProcess(settings)
    from twisted.internet import reactor
    from twisted.internet.task import LoopingCall

    # Clock skew: this worker's reactor time (all slotkit reads) runs ahead.
    skew = float(os.environ.get(SKEW_ENV, "0") or 0)
    if skew:
        original = reactor.seconds
        reactor.seconds = lambda: original() + skew  # type: ignore[method-assign]
    crawler = process.create_crawler(WorkerSpider)
    result: dict[str, Any] = {"worker": worker}
    # Reactor lag: how late a 50 ms timer fires (a busy loop delays every reply).
    lags: list[float] = []
    lag_times: list[float] = []
    probe_due = [time.monotonic() + 0.05]

    def probe() -> None:
        now = time.monotonic()
        lags.append(now - probe_due[0])
        lag_times.append(time.time())
        probe_due[0] = now + 0.05

    lag_probe = LoopingCall(probe)

    def closed(spider: Any, reason: str) -> None:
        if lag_probe.running:
            lag_probe.stop()
        downloader = crawler.engine.downloader
        summary: dict[str, Any] = getattr(downloader, "shared_summary", dict)()
        series = list(zip(summary.pop("sent_at", []), summary.get("latencies", []), strict=False))
        latencies = sorted(summary.pop("latencies", []))
        go_now = sorted(summary.pop("go_now", []))
        result.update(summary)
        result["reason"] = reason
        result["closed_at"] = time.time()
        result["responses"] = crawler.stats.get_value("bench/responses", 0)
        result["acquire_p50_ms"] = pct(latencies, 0.5)
        result["acquire_p99_ms"] = pct(latencies, 0.99)
        result["go_now_p99_ms"] = pct(go_now, 0.99)
        result["go_now_count"] = len(go_now)
        result["lag_p99_ms"] = pct(sorted(lags), 0.99)
        # The raw series, so the driver can take the window where every worker runs.
        result["rtt_series"] = [(t - skew, took) for t, took in series]
        result["lag_series"] = list(zip(lag_times, lags, strict=True))
        if os.environ.get("SLOTKIT_BENCH_DUMP"):
            Path(os.environ["SLOTKIT_BENCH_DUMP"], f"{worker}.json").write_text(
                json.dumps({"lags": list(zip(lag_times, lags, strict=True)), "rtt": series})
            )
        result["skew"] = skew
        result["dispatched"] = dispatched
        listener = getattr(getattr(downloader, "shared", None), "backend", None)
        task = getattr(listener, "_listener", None)
        if task is not None:
            result["listener"] = (
                "running"
                if not task.done()
                else "cancelled"
                if task.cancelled()
                else repr(task.exception())
            )
        for key in ("fell_back_at", "resynced_at", "hold_event_at"):
            if result.get(key) is not None:
                result[key] -= skew

    dispatched: dict[str, float] = {}

    def start_probe() -> None:
        lag_probe.start(0.05, now=False)
        # When each request leaves slotkit for the network (to tell a late
        # arrival from a late decision).
        handlers = crawler.engine.downloader.handlers
        download = handlers.download_request_async

        async def stamped(request: Any, *args: Any, **kwargs: Any) -> Any:
            dispatched[request.url.split("/", 3)[-1]] = time.time()
            return await download(request, *args, **kwargs)

        handlers.download_request_async = stamped  # type: ignore[method-assign]

    crawler.signals.connect(start_probe, signal=signals.engine_started)
    crawler.signals.connect(closed, signal=signals.spider_closed)
    process.crawl(crawler)
    process.start()
    print(RESULT + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- the driver


def run(n: int, scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    recorder = Recorder()
    server = ThreadingHTTPServer(("127.0.0.1", 0), recorder.handler())
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    redis = Redis()
    hosts = ["127.0.0.1", "localhost"]
    # A reservation holds its concurrency lease from the moment it is granted, and
    # each worker keeps one reservation per scope: below 2N the concurrency, not
    # the delay, would bind.
    scope: dict[str, Any] = {"delay": args.delay, "concurrency": max(4, 2 * n)}
    duration = args.duration
    # Enough to keep every worker busy for the whole run, not more: Scrapy reads
    # start requests eagerly, and a huge start() stalls the reactor.
    requests = int(duration * len(hosts) / max(args.delay, 0.01) / n * 1.5) + 50
    settings: dict[str, Any] = {"CLOSESPIDER_TIMEOUT": duration}
    if scenario == "conc":
        hosts = ["127.0.0.1"]
        scope = {"delay": 0.0, "concurrency": 2}
        recorder.limit = {"127.0.0.1": 2}
        recorder.latency = 0.05
    if scenario == "retry":
        recorder.retry_after = 3.0
        settings["CLOSESPIDER_TIMEOUT"] = duration + 8
    if scenario in ("kill", "freeze"):
        # A fixed number of requests, no time limit: every one must get its response.
        requests = int(duration * len(hosts) / args.delay / n)
        settings = {}
    shared = scenario != "baseline"
    downloader = "slotkit.shared.SharedDownloader" if shared else "slotkit.Downloader"
    if shared:
        settings.update({"THROTTLING_REDIS_URL": redis.url, "THROTTLING_REDIS_NAMESPACE": "bench"})
        redis.log_every_command()
    settings.update(extra_settings(args.setting))
    procs = []
    started = time.time()
    machine = MachineLoad()
    for i in range(n):
        spec = {
            "worker": f"w{i}",
            "hosts": hosts,
            "port": port,
            "requests": requests,
            "downloader": downloader,
            "scope": scope,
            "settings": settings,
        }
        skew = "2.0" if scenario == "skew" and i == 0 else "0"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.shared_workers", "--child", json.dumps(spec)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT), SKEW_ENV: skew},
            )
        )
    if scenario == "retry":
        # The 429 once every worker crawls (and listens for the hold), a second
        # in: with 8 workers on 2 CPUs the last one starts ~8 s after the first.
        def arm() -> None:
            deadline = started + 60.0
            while len({w for _, _, w, _ in list(recorder.arrivals)}) < n:
                if time.time() > deadline:
                    break
                time.sleep(0.05)
            recorder.retry_at = time.time() + 1.0

        threading.Thread(target=arm, daemon=True).start()
    outage: dict[str, float] = {}
    if scenario in ("kill", "freeze"):
        # Break the store once every worker is crawling, two seconds in; bring
        # it back (restarted empty, or thawed) three seconds later.
        while len({w for _, _, w, _ in list(recorder.arrivals)}) < n:
            time.sleep(0.05)
        time.sleep(2.0)
        outage["down"] = redis.kill() if scenario == "kill" else redis.freeze()
        time.sleep(3.0)
        if scenario == "kill":
            redis.start()
            outage["up"] = time.time()
        else:
            outage["up"] = redis.thaw()
    load_start = [round(x, 2) for x in os.getloadavg()]
    outputs: list[tuple[str, str, float]] = [("", "", 0.0)] * len(procs)

    def reap(index: int, proc: subprocess.Popen[str]) -> None:
        try:
            out, err = proc.communicate(timeout=duration * 6 + 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err = "HUNG (killed by the driver)\n" + err
        outputs[index] = (out, err, time.time())

    reapers = [threading.Thread(target=reap, args=(i, p)) for i, p in enumerate(procs)]
    for reaper in reapers:
        reaper.start()
    for reaper in reapers:
        reaper.join()
    workers: list[dict[str, Any]] = []
    exits: list[float] = []
    for out, err, exited in outputs:
        exits.append(exited)
        line = next((x for x in out.splitlines() if x.startswith(RESULT)), None)
        if line is None:
            workers.append({"error": err[-2000:]})
        else:
            workers.append(json.loads(line[len(RESULT) :]))
    # Process exit after the spider closed.
    for worker, exited in zip(workers, exits, strict=True):
        if "closed_at" in worker:
            worker["exit_after_close_s"] = round(exited - worker["closed_at"], 2)
    if scenario == "retry":
        # When the hold reached the store (its end minus Retry-After, on Redis's clock,
        # which is this machine's): the delay from the 429 to there is propagation.
        import redis as redis_py

        client = redis_py.Redis.from_url(redis.url, decode_responses=True)
        for host in hosts:
            hold = client.hget(f"{{bench}}:s:{host}", "hold")
            if hold and float(hold) > 0 and recorder.retry_after is not None:
                outage["hold_stored"] = float(hold) - recorder.retry_after
        client.close()
    # The server's own time per script call (the restarted store of "kill" logs nothing).
    store = redis.script_times() if shared and scenario != "kill" else []
    server.shutdown()
    redis.close()
    machine.stop()
    result = analyse(n, scenario, args, recorder, workers, hosts, requests, outage, store, machine)
    result["loadavg_1m_start_end"] = [load_start[0], round(os.getloadavg()[0], 2)]
    return result


def extra_settings(pairs: list[str]) -> dict[str, Any]:
    """``-s KEY=VALUE`` options as settings (VALUE parsed as JSON when it can be)."""
    settings: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            settings[key] = value
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--workers", default="4,8")
    parser.add_argument("--scenarios", default="rate,baseline,skew,conc,retry,kill,freeze")
    parser.add_argument("--out", default="shared_workers.json")
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument(
        "-s",
        "--setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Scrapy setting for every worker (VALUE as JSON when it parses)",
    )
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    results = []
    for n in [int(x) for x in args.workers.split(",")]:
        for scenario in args.scenarios.split(","):
            result = run(n, scenario, args)
            results.append(result)
            print(json.dumps(result), flush=True)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
