"""The live per-scope table and the end-of-run summary, as plain text.

Rendering is pure (data in, lines out); :class:`LiveTable` only decides how
to put the lines on the screen: redrawn in place with ANSI escapes on a
terminal, appended as plain blocks anywhere else (a pipe, a CI log).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slotkit.demo.monitor import CrawlTotals, ScopeTimeline
    from slotkit.status import ScopeState

__all__ = ["HEADER", "LEGEND", "LiveTable", "render_summary", "render_table"]

#: The table's column titles (tests look for this line).
COLUMNS = ("scope", "site", "req/s", "delay", "in use/limit", "backoff", "waiting")
_ALIGN_RIGHT = {"req/s", "delay", "in use/limit", "waiting"}
#: Minimum column widths, so that the live table does not shift as values change.
_MIN_WIDTHS = (12, 12, 6, 7, 12, 24, 7)
#: What the table's words mean, printed under the summary for a first-time reader.
LEGEND = (
    "Legend: 'level N (Xs)': backoff raised the scope's delay N steps, to X s, after 429s,",
    "  503s or timeouts; it comes down a step per quiet BACKOFF_WINDOW. 'hold Xs': the whole",
    "  scope waits X s more because the server asked (Retry-After, RateLimit-Reset) or code",
    "  called delay_scope(). 'sends' counts transfers, re-sends included; 'holds' counts pauses.",
)
#: Seconds over which the table's request rate is averaged.
RATE_WINDOW = 2.0
HEADER = COLUMNS


def _backoff_text(state: ScopeState) -> str:
    parts = []
    if state.backoff_delay is not None:
        parts.append(f"level {state.backoff_level} ({state.backoff_delay:.1f}s)")
    if state.hold_remaining > 0:
        parts.append(f"hold {state.hold_remaining:.1f}s")
    return ", ".join(parts) or "-"


def _grid(
    rows: Sequence[Sequence[str]], right: Iterable[int], minimum: Sequence[int] = ()
) -> list[str]:
    right = set(right)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, low in enumerate(minimum[: len(widths)]):
        widths[index] = max(widths[index], low)
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def scope_row(timeline: ScopeTimeline, now: float, label: str = "") -> tuple[str, ...]:
    """One table row: the scope as last sampled, its rate over the last second."""
    state = timeline.last
    if state is None:
        return (timeline.id, label, f"{timeline.rate(now, RATE_WINDOW):.1f}", "-", "-", "-", "-")
    limit = "?" if state.concurrency is None else str(state.concurrency)
    return (
        state.id,
        label,
        f"{timeline.rate(now, RATE_WINDOW):.1f}",
        f"{state.current_delay:.2f}s",
        f"{state.in_flight}/{limit}",
        _backoff_text(state),
        str(state.waiting),
    )


def render_table(
    timelines: Iterable[ScopeTimeline],
    now: float,
    totals: CrawlTotals,
    duration: float,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """The live table: a status line, the column titles, one row per scope."""
    labels = labels or {}
    title = (
        f"slotkit demo  {now:5.1f}s / {duration:g}s  |  {totals.pages} pages  |  "
        f"downloader {totals.in_downloader} ({totals.at_gate} waiting for scopes)  |  "
        f"scheduler {totals.in_scheduler}"
    )
    rows = [COLUMNS] + [scope_row(t, now, labels.get(t.id, "")) for t in timelines]
    right = [i for i, name in enumerate(COLUMNS) if name in _ALIGN_RIGHT]
    return [title, *_grid(rows, right, _MIN_WIDTHS)]


@dataclass(frozen=True)
class RunStats:
    """Crawl-wide numbers for the summary, read from Scrapy's stats."""

    resent: int
    retried: int
    delayed: int
    wait_total: float
    wait_max: float
    header_hints: int

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any]) -> RunStats:
        def number(name: str) -> float:
            value = stats.get(name, 0)
            return float(value) if isinstance(value, (int, float)) else 0.0

        return cls(
            resent=int(number("throttling/backoff/resent")),
            retried=int(number("retry/count")),
            delayed=int(number("throttling/requests_delayed")),
            wait_total=number("throttling/wait_time_total"),
            wait_max=number("throttling/wait_time_max"),
            header_hints=int(number("throttling/backoff/header_hints")),
        )


def render_summary(
    timelines: Iterable[ScopeTimeline],
    elapsed: float,
    stats: Mapping[str, Any],
    errors: Mapping[str, int] | None = None,
) -> list[str]:
    """The end-of-run summary: one row per scope, then the crawl-wide counts."""
    timelines = list(timelines)
    run = RunStats.from_stats(stats)
    pages = sum(t.pages for t in timelines)
    transfers = sum(len(t.transfers) for t in timelines)
    columns = ("site", "pages", "sends", "429s", "503s", "backoff steps", "holds", "pages/s")
    rows: list[tuple[str, ...]] = [columns]
    for timeline in timelines:
        state = timeline.last
        steps = state.steps if state is not None else 0
        holds = max(0, state.triggers - state.steps) if state is not None else 0
        rows.append(
            (
                timeline.id,
                str(timeline.pages),
                str(len(timeline.transfers)),
                str(timeline.statuses.get(429, 0)),
                str(timeline.statuses.get(503, 0)),
                str(steps),
                str(holds),
                f"{timeline.pages / elapsed:.1f}" if elapsed > 0 else "-",
            )
        )
    lines = [
        f"Summary: {pages} pages in {elapsed:.1f} s ({transfers} transfers)",
        *_grid(rows, range(1, len(columns))),
        "",
        f"Re-sent by slotkit after a rate limit (429, no retry used): {run.resent}",
        f"Retried by Scrapy's RetryMiddleware (503s): {run.retried}",
        f"Server wait hints honoured (Retry-After, RateLimit): {run.header_hints}",
        f"Requests that waited for their scopes: {run.delayed} "
        f"(total {run.wait_total:.1f} s, longest {run.wait_max:.1f} s)",
    ]
    errors = dict(errors or {})
    cut_off = errors.pop("GateClosedError", 0)
    if cut_off:
        lines.append(f"Still waiting for their scopes when the crawl stopped: {cut_off}")
    if errors:
        shown = ", ".join(f"{name} {count}" for name, count in sorted(errors.items()))
        lines.append(f"Errors seen by the spider: {shown}")
    return [*lines, "", *LEGEND]


class LiveTable:
    """Puts successive renderings of the table on *stream*.

    On a terminal (*redraw*), each update overwrites the previous one with
    ANSI cursor movement; lines are cut to the terminal width so the line
    count stays right. Otherwise every update is appended as a plain block.
    """

    def __init__(self, stream: IO[str], redraw: bool) -> None:
        self.stream = stream
        self.redraw = redraw
        self._drawn = 0

    def update(self, lines: Sequence[str]) -> None:
        if self.redraw:
            width = max(20, shutil.get_terminal_size((120, 24)).columns - 1)
            lines = [line[:width] for line in lines]
            if self._drawn:
                # Up to the first line of the last drawing, then clear to the end of the screen.
                self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = len(lines)
        self.stream.write("\n".join(lines) + "\n")
        if not self.redraw:
            self.stream.write("\n")
        self.stream.flush()

    def finish(self) -> None:
        """Stop redrawing: later output goes below the last table."""
        self._drawn = 0
