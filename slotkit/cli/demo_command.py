"""``python -m slotkit demo``: its options (from :mod:`slotkit.demo.options`) and
its handler, which runs :mod:`slotkit.demo`."""

from __future__ import annotations

import argparse
from typing import Any


def _register_demo(subparsers: Any) -> None:
    from slotkit.demo.options import add_arguments

    parser = subparsers.add_parser(
        "demo",
        help="crawl a local multi-site server and watch the throttling live",
        description=(
            "Start a local server (127.0.0.1 only) with five sites that behave "
            "differently - fast, bursts of 429 with Retry-After, a quota API with RateLimit "
            "headers, a robots.txt Crawl-delay, random 503s - crawl them with slotkit and "
            "show each scope live, then a summary and an SVG timeline."
        ),
    )
    add_arguments(parser)
    parser.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from slotkit.demo.run import main as demo_main

    return demo_main(args)
