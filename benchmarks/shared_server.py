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
from typing import Any

from slotkit.shared.redis_process import free_port, start_redis

__all__ = ["Recorder", "Redis", "free_port"]

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

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
