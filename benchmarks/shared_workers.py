"""Shared throttling across processes: N real Scrapy workers, one Redis, one recording server.

Run from the repository root with the dev venv (needs ``redis-server`` on PATH and redis-py)::

    python -m benchmarks.shared_workers                  # N = 4 and 8, every scenario
    python -m benchmarks.shared_workers --workers 4 --scenarios rate,baseline

Scenarios (each in fresh processes, against a fresh ``redis-server`` on 127.0.0.1):

``rate``      two hosts, each configured at ``--delay`` (default 0.05 s → 20 req/s); the
              aggregate per-host rate while every worker runs, each worker's share,
              Redis calls per request and the p99 of one acquire round trip.
``baseline``  the same crawl with ``slotkit.Downloader``, no shared store
              (about N times the rate).
``skew``      ``rate`` with one worker's reactor clock 2 s ahead.
``conc``      one host, shared concurrency 2, no delay, 50 ms responses: the server counts
              how often more than 2 requests of the host were in progress (violations).
``retry``     the server answers one request with 429 + ``Retry-After: 3``; reports the
              quietest gap in arrivals that follows (should be ≥ 3 s, for every worker).
``kill``      ``redis-server`` is killed mid-crawl: every request still gets its response
              (none lost) and each worker falls back within 1 s.

Results go to stdout and ``benchmarks/results/shared_workers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RESULT = "SHARED-RESULT "
ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- the recording server


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrivals: list[tuple[float, str, str, str]] = []  # (time, host, worker, path)
        self.in_progress: dict[str, int] = {}
        self.max_in_progress: dict[str, int] = {}
        self.limit: dict[str, int] = {}
        self.violations = 0
        self.latency = 0.0
        self.retry_after: float | None = None  # send one 429 with this Retry-After
        self.retry_at: float | None = None
        self.retry_sent_at: float | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                now = time.time()
                host = (self.headers.get("Host") or "").split(":")[0]
                worker = self.headers.get("X-Worker", "?")
                status, extra = 200, {}
                with recorder.lock:
                    recorder.arrivals.append((now, host, worker, self.path))
                    active = recorder.in_progress.get(host, 0) + 1
                    recorder.in_progress[host] = active
                    peak = max(recorder.max_in_progress.get(host, 0), active)
                    recorder.max_in_progress[host] = peak
                    if active > recorder.limit.get(host, 10**9):
                        recorder.violations += 1
                    if (
                        recorder.retry_after is not None
                        and recorder.retry_sent_at is None
                        and recorder.retry_at is not None
                        and now >= recorder.retry_at
                    ):
                        recorder.retry_sent_at = now
                        status, extra = 429, {"Retry-After": f"{recorder.retry_after:g}"}
                try:
                    if recorder.latency:
                        time.sleep(recorder.latency)
                    body = b"<html><body>ok</body></html>"
                    self.send_response(status)
                    for key, value in extra.items():
                        self.send_header(key, value)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                finally:
                    with recorder.lock:
                        recorder.in_progress[host] -= 1

        return Handler


# --------------------------------------------------------------------------- redis-server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Redis:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server not found: apt-get install -y redis-server")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="slotkit-redis-")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return
            except OSError:
                time.sleep(0.02)
        raise SystemExit("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> float:
        killed = time.time()
        self.proc.kill()
        self.proc.wait()
        return killed

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


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
        **spec.get("settings", {}),
    }
    process = AsyncCrawlerProcess(settings)
    crawler = process.create_crawler(WorkerSpider)
    result: dict[str, Any] = {"worker": worker}

    def skew() -> None:
        if spec.get("skew"):
            from twisted.internet import reactor

            original = reactor.seconds
            reactor.seconds = lambda: original() + spec["skew"]  # type: ignore[method-assign]

    def closed(spider: Any, reason: str) -> None:
        downloader = crawler.engine.downloader
        summary = getattr(downloader, "shared_summary", dict)()
        latencies = sorted(summary.pop("latencies", []))
        result.update(summary)
        result["reason"] = reason
        result["responses"] = crawler.stats.get_value("bench/responses", 0)
        result["p99_ms"] = latencies[int(0.99 * (len(latencies) - 1))] * 1000 if latencies else None
        result["p50_ms"] = latencies[len(latencies) // 2] * 1000 if latencies else None
        result["skew"] = spec.get("skew", 0.0)
        if result.get("fell_back_at") is not None:
            result["fell_back_at"] -= spec.get("skew", 0.0)

    crawler.signals.connect(skew, signal=signals.engine_started)
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
    scope: dict[str, Any] = {"delay": args.delay, "concurrency": 4}
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
        settings["CLOSESPIDER_TIMEOUT"] = duration + 4
    if scenario == "kill":
        requests = int(args.delay and (duration * 2 / args.delay / n)) or 100
        settings = {}
    shared = scenario != "baseline"
    downloader = "slotkit.shared.SharedDownloader" if shared else "slotkit.Downloader"
    if shared:
        settings.update({"THROTTLING_REDIS_URL": redis.url, "THROTTLING_REDIS_NAMESPACE": "bench"})
    procs = []
    started = time.time()
    for i in range(n):
        spec = {
            "worker": f"w{i}",
            "hosts": hosts,
            "port": port,
            "requests": requests,
            "downloader": downloader,
            "scope": scope,
            "settings": settings,
            "skew": 2.0 if scenario == "skew" and i == 0 else 0.0,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.shared_workers", "--child", json.dumps(spec)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        )
    if scenario == "retry":
        recorder.retry_at = started + 4.0
    killed_at = None
    if scenario == "kill":
        # Kill it once every worker is crawling, two seconds in.
        while len({w for _, _, w, _ in list(recorder.arrivals)}) < n:
            time.sleep(0.05)
        time.sleep(2.0)
        killed_at = redis.kill()
    workers = []
    for proc in procs:
        out, err = proc.communicate(timeout=duration * 6 + 120)
        line = next((x for x in out.splitlines() if x.startswith(RESULT)), None)
        if line is None:
            workers.append({"error": err[-2000:]})
        else:
            workers.append(json.loads(line[len(RESULT) :]))
    server.shutdown()
    redis.close()
    return analyse(n, scenario, args, recorder, workers, hosts, requests, killed_at)


def analyse(n, scenario, args, recorder, workers, hosts, requests, killed_at) -> dict[str, Any]:
    arrivals = recorder.arrivals
    by_worker: dict[str, list[float]] = {}
    for t, _, w, _ in arrivals:
        by_worker.setdefault(w, []).append(t)
    # The window in which every worker was crawling.
    begin = max(min(ts) for ts in by_worker.values()) + 0.5
    end = min(max(ts) for ts in by_worker.values()) - 0.5
    result: dict[str, Any] = {"n": n, "scenario": scenario, "window_s": round(end - begin, 2)}
    if scenario in ("rate", "baseline", "skew"):
        target = 1.0 / args.delay
        rates = {}
        for host in hosts:
            count = sum(1 for t, h, _, _ in arrivals if h == host and begin <= t < end)
            rates[host] = count / (end - begin)
        result["target_per_host"] = target
        result["rate_per_host"] = {h: round(r, 2) for h, r in rates.items()}
        result["rate_error_pct"] = {h: round((r / target - 1) * 100, 1) for h, r in rates.items()}
        shares = {}
        for w, ts in by_worker.items():
            shares[w] = sum(1 for t in ts if begin <= t < end)
        mean = sum(shares.values()) / len(shares)
        result["share_error_pct"] = round(max(abs(s / mean - 1) for s in shares.values()) * 100, 1)
    if scenario == "conc":
        result["max_in_progress"] = recorder.max_in_progress
        result["violations"] = recorder.violations
    if scenario == "retry" and recorder.retry_sent_at is not None:
        t429 = recorder.retry_sent_at
        host_429 = next(h for t, h, _, _ in arrivals if t == t429)
        after = sorted(t for t, h, _, _ in arrivals if h == host_429 and t > t429)
        result["retry_after_429_first_arrival_s"] = round(after[0] - t429, 3) if after else None
    if scenario == "kill":
        result["killed_at_offset"] = round(killed_at - begin, 2) if killed_at else None
        result["requests_per_worker"] = requests
        result["responses"] = [w.get("responses") for w in workers]
        result["lost"] = sum(requests - (w.get("responses") or 0) for w in workers)
        result["fallback_after_kill_s"] = [
            None if w.get("fell_back_at") is None else round(w["fell_back_at"] - killed_at, 3)
            for w in workers
        ]
    if scenario != "baseline":
        calls = sum(w.get("calls", 0) for w in workers)
        responses = sum(1 for _ in arrivals)
        result["redis_calls_per_request"] = round(calls / max(1, responses), 3)
        p99s = [w.get("p99_ms") for w in workers if w.get("p99_ms") is not None]
        result["acquire_p99_ms_worst_worker"] = round(max(p99s), 3) if p99s else None
        result["fallbacks"] = sum(w.get("fallbacks", 0) for w in workers)
    result["errors"] = [w["error"] for w in workers if "error" in w]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--workers", default="4,8")
    parser.add_argument("--scenarios", default="rate,baseline,skew,conc,retry,kill")
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--duration", type=float, default=10.0)
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
    (out / "shared_workers.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
