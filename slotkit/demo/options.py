"""Command-line options of ``python -m slotkit demo`` (kept apart so ``--help`` stays cheap)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_CHART", "DEFAULT_DURATION", "QUICK_DURATION", "DemoOptions", "add_arguments"]

DEFAULT_DURATION = 45.0
QUICK_DURATION = 5.0
DEFAULT_CHART = "slotkit-demo-timeline.svg"


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration",
        type=_positive,
        default=DEFAULT_DURATION,
        metavar="SECONDS",
        help=f"how long to crawl (default: {DEFAULT_DURATION:g})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a {QUICK_DURATION:g}-second run (for tests and a first look)",
    )
    parser.add_argument(
        "--chart",
        metavar="PATH",
        default=DEFAULT_CHART,
        help=f"where to write the SVG timeline (default: ./{DEFAULT_CHART})",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="print the table as plain text blocks even on a terminal",
    )
    parser.add_argument(
        "--refresh",
        type=_positive,
        metavar="SECONDS",
        help="seconds between table updates (default: 1 on a terminal, 5 otherwise)",
    )
    parser.add_argument(
        "--port", type=_port, default=0, help="port of the local server (default: any free one)"
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="level of Scrapy's log, which goes to stderr (default: WARNING)",
    )


@dataclass(frozen=True)
class DemoOptions:
    """The demo's options, resolved."""

    duration: float = DEFAULT_DURATION
    chart: Path = Path(DEFAULT_CHART)
    redraw: bool = False
    refresh: float = 1.0
    port: int = 0
    log_level: str = "WARNING"

    @classmethod
    def from_args(cls, args: argparse.Namespace, tty: bool) -> DemoOptions:
        redraw = tty and not args.plain
        refresh = args.refresh if args.refresh is not None else (1.0 if redraw else 5.0)
        return cls(
            duration=QUICK_DURATION if args.quick else args.duration,
            chart=Path(args.chart),
            redraw=redraw,
            refresh=refresh,
            port=args.port,
            log_level=args.log_level,
        )
