"""``python -m slotkit explain URL``: its options and its handler."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from slotkit.cli.common import (
    EXIT_OK,
    CommandError,
    _setting_warnings,
    build_settings,
    parse_setting,
)
from slotkit.cli.explainer import explain
from slotkit.cli.formatting import format_explanation


def _register_explain(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="show the throttling scopes of a URL and each scope's effective limits",
        description=(
            "Show which throttling scopes a request for URL would belong to and the "
            "effective limits of each scope, with where every value comes from."
        ),
    )
    parser.add_argument("url", help="the URL to explain")
    parser.add_argument(
        "-s",
        "--set",
        dest="overrides",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="set a setting, like `scrapy crawl -s` (JSON for dict and list values); repeatable",
    )
    parser.add_argument(
        "--settings-module",
        metavar="MODULE",
        help="import path of a settings module, like a Scrapy project's `myproject.settings`",
    )
    parser.add_argument(
        "--meta",
        metavar="JSON",
        help='request meta, e.g. \'{"throttling_scopes": ["api", "users"]}\'',
    )
    parser.add_argument("--json", action="store_true", help="print the explanation as JSON")
    parser.set_defaults(handler=run_explain)


def run_explain(args: argparse.Namespace) -> int:
    from slotkit.settings import SettingsError

    overrides = [parse_setting(text) for text in args.overrides]
    for warning in _setting_warnings([name for name, _ in overrides]):
        sys.stderr.write(f"warning: {warning}\n")
    meta = None
    if args.meta:
        try:
            meta = json.loads(args.meta)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--meta is not valid JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise CommandError(f"--meta must be a JSON object (got {args.meta})")
    settings = build_settings(args.settings_module, overrides)
    try:
        explanation = explain(args.url, settings, meta)
    except SettingsError as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print(json.dumps(explanation.as_dict(), indent=2, default=str))
    else:
        print(format_explanation(explanation))
    return EXIT_OK
