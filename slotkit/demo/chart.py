"""The demo's timeline chart, written as SVG by hand (no plotting library needed).

One panel per scope, all sharing the time axis:

* blue bars: transfers per second (left scale);
* orange line: the delay in force, backoff included (right scale);
* red shading: a hard hold (``Retry-After`` or a ``RateLimit`` reset) running;
* orange triangles on top: a backoff step;
* ticks at the bottom: 429 (red) and 503 (purple) responses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING
from xml.sax.saxutils import escape, quoteattr

if TYPE_CHECKING:
    from slotkit.demo.monitor import ScopeTimeline

__all__ = ["render_svg"]

WIDTH = 1000
LEFT = 170
RIGHT = 70
TOP = 84
PANEL = 112
GAP = 34
BOTTOM = 46

RATE_COLOUR = "#4c78a8"
DELAY_COLOUR = "#f58518"
HOLD_COLOUR = "#e45756"
COLOURS_BY_STATUS = {429: "#d62728", 503: "#9467bd"}
AXIS_COLOUR = "#888888"
GRID_COLOUR = "#e6e6e6"


def _nice_ceiling(value: float) -> float:
    """A round number >= *value* for an axis top (1, 2, 5 times a power of ten)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= step * power:
            return step * power
    return 10.0 * power  # pragma: no cover - the loop always returns


def _tick_step(duration: float) -> float:
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300):
        if duration / step <= 12:
            return float(step)
    return 600.0


def _f(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _bins(times: Sequence[float], duration: float, size: float) -> list[int]:
    counts = [0] * max(1, math.ceil(duration / size))
    for t in times:
        index = min(len(counts) - 1, max(0, int(t // size)))
        counts[index] += 1
    return counts


def _hold_spans(timeline: ScopeTimeline, duration: float) -> list[tuple[float, float]]:
    """Time ranges during which a hold was running, from the samples."""
    spans: list[tuple[float, float]] = []
    for t, state in timeline.samples:
        if state.hold_remaining <= 0:
            continue
        end = min(duration, t + state.hold_remaining)
        if spans and t <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((t, end))
    return spans


def _panel(
    out: list[str],
    timeline: ScopeTimeline,
    label: str,
    top: float,
    duration: float,
    last: bool,
) -> None:
    plot_width = WIDTH - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + plot_width * min(max(t, 0.0), duration) / duration

    bottom = top + PANEL
    size = 0.5 if duration <= 20 else 1.0
    counts = _bins(timeline.transfers, duration, size)
    rates = [count / size for count in counts]
    rate_top = _nice_ceiling(max(rates, default=0.0))
    delays = [state.current_delay for _, state in timeline.samples]
    delay_top = _nice_ceiling(max(delays, default=0.0))

    out.append(f'<g class="scope" data-scope={quoteattr(timeline.id)}>')
    out.append(f"<title>{escape(timeline.id)}</title>")
    # Frame, grid and labels.
    out.append(
        f'<rect x="{LEFT}" y="{_f(top)}" width="{plot_width}" height="{PANEL}" '
        f'fill="#ffffff" stroke="{AXIS_COLOUR}" stroke-width="0.5"/>'
    )
    step = _tick_step(duration)
    tick = 0.0
    while tick <= duration + 1e-9:
        out.append(
            f'<line x1="{_f(x(tick))}" y1="{_f(top)}" x2="{_f(x(tick))}" y2="{_f(bottom)}" '
            f'stroke="{GRID_COLOUR}" stroke-width="1"/>'
        )
        if last:
            out.append(
                f'<text x="{_f(x(tick))}" y="{_f(bottom + 16)}" font-size="11" '
                f'text-anchor="middle" fill="#444444">{_f(tick)} s</text>'
            )
        tick += step
    out.append(
        f'<text x="{LEFT - 10}" y="{_f(top + 18)}" font-size="14" font-weight="bold" '
        f'text-anchor="end">{escape(timeline.id)}</text>'
    )
    if label:
        out.append(
            f'<text x="{LEFT - 10}" y="{_f(top + 36)}" font-size="11" text-anchor="end" '
            f'fill="#555555">{escape(label)}</text>'
        )
    out.append(
        f'<text x="{LEFT - 10}" y="{_f(bottom - 4)}" font-size="10" text-anchor="end" '
        f'fill="{RATE_COLOUR}">0 - {_f(rate_top)} req/s</text>'
    )
    out.append(
        f'<text x="{WIDTH - RIGHT + 6}" y="{_f(top + 10)}" font-size="10" '
        f'fill="{DELAY_COLOUR}">{_f(delay_top)} s</text>'
    )
    out.append(
        f'<text x="{WIDTH - RIGHT + 6}" y="{_f(bottom)}" font-size="10" '
        f'fill="{DELAY_COLOUR}">0 s</text>'
    )
    # Holds, under everything else.
    for start, end in _hold_spans(timeline, duration):
        out.append(
            f'<rect class="hold" x="{_f(x(start))}" y="{_f(top)}" '
            f'width="{_f(max(1.0, x(end) - x(start)))}" height="{PANEL}" '
            f'fill="{HOLD_COLOUR}" fill-opacity="0.15"/>'
        )
    # Request rate bars.
    bar_width = plot_width * size / duration
    for index, rate in enumerate(rates):
        if rate <= 0:
            continue
        height = (PANEL - 8) * rate / rate_top
        out.append(
            f'<rect class="rate" x="{_f(x(index * size))}" y="{_f(bottom - height)}" '
            f'width="{_f(max(0.5, bar_width - 0.5))}" height="{_f(height)}" '
            f'fill="{RATE_COLOUR}" fill-opacity="0.55"/>'
        )
    # The delay in force, as a step line.
    if timeline.samples:
        points = []
        previous_y: float | None = None
        for t, state in timeline.samples:
            y = bottom - (PANEL - 8) * state.current_delay / delay_top
            if previous_y is not None:
                points.append(f"{_f(x(t))},{_f(previous_y)}")
            points.append(f"{_f(x(t))},{_f(y)}")
            previous_y = y
        out.append(
            f'<polyline class="delay" points="{" ".join(points)}" fill="none" '
            f'stroke="{DELAY_COLOUR}" stroke-width="2"/>'
        )
    # Backoff steps.
    for t in timeline.steps:
        cx = x(t)
        out.append(
            f'<path class="step" d="M{_f(cx - 5)},{_f(top + 1)} L{_f(cx + 5)},{_f(top + 1)} '
            f'L{_f(cx)},{_f(top + 10)} Z" fill="{DELAY_COLOUR}"/>'
        )
    # Rate-limit and error responses.
    for t, status in timeline.noted:
        colour = COLOURS_BY_STATUS.get(status, HOLD_COLOUR)
        out.append(
            f'<line class="status-{status}" x1="{_f(x(t))}" y1="{_f(bottom)}" '
            f'x2="{_f(x(t))}" y2="{_f(bottom - 9)}" stroke="{colour}" stroke-width="1.5"/>'
        )
    out.append("</g>")


def _legend(out: list[str]) -> None:
    items = [
        ("rect", RATE_COLOUR, "requests/s"),
        ("line", DELAY_COLOUR, "delay in force (backoff included)"),
        ("hold", HOLD_COLOUR, "hold (Retry-After / RateLimit reset)"),
        ("step", DELAY_COLOUR, "backoff step"),
        ("tick", COLOURS_BY_STATUS[429], "429"),
        ("tick", COLOURS_BY_STATUS[503], "503"),
    ]
    x = LEFT
    y = 56
    for kind, colour, text in items:
        if kind == "rect":
            out.append(f'<rect x="{x}" y="{y - 9}" width="14" height="10" fill="{colour}"/>')
        elif kind == "line":
            out.append(
                f'<line x1="{x}" y1="{y - 4}" x2="{x + 14}" y2="{y - 4}" '
                f'stroke="{colour}" stroke-width="2"/>'
            )
        elif kind == "hold":
            out.append(
                f'<rect x="{x}" y="{y - 9}" width="14" height="10" fill="{colour}" '
                'fill-opacity="0.3"/>'
            )
        elif kind == "step":
            out.append(
                f'<path d="M{x + 2},{y - 9} L{x + 12},{y - 9} L{x + 7},{y} Z" fill="{colour}"/>'
            )
        else:
            out.append(
                f'<line x1="{x + 7}" y1="{y - 9}" x2="{x + 7}" y2="{y + 1}" '
                f'stroke="{colour}" stroke-width="2"/>'
            )
        out.append(f'<text x="{x + 19}" y="{y}" font-size="11">{escape(text)}</text>')
        x += 26 + 6 * len(text)


def render_svg(
    timelines: Iterable[ScopeTimeline],
    duration: float,
    labels: Mapping[str, str] | None = None,
    title: str = "slotkit demo: throttling timeline",
) -> str:
    """The SVG document for *timelines* over *duration* seconds."""
    timelines = list(timelines)
    labels = labels or {}
    duration = max(duration, 1.0)
    height = TOP + max(1, len(timelines)) * (PANEL + GAP) - GAP + BOTTOM
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{height}" fill="#fafafa"/>',
        f'<text x="{LEFT}" y="28" font-size="18" font-weight="bold">{escape(title)}</text>',
        f'<text x="{WIDTH - RIGHT}" y="28" font-size="12" text-anchor="end" fill="#555555">'
        f"{_f(duration)} s, {len(timelines)} scopes</text>",
    ]
    _legend(out)
    for index, timeline in enumerate(timelines):
        top = TOP + index * (PANEL + GAP)
        _panel(
            out, timeline, labels.get(timeline.id, ""), top, duration, index == len(timelines) - 1
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
