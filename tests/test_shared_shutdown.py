"""Crawls with the shared backend end (the process exits) whatever Redis does.

Each case runs a real Scrapy crawl in a child process against a real
``redis-server`` on 127.0.0.1. The child's own little HTTP server breaks
Redis (kills or freezes it with SIGSTOP) when the tenth request arrives, so
store calls are in flight at that moment. Every request must still get its
response, through the local fallback, and the process must exit.

The regression this guards: a store call cancelled by its timeout used to
end in ``asyncio.CancelledError``, which escaped every ``except Exception``
up to Scrapy's scraper; the engine then waited forever for the request.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_shared_support import redis_server  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = 40
BREAK_AT = 10
MARK = "SHUTDOWN-RESULT "


def child(spec: dict) -> None:
    """The crawl (run as ``python tests/test_shared_shutdown.py SPEC``)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from scrapy import Request, Spider
    from scrapy.crawler import CrawlerProcess

    arrived = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            arrived.append(self.path)
            if len(arrived) == BREAK_AT and spec["action"] != "none":
                os.kill(spec["redis_pid"], spec["signal"])
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    result: dict = {"responses": 0}
    crawlers: list = []

    class ShutdownSpider(Spider):
        name = "shutdown"

        async def start(self):
            for i in range(REQUESTS):
                yield Request(f"http://127.0.0.1:{port}/{i}", dont_filter=True)

        def parse(self, response):
            result["responses"] += 1

        def closed(self, reason):
            result["fallbacks"] = self.crawler.stats.get_value("throttling/shared/fallbacks", 0)
            result["downloader"] = type(self.crawler.engine.downloader).__name__
            result["reason"] = reason
            crawlers.append(self.crawler)

    process = CrawlerProcess(
        {
            "DOWNLOADER": "slotkit.Downloader",  # THROTTLING_REDIS_URL makes it the shared one
            "THROTTLING_REDIS_URL": spec["url"],
            "THROTTLING_SCOPES": {"127.0.0.1": {"delay": 0.02, "concurrency": 4}},
            "RANDOMIZE_DOWNLOAD_DELAY": False,
            "TWISTED_REACTOR": spec["reactor"],
            "LOG_LEVEL": "WARNING",
            "TELNETCONSOLE_ENABLED": False,
            "RETRY_ENABLED": False,
        }
    )
    process.crawl(ShutdownSpider)
    process.start()
    # Set when the downloader closed, after the spider did.
    stats = crawlers[0].stats.get_stats() if crawlers else {}
    result["acquire_ms"] = [stats.get(f"throttling/shared/acquire_{q}_ms") for q in ("p50", "p99")]
    print(MARK + json.dumps(result), flush=True)


ASYNCIO = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
EPOLL = "twisted.internet.epollreactor.EPollReactor"
CASES = {
    # name: (reactor, action)
    "up": (ASYNCIO, "none"),
    "killed": (ASYNCIO, "kill"),
    "frozen": (ASYNCIO, "freeze"),
    "frozen-threaded": (EPOLL, "freeze"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_crawl_ends_whatever_redis_does(redis_server, case):  # noqa: F811
    reactor, action = CASES[case]
    assert redis_server.process is not None
    spec = {
        "url": redis_server.url,
        "reactor": reactor,
        "action": action,
        "redis_pid": redis_server.process.pid,
        "signal": int(signal.SIGKILL if action == "kill" else signal.SIGSTOP),
    }
    proc = subprocess.Popen(
        [sys.executable, __file__, json.dumps(spec)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A liveness bound, not a timing assertion: the crawl takes a few seconds.
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the crawl did not end ({case}); stderr tail:\n{err[-3000:]}")
    finally:
        if action == "kill":
            redis_server.process.wait(timeout=10)
            redis_server.process = None
    assert proc.returncode == 0, err[-3000:]
    line = next(x for x in out.splitlines() if x.startswith(MARK))
    result = json.loads(line[len(MARK) :])
    assert result["downloader"] == "SharedDownloader"
    assert result["reason"] == "finished"
    if action == "none":
        p50, p99 = result["acquire_ms"]
        assert 0 < p50 <= p99, "the store's round trips are in the crawl's stats"
    # Scrapy deprecates signal handlers that return Deferreds; ours are coroutines.
    assert "returned a Deferred" not in err
    assert result["responses"] == REQUESTS, "no request lost"
    if action != "none":
        assert result["fallbacks"] >= 1


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
