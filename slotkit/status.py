"""What the throttling is doing right now, as one log line or a telnet report.

:class:`StatusReporter` logs, every ``THROTTLING_STATS_INTERVAL`` seconds
(default 60, ``0`` turns it off), one INFO line in the spirit of Scrapy's
LogStats::

    Throttling: 5 scopes alive, 1 backing off, 12 requests waiting, 6 in flight;
    slowest: polite.test 1.00s, flaky.test 2.00s (backoff), busy.test 0.25s (hold 1.6s)

It reads the live scopes through a callable (the downloader passes
``registry.values``) and the time through an injected ``IReactorTime``, so it
runs unchanged on the reactor, on slotkit's asyncio clock and on
:class:`twisted.internet.task.Clock` in tests. It owns at most one pending
delayed call, and none after :meth:`StatusReporter.stop`.

:func:`scope_state` is the read-only snapshot of one scope that both the
status line and ``python -m slotkit demo`` are built on. It never changes a
scope: backoff recovery that is due but not applied yet (scope managers apply
it lazily, when next asked) is computed on the side.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slotkit.policy import recover
from slotkit.validation import _number

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from twisted.internet.interfaces import IDelayedCall, IReactorTime

    from slotkit.registry import Scope

logger = logging.getLogger("slotkit")

__all__ = [
    "DEFAULT_INTERVAL",
    "ScopeState",
    "StatusReporter",
    "format_status",
    "scope_state",
    "summarize",
]

#: ``THROTTLING_STATS_INTERVAL`` when unset, in seconds.
DEFAULT_INTERVAL = 60.0
#: How many of the slowest scopes the status line names.
SLOWEST = 3


@dataclass(frozen=True, slots=True)
class ScopeState:
    """One scope at one instant; every field is plain data."""

    id: str
    kind: str
    #: Requests of the scope being downloaded now.
    in_flight: int
    #: Requests of the scope waiting at the gate (parked or held by a per-request delay).
    waiting: int
    #: The concurrency limit (``None`` if the scope manager does not expose one).
    concurrency: int | None
    #: The configured delay between two dispatches.
    delay: float
    #: The delay in force: the configured one, or the backoff delay if larger.
    current_delay: float
    #: The backoff delay, ``None`` when the scope is not backing off.
    backoff_delay: float | None
    #: The backoff level: 0 when not backing off, 1 for the first step, and so on.
    backoff_level: int
    #: Seconds left of a hard hold (a ``Retry-After`` hint or ``delay_scope()``), else 0.
    hold_remaining: float
    #: Backoff triggers and steps the scope manager counted so far (0 if it does not count).
    triggers: int
    steps: int

    @property
    def backing_off(self) -> bool:
        """True while a backoff delay or a hold slows the scope down."""
        return self.backoff_delay is not None or self.hold_remaining > 0

    @property
    def wait_hint(self) -> float:
        """How slow the scope is: the larger of its delay and its remaining hold."""
        return max(self.current_delay, self.hold_remaining)


def _float(value: Any, default: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value)


def _settled_backoff(manager: Any, now: float) -> float | None:
    """The backoff delay of *manager* at *now*, with due recovery steps applied on the side."""
    delay = getattr(manager, "backoff_delay", None)
    if not isinstance(delay, (int, float)):
        return None
    config = getattr(manager, "backoff", None)
    due = _float(getattr(manager, "recovers_at", math.inf), math.inf)
    if config is None:
        return float(delay)
    base = _float(getattr(manager, "delay", 0.0))
    current: float | None = float(delay)
    window = _float(getattr(config, "window", 0.0))
    while current is not None and now >= due and window > 0:
        current = recover(current, config.delay_factor, config.min_delay, base)
        due += window
    return current


def _level(backoff_delay: float | None, manager: Any, base: float) -> int:
    """How many backoff steps above the first one *backoff_delay* is, plus one."""
    if backoff_delay is None:
        return 0
    config = getattr(manager, "backoff", None)
    factor = _float(getattr(config, "delay_factor", 2.0), 2.0)
    floor = _float(getattr(config, "min_delay", 1.0), 1.0)
    cap = _float(getattr(config, "max_delay", math.inf), math.inf)
    first = min(cap, max(floor, base * factor))
    if factor <= 1.0 or first <= 0.0 or backoff_delay <= first:
        return 1
    return 1 + round(math.log(backoff_delay / first, factor))


def scope_state(scope: Scope, now: float) -> ScopeState:
    """A read-only snapshot of *scope* at *now*.

    Works with any scope manager: attributes the default
    :class:`~slotkit.scope.ThrottlingScopeManager` has and a custom one may
    lack (``delay``, ``backoff_delay``, ``hold_until`` ...) read as neutral
    values.
    """
    manager = scope.manager
    delay = _float(getattr(manager, "delay", 0.0))
    backoff_delay = _settled_backoff(manager, now)
    current = delay if backoff_delay is None else max(delay, backoff_delay)
    hold_until = _float(getattr(manager, "hold_until", -math.inf), -math.inf)
    concurrency = getattr(manager, "concurrency", None)
    in_flight = len(scope.in_flight)
    return ScopeState(
        id=scope.id,
        kind=scope.kind,
        in_flight=in_flight,
        waiting=max(0, len(scope.requests) - in_flight),
        concurrency=concurrency if isinstance(concurrency, int) else None,
        delay=delay,
        current_delay=current,
        backoff_delay=backoff_delay,
        backoff_level=_level(backoff_delay, manager, delay),
        hold_remaining=max(0.0, hold_until - now),
        triggers=int(_float(getattr(manager, "triggers", 0))),
        steps=int(_float(getattr(manager, "steps", 0))),
    )


@dataclass(frozen=True, slots=True)
class Summary:
    """The whole crawl's throttling at one instant."""

    alive: int
    backing_off: int
    waiting: int
    in_flight: int
    slowest: tuple[ScopeState, ...]


def summarize(states: Iterable[ScopeState], slowest: int = SLOWEST) -> Summary:
    """Totals over *states* and the *slowest* scopes (by delay or hold; idle-fast ones left out)."""
    states = list(states)
    slow = sorted(
        (state for state in states if state.wait_hint > 0),
        key=lambda state: (-state.wait_hint, state.id),
    )
    return Summary(
        alive=len(states),
        backing_off=sum(state.backing_off for state in states),
        waiting=sum(state.waiting for state in states),
        in_flight=sum(state.in_flight for state in states),
        slowest=tuple(slow[:slowest]),
    )


def _describe_scope(state: ScopeState) -> str:
    notes = []
    if state.backoff_delay is not None:
        notes.append(f"backoff level {state.backoff_level}")
    if state.hold_remaining > 0:
        notes.append(f"hold {state.hold_remaining:.1f}s")
    suffix = f" ({', '.join(notes)})" if notes else ""
    return f"{state.id} {state.current_delay:.2f}s{suffix}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def format_status(
    states: Iterable[ScopeState], slowest: int = SLOWEST, queued: int | None = None
) -> str:
    """The status line for *states* (without the logger's prefix); *queued*:
    requests slotkit's scheduler holds for their scopes, if it is the crawl's."""
    summary = summarize(states, slowest)
    text = (
        f"Throttling: {_plural(summary.alive, 'scope')} alive, "
        f"{summary.backing_off} backing off, "
        f"{_plural(summary.waiting, 'request')} waiting, {summary.in_flight} in flight"
    )
    if queued:
        # The requests that wait in slotkit's scheduler do not show in the
        # downloader's counts: without this a slowed crawl read as a stalled one.
        text += f", {queued} queued in the scheduler"
    if summary.slowest:
        text += "; slowest: " + ", ".join(_describe_scope(state) for state in summary.slowest)
    return text


class StatusReporter:
    """Logs the throttling status line every *interval* seconds while started.

    *scopes* returns the live scopes each time it is called (the downloader
    passes ``registry.values``). *interval* ``0`` makes :meth:`start` a no-op.
    """

    def __init__(
        self,
        clock: IReactorTime,
        scopes: Callable[[], Iterable[Scope]],
        interval: float = DEFAULT_INTERVAL,
        log: logging.Logger = logger,
    ) -> None:
        self._clock = clock
        self._scopes = scopes
        #: How many requests slotkit's scheduler queues (None: not the crawl's scheduler).
        self.queued: Callable[[], int | None] = lambda: None
        self.interval = interval
        self._log = log
        self._call: IDelayedCall | None = None
        self._stopped = False
        #: The telnet receiver (signals hold receivers weakly; see :func:`install_telnet_vars`).
        self._telnet_receiver: Callable[..., None] | None = None

    @classmethod
    def attach(cls, downloader: Any) -> StatusReporter:
        """Build the reporter of a :class:`slotkit.Downloader` and connect it to the crawl.

        Reads ``THROTTLING_STATS_INTERVAL`` (a :class:`~slotkit.SettingsError`
        names a bad value), starts on ``engine_started``, stops on
        ``engine_stopped``, and adds the throttling report to the telnet
        console (see :func:`install_telnet_vars`). The downloader should also
        call :meth:`stop` from its ``close()``.
        """
        from scrapy import signals

        settings = downloader.settings
        interval = _number(
            "THROTTLING_STATS_INTERVAL",
            settings.get("THROTTLING_STATS_INTERVAL", DEFAULT_INTERVAL),
        )
        reporter = cls(downloader._clock, downloader.registry.values, interval)
        crawler = downloader.crawler
        reporter.queued = functools.partial(_queued_in_slotkits_scheduler, crawler)
        crawler.signals.connect(reporter.start, signal=signals.engine_started)
        crawler.signals.connect(reporter.stop, signal=signals.engine_stopped)
        install_telnet_vars(crawler, reporter)
        return reporter

    @property
    def running(self) -> bool:
        return self._call is not None and self._call.active()

    def start(self) -> None:
        """Log every *interval* seconds from now on (first line after one interval)."""
        if self.interval <= 0 or self._stopped or self.running:
            return
        self._schedule()

    def stop(self) -> None:
        """Stop logging and cancel the pending call; :meth:`start` does nothing afterwards."""
        self._stopped = True
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()

    def _schedule(self) -> None:
        self._call = self._clock.callLater(self.interval, self._tick)

    def _tick(self) -> None:
        self._call = None
        try:
            self.log_status()
        finally:
            if not self._stopped:
                self._schedule()

    def states(self) -> list[ScopeState]:
        """A snapshot of every live scope."""
        now = self._clock.seconds()
        return [scope_state(scope, now) for scope in self._scopes()]

    def describe(self) -> str:
        """The current status line."""
        return format_status(self.states(), queued=self.queued())

    def log_status(self) -> None:
        """Log the status line once, now."""
        self._log.info("%s", self.describe())

    def report(self) -> str:
        """A multi-line report: the status line, then one line per live scope."""
        states = self.states()
        lines = [format_status(states, queued=self.queued()), ""]
        if states:
            width = max(len(state.id) for state in states)
            lines.append(
                f"{'scope':<{width}}  {'in flight':>9}  {'waiting':>7}  {'delay':>8}  backoff"
            )
            for state in states:
                limit = "?" if state.concurrency is None else str(state.concurrency)
                backoff = "-"
                if state.backoff_delay is not None:
                    backoff = f"level {state.backoff_level} ({state.backoff_delay:.2f}s)"
                if state.hold_remaining > 0:
                    backoff += f", hold {state.hold_remaining:.1f}s"
                lines.append(
                    f"{state.id:<{width}}  {f'{state.in_flight}/{limit}':>9}  "
                    f"{state.waiting:>7}  {state.current_delay:>7.2f}s  {backoff}"
                )
        return "\n".join(lines)


def _queued_in_slotkits_scheduler(crawler: Crawler) -> int | None:
    """The requests slotkit's scheduler queues, or ``None`` if another runs the crawl."""
    from slotkit.scheduler import ThrottlingAwareScheduler

    engine = getattr(crawler, "engine", None)
    scheduler = getattr(engine, "scheduler", None)
    if not isinstance(scheduler, ThrottlingAwareScheduler):
        return None
    try:
        return len(scheduler)
    except Exception:  # a status line must never break the crawl
        return None


def install_telnet_vars(crawler: Crawler, reporter: StatusReporter) -> None:
    """Show throttling in Scrapy's telnet console.

    ``scrapy.utils.engine.get_engine_status`` evaluates a fixed list of
    expressions, so there is no way to add a row to it from outside. The
    telnet console, however, sends ``update_telnet_vars`` with the dict of
    its variables before each session; this adds ``tst()`` (print the
    throttling report) and ``throttling`` (the reporter), and makes ``est()``
    print the throttling report after the engine status.
    """
    try:
        from scrapy.extensions.telnet import update_telnet_vars
    except ImportError:  # pragma: no cover - the conch extra is missing
        return

    def _update(telnet_vars: dict[str, Any]) -> None:
        def tst() -> None:
            sys.stdout.write(reporter.report() + "\n")

        engine_status = telnet_vars.get("est")

        def est() -> None:
            if callable(engine_status):
                engine_status()
            tst()

        telnet_vars["tst"] = tst
        telnet_vars["est"] = est
        telnet_vars["throttling"] = reporter

    # The receiver is a closure, so keep a strong reference (pydispatch holds weak ones).
    reporter._telnet_receiver = _update
    crawler.signals.connect(_update, signal=update_telnet_vars)
