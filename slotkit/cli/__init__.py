"""``python -m slotkit``: the demo, ``explain`` and (soon) ``migrate``.

Each subcommand is one ``_register_*`` function that adds its parser to the
subparsers and sets ``handler`` (a function taking the parsed namespace and
returning the exit status); :data:`COMMANDS` lists them. Adding a
subcommand is writing one such function and listing it.

This module holds the argument parsing and the dispatch; each subcommand
lives in its own ``*_command`` module, the shared ``-s``/``--settings-module``
handling in :mod:`slotkit.cli.common`, and ``explain``'s model, value
sources, computation and text output in :mod:`slotkit.cli.explanation`,
:mod:`slotkit.cli.sources`, :mod:`slotkit.cli.explainer` and
:mod:`slotkit.cli.formatting`. Their public names stay importable from here.

Exit statuses: 0 success, 2 bad usage or a bad setting (the message is
printed, never a traceback), 1 anything else that went wrong.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from slotkit.cli.common import EXIT_ERROR as EXIT_ERROR
from slotkit.cli.common import EXIT_OK as EXIT_OK
from slotkit.cli.common import EXIT_USAGE as EXIT_USAGE
from slotkit.cli.common import SLOTKIT_SETTINGS as SLOTKIT_SETTINGS
from slotkit.cli.common import CommandError as CommandError
from slotkit.cli.common import build_settings as build_settings
from slotkit.cli.common import parse_setting as parse_setting
from slotkit.cli.demo_command import _register_demo
from slotkit.cli.demo_command import run_demo as run_demo
from slotkit.cli.explain_command import _register_explain
from slotkit.cli.explain_command import run_explain as run_explain
from slotkit.cli.explainer import explain as explain
from slotkit.cli.explanation import NOTE_PROVIDERS as NOTE_PROVIDERS
from slotkit.cli.explanation import SOURCE_DESCRIBERS as SOURCE_DESCRIBERS
from slotkit.cli.explanation import ExplainContext as ExplainContext
from slotkit.cli.explanation import Explanation as Explanation
from slotkit.cli.explanation import ScopeExplanation as ScopeExplanation
from slotkit.cli.explanation import Value as Value
from slotkit.cli.formatting import VALUE_WIDTH as VALUE_WIDTH
from slotkit.cli.formatting import format_explanation as format_explanation
from slotkit.cli.migrate_command import _register_migrate
from slotkit.cli.migrate_command import run_migrate as run_migrate

__all__ = ["COMMANDS", "Explanation", "explain", "main"]

Handler = Callable[[argparse.Namespace], int]


#: The subcommands, in the order ``--help`` lists them; each registers a parser
#: that sets ``handler``.
COMMANDS: list[Callable[[Any], None]] = [_register_demo, _register_explain, _register_migrate]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m slotkit",
        description="slotkit: throttling scopes for Scrapy.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m slotkit`` with *argv*; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except CommandError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``... --json | head``): no traceback, and none
        # at exit either when Python flushes the closed stdout.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
