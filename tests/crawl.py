"""Run real Scrapy crawls from the tests.

In-process (the test's reactor, normally AsyncioSelectorReactor under
``pytest --reactor=asyncio``)::

    @pytest_twisted.ensureDeferred
    async def test_x(mock_site):  # a started MockSite (see test_server_smoke's fixture)
        result = await run_crawl(
            ListSpider,
            {"DOWNLOADER": "slotkit.Downloader"},
            urls=[mock_site.url("127.0.0.2", "/page/1")],
        )
        assert result.statuses == {200: 1}
        result.assert_no_unhandled_errors()

``run_crawl`` drives :class:`scrapy.crawler.CrawlerRunner` (Deferred based), which
works with whatever reactor is installed; ``AsyncCrawlerRunner`` returns an
``asyncio.Task`` and requires the asyncio reactor, so it is not used here.

In a subprocess with another reactor (a reactor cannot be swapped inside one
process)::

    data = run_crawl_subprocess(
        reactor="twisted.internet.epollreactor.EPollReactor",
        settings={"DOWNLOADER": "slotkit.Downloader"},
        spider_kwargs={"urls": ["http://127.0.0.1:{port}/page/1"]},
    )

The child starts its own :class:`~tests.server.MockSite`; every ``{port}`` in
string values of ``settings``/``spider_kwargs`` is replaced by its port.

This module must not import ``twisted.internet.reactor`` at import time.
"""

from __future__ import annotations

import datetime
import functools
import gc
import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from scrapy import Request, Spider, signals
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from scrapy.crawler import Crawler, CrawlerRunner
from scrapy.http import Response
from scrapy.spidermiddlewares.httperror import HttpError
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IResolverSimple
from twisted.logger import ILogObserver, LogEvent, formatEventAsClassicLogText
from twisted.python.failure import Failure
from zope.interface import implementer

from tests.server import DEFAULT_HOSTS, MockSite

REPO_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_SETTINGS: dict[str, Any] = {
    # Scrapy's own HTTP handler, noting when each request reaches it.
    "DOWNLOAD_HANDLERS": {"http": "tests.crawl.DispatchRecordingHandler"},
    "TELNETCONSOLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
    "LOG_LEVEL": "DEBUG",
    "MEMUSAGE_ENABLED": False,
    "DOWNLOAD_TIMEOUT": 10,
    # Scrapy 2.19's remote-control extension listens and writes a job file in $HOME.
    "REMOTE_CONTROL_ENABLED": False,
}
"""Applied under the caller's settings. DOWNLOADER is deliberately absent."""

UNHANDLED_PATTERNS: tuple[str, ...] = (
    "Unhandled error in Deferred",
    "Unhandled Error",
    "exception was never retrieved",
    "Exception ignored in",
    "Traceback (most recent call last)",
)
"""Substrings that mark an error nobody handled (see CrawlResult.unhandled_errors)."""

DispatchLog = list[tuple[str, str, float]]
"""(host name, path, reactor time) of each request the download handler got."""


class DispatchRecordingHandler(HTTP11DownloadHandler):
    """Scrapy's HTTP/1.1 handler that notes when each request reaches it.

    The handler is called when the downloader lets a request go, in the same
    reactor turn, so these times are the downloader's dispatch times. Times
    seen by the server are later by a varying amount (the test server shares
    the crawl's reactor and waits for it on a busy machine), which made gap
    assertions measured there flaky.
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._dispatches: DispatchLog = getattr(crawler, "_test_dispatches", [])

    async def download_request(self, request: Request) -> Response:
        from twisted.internet import reactor

        url = urlparse_cached(request)
        self._dispatches.append((url.hostname or "", url.path, cast(Any, reactor).seconds()))
        return await super().download_request(request)


def _now() -> float:
    from twisted.internet import reactor

    return cast(Any, reactor).seconds()  # type: ignore[no-any-return]


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


@dataclass
class ResponseInfo:
    url: str
    status: int
    request_url: str
    received: float
    """reactor.seconds() when the spider saw it."""
    via: str
    """"callback" or "errback" (non-2xx filtered by HttpErrorMiddleware)."""
    download_slot: str | None = None
    download_latency: float | None = None
    retry_times: int = 0
    tag: Any = None
    """``meta["tag"]`` of the request, if the test set one."""


@dataclass
class ErrorInfo:
    url: str
    type: str
    """Exception class name, e.g. "HttpError", "TimeoutError", "ResponseFailed"."""
    message: str
    received: float
    status: int | None = None
    tag: Any = None


@dataclass
class CrawlResult:
    stats: dict[str, Any]
    items: list[Any]
    responses: list[ResponseInfo]
    errors: list[ErrorInfo]
    log_records: list[logging.LogRecord]
    """Python logging records emitted during the crawl."""
    twisted_log: list[str]
    """Twisted log events (formatted), e.g. "Unhandled error in Deferred"."""
    started: float
    finished: float
    crawler: Crawler | None = field(default=None, repr=False)
    spider: Spider | None = field(default=None, repr=False)
    dispatches: DispatchLog = field(default_factory=list, repr=False)
    """Filled when the crawl used :class:`DispatchRecordingHandler` (the default)."""

    def dispatch_times(self, host: str, path_prefix: str = "") -> list[float]:
        """When the downloader let each request to ``host`` go (reactor seconds, sorted)."""
        return sorted(t for h, p, t in self.dispatches if h == host and p.startswith(path_prefix))

    def dispatch_gaps(self, host: str, path_prefix: str = "") -> list[float]:
        """Seconds between consecutive dispatches to ``host``."""
        times = self.dispatch_times(host, path_prefix)
        assert times, f"no dispatch to {host} was recorded (DOWNLOAD_HANDLERS overridden?)"
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def finish_reason(self) -> str | None:
        return cast(str | None, self.stats.get("finish_reason"))

    @property
    def duration(self) -> float:
        return self.finished - self.started

    @property
    def statuses(self) -> Counter[int]:
        return Counter(r.status for r in self.responses)

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.responses]

    @property
    def log_lines(self) -> list[str]:
        """Formatted log lines (Python logging + Twisted), tracebacks included."""
        fmt = logging.Formatter("%(levelname)s %(name)s: %(message)s")
        return [fmt.format(r) for r in self.log_records] + list(self.twisted_log)

    @property
    def log_text(self) -> str:
        return "\n".join(self.log_lines)

    def unhandled_errors(self, patterns: Iterable[str] = UNHANDLED_PATTERNS) -> list[str]:
        pats = tuple(patterns)
        return [line for line in self.log_lines if any(p in line for p in pats)]

    def assert_no_unhandled_errors(self) -> None:
        bad = self.unhandled_errors()
        assert not bad, "unhandled errors in the crawl log:\n" + "\n---\n".join(bad)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (no crawler/spider)."""
        return {
            "stats": _jsonable(self.stats),
            "items": _jsonable(self.items),
            "responses": [asdict(r) for r in self.responses],
            "errors": [asdict(e) for e in self.errors],
            "log": self.log_lines,
            "unhandled": self.unhandled_errors(),
            "started": self.started,
            "finished": self.finished,
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)


# --------------------------------------------------------------------------
# Spider
# --------------------------------------------------------------------------

UrlSpec = str | Request | Mapping[str, Any]
"""A start URL: a string, a ready Request (callback/errback added if missing),
or a mapping with ``url`` and optional ``meta``, ``priority``, ``dont_filter``,
``headers``."""


class ListSpider(Spider):
    """Requests a given list of URLs and records what comes back.

    ``meta``/``priority`` apply to every start request (and followed links);
    per-URL values in a mapping spec override/extend them. Links are followed
    only with ``follow_links=True`` (deduplicated by Scrapy's dupefilter).
    Yields one item per successful response: ``{"url", "status"}``.
    """

    name = "list"

    def __init__(
        self,
        urls: Sequence[UrlSpec] = (),
        meta: Mapping[str, Any] | None = None,
        priority: int = 0,
        follow_links: bool = False,
        dont_filter: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.urls = list(urls)
        self.base_meta = dict(meta or {})
        self.base_priority = priority
        self.follow_links = follow_links
        self.dont_filter = dont_filter
        self.responses: list[ResponseInfo] = []
        self.errors: list[ErrorInfo] = []

    def make_request(self, spec: UrlSpec) -> Request:
        if isinstance(spec, Request):
            return spec.replace(
                callback=spec.callback or self.parse,
                errback=spec.errback or self.on_error,
            )
        if isinstance(spec, str):
            spec = {"url": spec}
        meta = {**self.base_meta, **dict(spec.get("meta") or {})}
        return Request(
            spec["url"],
            callback=self.parse,
            errback=self.on_error,
            meta=meta,
            priority=spec.get("priority", self.base_priority),
            dont_filter=spec.get("dont_filter", self.dont_filter),
            headers=spec.get("headers"),
        )

    async def start(self) -> Any:
        for spec in self.urls:
            yield self.make_request(spec)

    def _info(self, response: Response, via: str) -> ResponseInfo:
        meta = response.meta
        return ResponseInfo(
            url=response.url,
            status=response.status,
            request_url=response.request.url if response.request else response.url,
            received=_now(),
            via=via,
            download_slot=meta.get("download_slot"),
            download_latency=meta.get("download_latency"),
            retry_times=meta.get("retry_times", 0),
            tag=meta.get("tag"),
        )

    def parse(self, response: Response, **kwargs: Any) -> Any:
        self.responses.append(self._info(response, "callback"))
        yield {"url": response.url, "status": response.status}
        if self.follow_links and hasattr(response, "css"):
            for href in response.css("a::attr(href)").getall():
                yield response.follow(
                    href,
                    callback=self.parse,
                    errback=self.on_error,
                    meta=dict(self.base_meta),
                    priority=self.base_priority,
                )

    def on_error(self, failure: Failure) -> None:
        request = cast(Request | None, getattr(failure, "request", None))
        status = None
        if failure.check(HttpError):
            response = cast(HttpError, failure.value).response
            status = response.status
            self.responses.append(self._info(response, "errback"))
        self.errors.append(
            ErrorInfo(
                url=request.url if request is not None else "",
                type=type(failure.value).__name__,
                message=str(failure.value),
                received=_now(),
                status=status,
                tag=request.meta.get("tag") if request is not None else None,
            )
        )


# --------------------------------------------------------------------------
# Log capture
# --------------------------------------------------------------------------


class _ListHandler(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@implementer(ILogObserver)
class _TwistedCapture:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, event: LogEvent) -> None:
        text = formatEventAsClassicLogText(event)
        if text:
            self.lines.append(text.rstrip("\n"))


# --------------------------------------------------------------------------
# Name resolution for fake host names
# --------------------------------------------------------------------------


@implementer(IResolverSimple)
class _MappingResolver:
    """IResolverSimple answering from a mapping, delegating other names."""

    def __init__(self, mapping: Mapping[str, str], fallback: Any) -> None:
        self.mapping = {k.lower(): v for k, v in mapping.items()}
        self.fallback = fallback

    def getHostByName(self, name: str, timeout: Sequence[int] = ()) -> Deferred[str]:
        ip = self.mapping.get(name.lower())
        if ip is not None:
            return succeed(ip)
        return cast(Deferred[str], self.fallback.getHostByName(name, timeout))


# --------------------------------------------------------------------------
# In-process crawl
# --------------------------------------------------------------------------


async def run_crawl(
    spider_cls: type[Spider],
    settings: Mapping[str, Any] | None = None,
    *,
    crawl_timeout: float = 30.0,
    resolve: Mapping[str, str] | None = None,
    on_crawler: Callable[[Crawler], None] | None = None,
    log_level: int = logging.DEBUG,
    **spider_kwargs: Any,
) -> CrawlResult:
    """Run one real crawl in the current reactor and collect what happened.

    ``settings`` go over :data:`DEFAULT_SETTINGS`. ``resolve`` maps extra host
    names (e.g. ``{"a.example.test": "127.0.0.1"}``) for the duration of the
    crawl (Scrapy's TCP endpoint resolves through ``reactor.resolver``).
    ``on_crawler`` is called with the Crawler before it starts (connect
    signals there). The crawl is stopped after ``crawl_timeout`` seconds.
    Must be awaited from a Twisted-driven coroutine
    (``@pytest_twisted.ensureDeferred``) or wrapped in ``Deferred.fromCoroutine``.
    """
    from twisted.internet import reactor

    r = cast(Any, reactor)
    runner = CrawlerRunner({**DEFAULT_SETTINGS, **dict(settings or {})})
    crawler = runner.create_crawler(spider_cls)
    dispatches: DispatchLog = []
    crawler._test_dispatches = dispatches  # type: ignore[attr-defined]

    items: list[Any] = []

    def item_scraped(item: Any, response: Any, spider: Spider) -> None:
        items.append(item)

    crawler.signals.connect(item_scraped, signals.item_scraped)
    if on_crawler is not None:
        on_crawler(crawler)

    handler = _ListHandler(log_level)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > log_level:
        root.setLevel(log_level)
    twisted_capture = _TwistedCapture()
    from twisted.logger import globalLogPublisher

    # An earlier test's unhandled failures are logged when collected: now,
    # not into this crawl's log.
    gc.collect()
    globalLogPublisher.addObserver(twisted_capture)

    old_resolver, old_name_resolver = r.resolver, r.nameResolver
    if resolve:
        r.installResolver(_MappingResolver(resolve, old_resolver))

    watchdog = r.callLater(crawl_timeout, lambda: runner.stop())
    started = _now()
    try:
        await runner.crawl(crawler, **spider_kwargs)
    finally:
        finished = _now()
        if watchdog.active():
            watchdog.cancel()
        if resolve:
            r.installNameResolver(old_name_resolver)
        # make "Unhandled error in Deferred" (logged on garbage collection) visible
        gc.collect()
        globalLogPublisher.removeObserver(twisted_capture)
        root.removeHandler(handler)
        root.setLevel(old_level)

    spider = cast(ListSpider | None, crawler.spider)
    # the stats collector is built inside crawl(); it keeps its dict after closing
    stats = dict(crawler.stats.get_stats()) if crawler.spider is not None else {}
    return CrawlResult(
        stats=stats,
        items=items,
        responses=list(getattr(spider, "responses", [])),
        errors=list(getattr(spider, "errors", [])),
        log_records=handler.records,
        twisted_log=twisted_capture.lines,
        started=started,
        finished=finished,
        crawler=crawler,
        spider=spider,
        dispatches=dispatches,
    )


# --------------------------------------------------------------------------
# Crawl in a subprocess (other reactors)
# --------------------------------------------------------------------------

EPOLL_REACTOR = "twisted.internet.epollreactor.EPollReactor"
SELECT_REACTOR = "twisted.internet.selectreactor.SelectReactor"
POLL_REACTOR = "twisted.internet.pollreactor.PollReactor"
ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"


def _object_path(obj: type[Any] | str) -> str:
    if isinstance(obj, str):
        return obj
    return f"{obj.__module__}.{obj.__qualname__}"


def _fill_port(value: Any, port: int) -> Any:
    if isinstance(value, str):
        return value.replace("{port}", str(port))
    if isinstance(value, dict):
        return {k: _fill_port(v, port) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_port(v, port) for v in value]
    return value


def _subprocess_command(
    reactor: str,
    spider: type[Spider] | str,
    settings: Mapping[str, Any] | None,
    spider_kwargs: Mapping[str, Any] | None,
    hosts: Sequence[str],
    site_setup: str | Mapping[str, Any] | None,
    crawl_timeout: float,
    workdir: str,
) -> tuple[list[str], dict[str, str], str]:
    config = {
        "reactor": reactor,
        "spider": _object_path(spider),
        "settings": dict(settings or {}),
        "spider_kwargs": dict(spider_kwargs or {}),
        "hosts": list(hosts),
        "site_setup": site_setup if isinstance(site_setup, str | None) else dict(site_setup),
        "crawl_timeout": crawl_timeout,
    }
    config_path = os.path.join(workdir, "config.json")
    out_path = os.path.join(workdir, "result.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    env = dict(os.environ)
    extra = [str(REPO_ROOT), str(REPO_ROOT / "tests")]
    if env.get("PYTHONPATH"):
        extra.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(extra)
    cmd = [sys.executable, "-m", "tests.crawl", config_path, out_path]
    return cmd, env, out_path


def _read_subprocess_result(
    out_path: str, returncode: int, stdout: str, stderr: str
) -> dict[str, Any]:
    if returncode != 0 or not os.path.exists(out_path):
        raise RuntimeError(
            f"crawl subprocess failed (exit {returncode})\n"
            f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        )
    with open(out_path) as f:
        data = cast(dict[str, Any], json.load(f))
    data["stderr"] = stderr
    return data


def run_crawl_subprocess(
    *,
    reactor: str = EPOLL_REACTOR,
    spider: type[Spider] | str = "tests.crawl.ListSpider",
    settings: Mapping[str, Any] | None = None,
    spider_kwargs: Mapping[str, Any] | None = None,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    site_setup: str | Mapping[str, Any] | None = None,
    crawl_timeout: float = 30.0,
    timeout: float = 90.0,
) -> dict[str, Any]:
    """Run a crawl in a fresh interpreter with ``reactor`` installed (blocking).

    The child starts a MockSite on ``hosts`` and prepares it with
    ``site_setup``: either a dict for :meth:`MockSite.configure` (robots,
    behaviours) or a dotted path ``"pkg.mod.func"`` called with the MockSite.
    Then it substitutes ``{port}`` and crawls. ``spider`` is a class or
    dotted path importable with the repo root and ``tests/`` on sys.path.
    ``settings["TWISTED_REACTOR"]`` is forced to ``reactor``.

    Returns a dict: ``reactor`` (class actually running), ``port``,
    ``recorder`` (:meth:`Recorder.to_dict`), ``stderr`` and the keys of
    :meth:`CrawlResult.to_dict` (stats, items, responses, errors, log,
    unhandled, started, finished).
    """
    with tempfile.TemporaryDirectory(prefix="slotkit-crawl-") as workdir:
        cmd, env, out_path = _subprocess_command(
            reactor,
            spider,
            settings,
            spider_kwargs,
            hosts,
            site_setup,
            crawl_timeout,
            workdir,
        )
        proc = subprocess.run(
            cmd,
            env=env,
            cwd=str(REPO_ROOT),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return _read_subprocess_result(out_path, proc.returncode, proc.stdout, proc.stderr)


def run_crawl_subprocess_async(**kwargs: Any) -> Deferred[dict[str, Any]]:
    """:func:`run_crawl_subprocess` in a thread, so the test's reactor keeps
    running (same keyword arguments)."""
    from twisted.internet.threads import deferToThread

    return cast(
        Deferred[dict[str, Any]], deferToThread(functools.partial(run_crawl_subprocess, **kwargs))
    )


async def _child(config: dict[str, Any], out_path: str) -> None:
    from twisted.internet import reactor

    site = MockSite(hosts=config["hosts"])
    await site.start()
    try:
        setup = config.get("site_setup")
        if isinstance(setup, str):
            load_object(setup)(site)
        elif setup:
            site.configure(setup)
        settings = _fill_port(config["settings"], site.port)
        settings["TWISTED_REACTOR"] = config["reactor"]
        spider_kwargs = _fill_port(config["spider_kwargs"], site.port)
        spider_cls = load_object(config["spider"])
        result = await run_crawl(
            spider_cls,
            settings,
            crawl_timeout=config["crawl_timeout"],
            **spider_kwargs,
        )
    finally:
        await site.stop()
    data = result.to_dict()
    cls = type(reactor)
    data["reactor"] = f"{cls.__module__}.{cls.__qualname__}"
    data["port"] = site.port
    data["recorder"] = site.recorder.to_dict()
    with open(out_path, "w") as f:
        json.dump(data, f)


def _child_main(argv: Sequence[str]) -> int:
    config_path, out_path = argv
    with open(config_path) as f:
        config = json.load(f)

    from scrapy.utils.reactor import install_reactor

    install_reactor(config["reactor"])
    from twisted.internet import reactor

    r = cast(Any, reactor)
    outcome: list[Failure | None] = []

    def run() -> None:
        d = Deferred.fromCoroutine(_child(config, out_path))

        def done(result: Failure | None) -> None:
            outcome.append(result if isinstance(result, Failure) else None)
            r.stop()

        d.addBoth(done)

    r.callWhenRunning(run)
    r.run(installSignalHandlers=False)
    if not outcome:
        print("reactor stopped before the crawl finished", file=sys.stderr)
        return 2
    failure = outcome[0]
    if failure is not None:
        print(failure.getTraceback(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
