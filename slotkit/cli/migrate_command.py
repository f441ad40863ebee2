"""``python -m slotkit migrate``: its options and its handler, which prints
:mod:`slotkit.migration`'s report."""

from __future__ import annotations

import argparse
from typing import Any

from slotkit.cli.common import EXIT_OK, build_settings, parse_setting


def _register_migrate(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "migrate",
        help="print the slotkit equivalents of a project's throttling settings",
        description=(
            "Read a Scrapy project's settings (stock throttling, DOWNLOAD_SLOTS, "
            "AutoThrottle) and print the equivalent slotkit settings, with a note per change."
        ),
    )
    parser.add_argument(
        "--settings-module",
        metavar="MODULE",
        help="import path of the project's settings module, e.g. `myproject.settings`",
    )
    parser.add_argument(
        "-s",
        "--set",
        dest="overrides",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="set a setting, like `scrapy crawl -s`; repeatable",
    )
    parser.set_defaults(handler=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    from slotkit.migration import format_report, migration_report

    overrides = [parse_setting(text) for text in args.overrides]
    settings = build_settings(args.settings_module, overrides)
    print(format_report(migration_report(settings)))
    return EXIT_OK
