"""A throwaway ``redis-server`` on loopback, for slotkit's tests and benchmarks.

One place that knows how to start it: bound to 127.0.0.1, persistence off,
in a directory of the caller's, and ready when it says so. Readiness is read
from the server's own log line, so nothing polls the port on a timer.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["READY_LINE", "free_port", "start_redis"]

#: What redis-server (6 and 7) logs once it accepts connections.
READY_LINE = b"Ready to accept connections"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(
    binary: str,
    port: int,
    directory: str | Path,
    timeout: float = 10.0,
    extra: Sequence[str] = (),
    wrapper: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start ``redis-server`` on ``127.0.0.1:port``; return once it accepts connections.

    *extra* options come last and win (``--port 0 --tls-port N`` serves TLS only).
    *wrapper* goes before the binary (``valgrind --tool=callgrind`` for the
    cost benchmark; give it a longer *timeout*).
    Raises :class:`RuntimeError` (after killing it) if it exits or is not
    ready within *timeout* seconds.
    """
    process = subprocess.Popen(
        [
            *wrapper,
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
            "--loglevel",
            "notice",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    said_ready = threading.Event()
    log_read = threading.Event()  # set when the server said ready or exited

    def read_log() -> None:
        # Keeps draining after the ready line, so a chatty server never
        # blocks on a full pipe; at EOF (the server exited) it wakes the waiter.
        assert process.stdout is not None
        for line in process.stdout:
            if READY_LINE in line:
                said_ready.set()
                log_read.set()
        log_read.set()

    threading.Thread(target=read_log, name=f"redis-log-{port}", daemon=True).start()
    log_read.wait(timeout)
    if not said_ready.is_set():
        process.kill()
        process.wait(timeout=10)
        raise RuntimeError(f"redis-server did not start on 127.0.0.1:{port}")
    return process
