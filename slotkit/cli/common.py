"""What the subcommands share: exit statuses, :class:`CommandError`, and the
``-s NAME=VALUE`` / ``--settings-module`` handling that builds Scrapy settings
(with "did you mean" warnings and where each setting came from)."""

from __future__ import annotations

import difflib
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slotkit.setting_names import SETTING_NAMES

if TYPE_CHECKING:
    from scrapy.settings import Settings

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


class CommandError(Exception):
    """A problem the user can fix; printed as ``error: <message>``, exit status 2."""


# --------------------------------------------------------------------------- settings


#: Settings slotkit reads on top of Scrapy's own (for the "did you mean" check of
#: ``-s``): the ones under its prefixes, from the list the crawl-start check uses
#: too (a copy here had fallen behind it), and three outside them.
SLOTKIT_SETTINGS = SETTING_NAMES | {
    # Scrapy 2.19 deprecated it in its defaults; slotkit (and the spec) read it.
    "CONCURRENT_REQUESTS_PER_IP",
    "DELAYED_REQUESTS_WARN_THRESHOLD",
    # The spec's (a redirect's Retry-After); Scrapy 2.19 does not define it.
    "REDIRECT_MAX_DELAY",
}


def _known_settings() -> frozenset[str]:
    from scrapy.settings import default_settings

    return SLOTKIT_SETTINGS | {name for name in vars(default_settings) if name.isupper()}


def parse_setting(text: str) -> tuple[str, Any]:
    """Parse one ``-s NAME=VALUE``.

    Like ``scrapy crawl -s``, values stay strings (Scrapy's ``getint``,
    ``getbool`` ... convert them when read), except that a value starting
    with ``{`` or ``[`` is read as JSON, so dicts and lists such as
    ``THROTTLING_SCOPES`` can be given.
    """
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise CommandError(f"-s expects NAME=VALUE (got {text!r})")
    if value.lstrip().startswith(("{", "[")):
        try:
            return name, json.loads(value)
        except json.JSONDecodeError as exc:
            raise CommandError(f"-s {name}: the value is not valid JSON ({exc}): {value}") from None
    return name, value


def _setting_warnings(names: Sequence[str]) -> list[str]:
    known = _known_settings()
    warnings = []
    for name in names:
        if name in known:
            continue
        match = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        hint = f"; did you mean {match[0]}?" if match else ""
        warnings.append(f"-s {name}: not a setting Scrapy or slotkit knows{hint}")
    return warnings


def build_settings(
    settings_module: str | None = None, overrides: Sequence[tuple[str, Any]] = ()
) -> Settings:
    """Scrapy's defaults, then the project's (*settings_module*, or the Scrapy project
    found as ``scrapy`` commands find it), then *overrides* (cmdline)."""
    from scrapy.settings import Settings
    from scrapy.utils.conf import closest_scrapy_cfg

    settings = Settings()
    if not settings_module and (os.environ.get("SCRAPY_SETTINGS_MODULE") or closest_scrapy_cfg()):
        # Inside a Scrapy project: read its settings, as "scrapy crawl" would.
        from scrapy.utils.project import get_project_settings

        settings = get_project_settings()
    elif settings_module:
        # Import like Scrapy does for a project: from the current directory.
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(settings_module)
        except ImportError as exc:
            raise CommandError(
                f"--settings-module {settings_module!r} cannot be imported: {exc}"
            ) from None
        settings.setmodule(module, priority="project")
    for name, value in overrides:
        try:
            settings.set(name, value, priority="cmdline")
        except (TypeError, ValueError) as exc:
            # A dict setting given text that is not JSON: Scrapy's own update()
            # raises, which would end the command in a traceback.
            raise CommandError(
                f"-s {name}: {value!r} is not a value this setting takes ({exc}); "
                "dict settings take a JSON object"
            ) from None
    return settings


_PRIORITY_NAMES = {
    0: "default",
    10: "command default",
    15: "add-on",
    20: "project settings",
    30: "spider settings",
    40: "-s on the command line",
}


def _origin(settings: Settings, name: str) -> str:
    """Who set *name*: a Scrapy or slotkit default, the project, an add-on, ``-s`` ..."""
    priority = settings.getpriority(name)
    if priority is None:
        return "slotkit default"
    if priority == 0:
        return "Scrapy default"
    return _PRIORITY_NAMES.get(priority, f"priority {priority}")
