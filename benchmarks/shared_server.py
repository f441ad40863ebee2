"""The pieces of the shared-throttling benchmarks that are not a crawl.

:class:`Recorder` is the local HTTP server every worker sends to: it records
each arrival (time, host, worker, path), counts requests in progress per host
against a limit, and can answer one request with ``429`` + ``Retry-After``.
:class:`Redis` is a throwaway ``redis-server`` on 127.0.0.1 that a benchmark
can kill, restart on the same port, freeze (SIGSTOP) and thaw.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from slotkit.shared.redis_process import free_port, start_redis

__all__ = ["MachineLoad", "Recorder", "Redis", "free_port"]

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
                finally:
                    # Done before the response leaves: a worker can only free its
                    # slot (and another start) after reading it, so a count taken
                    # after the write would see that next request "overlap".
                    with recorder.lock:
                        recorder.in_progress[host] -= 1
                body = b"<html><body>ok</body></html>"
                self.send_response(status)
                for key, value in extra.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


# --------------------------------------------------------------------------- the machine


class MachineLoad:
    """How busy the machine was in a time window (Linux; elsewhere nothing is reported).

    A thread samples ``/proc/stat`` and ``/proc/pressure/cpu`` every 0.25 s
    until :meth:`stop`. ``steal_pct`` is CPU time the hypervisor gave to
    others while this VM wanted it: on a shared host it stalls any process
    for milliseconds at a time, which no client can hide from a p99.
    ``cpu_pressure_pct`` is the share of time some runnable task waited for
    a CPU (PSI "some"); ``busy_pct`` the share of CPU time not idle.
    """

    def __init__(self, every: float = 0.25) -> None:
        self._samples: list[tuple[float, list[int], float]] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while True:
            try:
                stat = Path("/proc/stat").read_text().split("\n")[0]
                pressure = Path("/proc/pressure/cpu").read_text().split("\n")[0]
                ticks = [int(x) for x in stat.split()[1:9]]
                waited_us = float(pressure.rsplit("total=", 1)[1])
            except (OSError, ValueError, IndexError):
                return  # not Linux, or no PSI: report nothing
            self._samples.append((time.time(), ticks, waited_us))
            if self._stopped.wait(every):
                return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def between(self, begin: float, end: float) -> dict[str, float]:
        inside = [s for s in self._samples if begin <= s[0] <= end]
        if len(inside) < 2:
            return {}
        (t0, first, waited0), (t1, last, waited1) = inside[0], inside[-1]
        ticks = [b - a for a, b in zip(first, last, strict=True)]
        total = sum(ticks) or 1  # user nice system idle iowait irq softirq steal
        return {
            "busy_pct": round(100 * (total - ticks[3] - ticks[4]) / total, 1),
            "steal_pct": round(100 * ticks[7] / total, 2),
            "cpu_pressure_pct": round(100 * (waited1 - waited0) / 1e6 / (t1 - t0), 1),
        }


# --------------------------------------------------------------------------- redis-server


class Redis:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="slotkit-redis-")
        self.start()

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server not found: apt-get install -y redis-server")
        try:
            self.proc = start_redis(binary, self.port, self.dir)
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> float:
        killed = time.time()
        self.proc.kill()
        self.proc.wait()
        return killed

    def freeze(self) -> float:
        self.proc.send_signal(signal.SIGSTOP)
        return time.time()

    def thaw(self) -> float:
        self.proc.send_signal(signal.SIGCONT)
        return time.time()

    def log_every_command(self) -> None:
        """Have the server time every command it runs (its SLOWLOG, threshold 0)."""
        import redis as redis_py

        with redis_py.Redis.from_url(self.url) as client:
            client.config_set("slowlog-log-slower-than", 0)
            client.config_set("slowlog-max-len", 1_000_000)

    def script_times(self) -> list[tuple[int, float, str]]:
        """Each script call the server logged: (unix second, seconds it ran, script function).

        The server's own measure of a call: from reading the command to having
        the reply ready, without the network or either side's scheduling.
        """
        import redis as redis_py

        with redis_py.Redis.from_url(self.url, decode_responses=True) as client:
            entries = client.slowlog_get(-1)
        calls = []
        for entry in entries:
            command = entry["command"]
            if isinstance(command, bytes):  # redis-py leaves it undecoded on RESP3
                command = command.decode("utf-8", "replace")
            words = command.split()
            if len(words) > 3 and words[0].upper() == "EVALSHA":
                function = words[3 + int(words[2])] if len(words) > 3 + int(words[2]) else "?"
                calls.append((int(entry["start_time"]), entry["duration"] / 1e6, function))
        return calls

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
