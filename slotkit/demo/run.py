"""Running the demo: server, crawl, live table, summary and chart on one reactor.

:func:`run_demo` is the whole demo as a coroutine on an already running
reactor (tests drive it that way); :func:`main` installs Scrapy's asyncio
reactor, runs :func:`run_demo` and returns the exit status.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from slotkit.demo.options import DemoOptions
from slotkit.demo.sites import SITES, DemoResolver, DemoServer, SiteSpec, robots_fallback

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from scrapy.crawler import CrawlerRunner

    from slotkit.demo.monitor import ScopeTimeline

__all__ = ["DemoResult", "demo_settings", "main", "run_demo"]

REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"


def demo_settings(
    duration: float, sites: Sequence[SiteSpec] = SITES, log_level: str = "WARNING"
) -> dict[str, Any]:
    """The settings of the demo crawl."""
    return {
        # slotkit is enabled the way a project would do it: through its add-on.
        "ADDONS": {"slotkit.addon.Addon": 0},
        "THROTTLING_SCOPES": {spec.host: robots_fallback(spec) for spec in sites},
        "CONCURRENT_REQUESTS": 32,
        "ROBOTSTXT_OBEY": True,
        # Short enough for recovery from backoff to show within the run.
        "BACKOFF_WINDOW": 4.0,
        "BACKOFF_MAX_DELAY": 8.0,
        "CLOSESPIDER_TIMEOUT": duration,
        # Loopback only: never go through a proxy from the environment.
        "HTTPPROXY_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "LOG_LEVEL": log_level,
        "LOGSTATS_INTERVAL": 0,
        "THROTTLING_STATS_INTERVAL": 0,
        "MEMUSAGE_ENABLED": False,
        "COOKIES_ENABLED": False,
        "DOWNLOAD_TIMEOUT": 10,
        "USER_AGENT": "slotkit-demo",
    }


@dataclass
class DemoResult:
    """What a demo run produced."""

    elapsed: float
    pages: dict[str, int]
    stats: dict[str, Any]
    chart: Path | None
    errors: dict[str, int] = field(default_factory=dict)
    timelines: list[ScopeTimeline] = field(default_factory=list)


@dataclass
class _Control:
    """Lets a signal handler stop the crawl gracefully."""

    runner: CrawlerRunner | None = None
    stopping: bool = False


def _labels(sites: Sequence[SiteSpec]) -> dict[str, str]:
    return {spec.host: spec.label for spec in sites}


async def run_demo(
    reactor: Any,
    options: DemoOptions,
    out: IO[str],
    sites: Sequence[SiteSpec] = SITES,
    control: _Control | None = None,
) -> DemoResult:
    """Serve *sites*, crawl them for ``options.duration`` seconds, report on *out*.

    Needs a running reactor. The reactor's resolver is swapped for
    :class:`~slotkit.demo.sites.DemoResolver` during the crawl and restored after.
    """
    from scrapy.crawler import CrawlerRunner
    from twisted.internet.task import LoopingCall

    from slotkit.demo.chart import render_svg
    from slotkit.demo.monitor import Monitor
    from slotkit.demo.spider import DemoSpider
    from slotkit.demo.table import LiveTable, render_summary, render_table

    order = {spec.host: index for index, spec in enumerate(sites)}
    labels = _labels(sites)
    server = DemoServer(reactor, sites)
    port = server.start(options.port)
    old_name_resolver = reactor.nameResolver
    reactor.installResolver(DemoResolver([spec.host for spec in sites]))
    out.write(
        f"slotkit demo: {len(sites)} sites on http://127.0.0.1:{port} "
        f"({', '.join(spec.host for spec in sites)}), crawling for {options.duration:g} s\n\n"
    )
    out.flush()

    runner = CrawlerRunner(demo_settings(options.duration, sites, options.log_level))
    if control is not None:
        control.runner = runner
    crawler = runner.create_crawler(DemoSpider)
    monitor = Monitor(crawler, reactor, order=lambda scope: order.get(scope, len(order)))
    table = LiveTable(out, options.redraw)

    def draw() -> None:
        lines = render_table(
            monitor.timelines.values(),
            monitor.now(),
            monitor.totals(),
            options.duration,
            labels,
        )
        table.update(lines)

    refresh = LoopingCall(draw)
    refresh.clock = reactor

    def start_refresh() -> None:
        refresh.start(options.refresh, now=False)

    from scrapy import signals

    crawler.signals.connect(start_refresh, signal=signals.engine_started)
    starts = [
        server.url(spec.host, f"/page/{index}") for spec in sites for index in range(spec.chains)
    ]
    try:
        await runner.crawl(crawler, starts=starts)
    finally:
        if refresh.running:
            refresh.stop()
        reactor.installNameResolver(old_name_resolver)
        stopped = server.stop()
        if stopped is not None:
            await stopped

    monitor.stop()
    elapsed = monitor.now()
    draw()
    table.finish()
    stats = dict(crawler.stats.get_stats()) if crawler.stats is not None else {}
    spider = crawler.spider
    errors = dict(getattr(spider, "errors", {}))
    ordered = list(monitor.timelines.values())
    out.write("\n" + "\n".join(render_summary(ordered, elapsed, stats, errors)) + "\n")
    chart: Path | None = options.chart
    if chart is not None:
        chart.parent.mkdir(parents=True, exist_ok=True)
        chart.write_text(render_svg(ordered, elapsed, labels), encoding="utf-8")
        out.write(f"\nTimeline chart: {chart.resolve()}\n")
    out.flush()
    return DemoResult(
        elapsed=elapsed,
        pages={timeline.id: timeline.pages for timeline in ordered},
        stats=stats,
        chart=chart,
        errors=errors,
        timelines=ordered,
    )


def _install_reactor() -> Any:
    from scrapy.utils.reactor import install_reactor, is_reactor_installed

    if not is_reactor_installed():
        install_reactor(REACTOR)
    from twisted.internet import reactor

    return reactor


def _configure_logging(level: str) -> None:
    from scrapy.utils.log import configure_logging

    configure_logging({"LOG_LEVEL": level, "LOG_INSTALL_ROOT_HANDLER": True})


def main(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """Run the demo from parsed command-line *args*; return the exit status."""
    stream = out if out is not None else sys.stdout
    tty = stream.isatty() and os.environ.get("TERM", "") != "dumb"
    options = DemoOptions.from_args(args, tty)
    _configure_logging(options.log_level)
    reactor = _install_reactor()
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure

    control = _Control()
    outcome: list[DemoResult | Failure] = []

    def interrupted(signum: int, frame: Any) -> None:
        if control.stopping or control.runner is None:
            reactor.callFromThread(reactor.stop)
            return
        control.stopping = True
        stream.write("\nStopping the crawl (Ctrl-C again to quit at once)...\n")
        reactor.callFromThread(control.runner.stop)

    def start() -> None:
        signal.signal(signal.SIGINT, interrupted)
        demo = Deferred.fromCoroutine(run_demo(reactor, options, stream, control=control))

        def finished(result: DemoResult | Failure) -> None:
            outcome.append(result)
            reactor.stop()

        demo.addBoth(finished)

    reactor.callWhenRunning(start)
    reactor.run(installSignalHandlers=False)
    if not outcome:
        stream.write("Interrupted.\n")
        return 130
    result = outcome[0]
    if isinstance(result, Failure):
        from twisted.internet.error import CannotListenError

        if result.check(CannotListenError):
            # A port in use is the machine's state, not a bug: one line, no traceback.
            sys.stderr.write(f"slotkit demo: {result.value}\n")
            return 1
        sys.stderr.write(f"slotkit demo failed: {result.getTraceback()}\n")
        return 1
    return 0
