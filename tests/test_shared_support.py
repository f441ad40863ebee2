"""Helpers for the shared-throttling tests: a throwaway ``redis-server`` on loopback.

No test lives here. :func:`redis_server` starts ``redis-server`` on a free
port of 127.0.0.1 (:func:`slotkit.shared.redis_process.start_redis`) in a
temporary directory, and kills it afterwards. If the binary is missing, it
tries the Debian package once (as root); the tests skip, saying why, only
when that is impossible.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from slotkit.shared.redis_process import free_port, start_redis

_INSTALL_TRIED: list[str] = []


def _find_redis_server() -> str | None:
    found = shutil.which("redis-server")
    if found or _INSTALL_TRIED:
        return found
    _INSTALL_TRIED.append("yes")
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([apt, "update", "-qq"], env=env, capture_output=True, timeout=600)
    subprocess.run(
        [apt, "install", "-y", "-qq", "redis-server"], env=env, capture_output=True, timeout=600
    )
    return shutil.which("redis-server")


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 that a test can kill, freeze and restart."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = start_redis(self.binary, self.port, self.directory)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def freeze(self) -> None:
        assert self.process is not None
        self.process.send_signal(19)  # SIGSTOP

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(18)  # SIGCONT


def redis_binary() -> str:
    """The ``redis-server`` path, or skip the test with the reason."""
    binary = _find_redis_server()
    if binary is None:
        pytest.skip(
            "redis-server not found and could not be installed "
            "(apt-get install redis-server needs root and the Debian archive)"
        )
    try:
        import redis  # noqa: F401
    except ImportError:
        pytest.skip("redis-py is not installed: pip install 'slotkit[redis]'")
    return binary


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on loopback for one test."""
    server = RedisServer(redis_binary(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None:
            server.thaw()
        server.kill()
