"""``python -m slotkit``: the demo, ``explain`` and (soon) ``migrate``.

Each subcommand is one ``_register_*`` function that adds its parser to the
subparsers and sets ``handler`` (a function taking the parsed namespace and
returning the exit status); :data:`COMMANDS` lists them. Adding a
subcommand is writing one such function and listing it.

Exit statuses: 0 success, 2 bad usage or a bad setting (the message is
printed, never a traceback), 1 anything else that went wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy.settings import Settings

    from slotkit.settings import ScopeConfig, ThrottlingSettings

__all__ = ["COMMANDS", "Explanation", "explain", "main"]

Handler = Callable[[argparse.Namespace], int]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


class CommandError(Exception):
    """A problem the user can fix; printed as ``error: <message>``, exit status 2."""


# --------------------------------------------------------------------------- settings


#: Settings slotkit reads on top of Scrapy's own (for the "did you mean" check of ``-s``).
SLOTKIT_SETTINGS = frozenset(
    {
        "BACKOFF_DELAY_FACTOR",
        "BACKOFF_EXCEPTIONS",
        "BACKOFF_HTTP_CODES",
        "BACKOFF_JITTER",
        "BACKOFF_MAX_DELAY",
        "BACKOFF_MIN_DELAY",
        "BACKOFF_RESEND",
        "BACKOFF_RESEND_TIMEOUT",
        "BACKOFF_WINDOW",
        "DELAYED_REQUESTS_WARN_THRESHOLD",
        "RAMPUP_BACKOFF_TARGET",
        "THROTTLING_DEBUG",
        "THROTTLING_MANAGER",
        "THROTTLING_ROBOTSTXT_MAX_DELAY",
        "THROTTLING_ROBOTSTXT_OBEY",
        "THROTTLING_SCOPES",
        "THROTTLING_SCOPE_CONCURRENCY",
        "THROTTLING_SCOPE_LIMIT",
        "THROTTLING_SCOPE_MANAGER",
        "THROTTLING_SCOPE_MAX_IDLE",
        "THROTTLING_STATS_INTERVAL",
        "THROTTLING_WINDOW",
    }
)


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
    """Scrapy's defaults, then *settings_module* (project priority), then *overrides* (cmdline)."""
    from scrapy.settings import Settings

    settings = Settings()
    if settings_module:
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
        settings.set(name, value, priority="cmdline")
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


# --------------------------------------------------------------------------- explain: the model


@dataclass(frozen=True)
class Value:
    """One effective value: the value itself (JSON-able), how it reads, and where it came from."""

    value: Any
    shown: str
    source: str


@dataclass
class ScopeExplanation:
    id: str
    kind: str
    primary: bool
    amount: float | None
    limits: dict[str, Value] = field(default_factory=dict)
    backoff: dict[str, Value] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Explanation:
    url: str
    manager: str
    manager_note: str | None
    scopes: list[ScopeExplanation]
    crawl: dict[str, Value]
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ExplainContext:
    """What a source describer or a note provider may look at."""

    settings: Settings
    config: ThrottlingSettings


#: Describers of ``ScopeConfig.sources`` values beyond the built-in ones, keyed by
#: the source string. The robots.txt ``Crawl-delay`` and AutoThrottle mappings add
#: theirs here: ``describer(context, scope_id, field) -> str``. An unknown source
#: string is shown as it is.
SOURCE_DESCRIBERS: dict[str, Callable[[ExplainContext, str, str], str]] = {}

#: Functions adding crawl-wide notes (limits decided only at crawl time, and so on).
NOTE_PROVIDERS: list[Callable[[ExplainContext], list[str]]] = []


def _robots_note(context: ExplainContext) -> list[str]:
    if not context.settings.getbool("ROBOTSTXT_OBEY"):
        return []
    return [
        "ROBOTSTXT_OBEY is on: a robots.txt Crawl-delay can change a domain scope's "
        "delay and concurrency at crawl time; that is not shown here."
    ]


def _autothrottle_note(context: ExplainContext) -> list[str]:
    if not context.settings.getbool("AUTOTHROTTLE_ENABLED"):
        return []
    start = context.settings.getfloat("AUTOTHROTTLE_START_DELAY")
    return [
        f"AUTOTHROTTLE_ENABLED is on: AutoThrottle rewrites scope delays at crawl time "
        f"(starting from AUTOTHROTTLE_START_DELAY={start:g}); see `python -m slotkit migrate`."
    ]


def _downloader_note(context: ExplainContext) -> list[str]:
    downloader = context.settings.get("DOWNLOADER")
    try:
        from scrapy.utils.misc import load_object

        from slotkit.downloader import Downloader

        cls = downloader if isinstance(downloader, type) else load_object(downloader)
        if isinstance(cls, type) and issubclass(cls, Downloader):
            return []
    except Exception:  # an unimportable DOWNLOADER is reported just below
        pass
    return [
        f"DOWNLOADER is {downloader!r}: these limits apply only with "
        "DOWNLOADER = 'slotkit.Downloader' or ADDONS = {'slotkit.Addon': 0}."
    ]


NOTE_PROVIDERS.extend([_downloader_note, _robots_note, _autothrottle_note])


# --------------------------------------------------------------------------- explain: formatting


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _jitter(value: Sequence[float]) -> str:
    low, high = value
    if low == high == 0:
        return "none"
    if low == -high:
        return f"±{high:.0%}"
    return f"{low:+.0%} to {high:+.0%}"


def _rampup(rampup: Any) -> str:
    low, high = rampup.target
    target = f"{low}" if low == high else f"{low}-{high}"
    return (
        f"on: {target} backoff(s) per {rampup.window:g} s, delay x{rampup.delay_factor:g} "
        f"per step down to {rampup.min_delay:g} s"
    )


def _class_path(value: Any) -> str:
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


def _codes(codes: frozenset[int]) -> str:
    return ", ".join(str(code) for code in sorted(codes))


# --------------------------------------------------------------------------- explain: sources


def _default_setting(config: ThrottlingSettings, settings: Settings, kind: str, name: str) -> str:
    """The setting a ``"default"`` source stands for."""
    from scrapy.settings import SETTINGS_PRIORITIES

    from slotkit.settings import CUSTOM, IP

    if name == "concurrency":
        if kind == IP and config.ip_concurrency:
            return "CONCURRENT_REQUESTS_PER_IP"
        if kind == CUSTOM:
            return "THROTTLING_SCOPE_CONCURRENCY"
        return "CONCURRENT_REQUESTS_PER_DOMAIN"
    if name == "delay":
        return "DOWNLOAD_DELAY"
    if name == "window":
        return "THROTTLING_WINDOW"
    if name == "jitter":
        # The same rule ThrottlingSettings applies: the old boolean wins when set explicitly higher.
        randomize = settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
        jitter = settings.getpriority("DOWNLOAD_DELAY_JITTER") or 0
        if randomize > SETTINGS_PRIORITIES["default"] and randomize > jitter:
            return "RANDOMIZE_DOWNLOAD_DELAY"
        return "DOWNLOAD_DELAY_JITTER"
    return ""


def _describe_source(
    context: ExplainContext, scope: str, kind: str, name: str, source: str, uncapped: ScopeConfig
) -> str:
    settings, config = context.settings, context.config
    if source == "default":
        setting = _default_setting(config, settings, kind, name)
        if not setting:
            return "slotkit default"
        return f"{setting} ({_origin(settings, setting)})"
    if source == "THROTTLING_SCOPES":
        return f"THROTTLING_SCOPES[{scope!r}] ({_origin(settings, 'THROTTLING_SCOPES')})"
    if source == "DOWNLOAD_SLOTS":
        return f"DOWNLOAD_SLOTS[{scope!r}] ({_origin(settings, 'DOWNLOAD_SLOTS')})"
    if source.startswith("CONCURRENT_REQUESTS") and "cap" in source:
        before = _describe_source(
            context, scope, kind, name, uncapped.sources.get(name, "default"), uncapped
        )
        return (
            f"capped by CONCURRENT_REQUESTS ({_origin(settings, 'CONCURRENT_REQUESTS')}); "
            f"{getattr(uncapped, name)} from {before}"
        )
    describer = SOURCE_DESCRIBERS.get(source)
    if describer is not None:
        return describer(context, scope, name)
    return source


_BACKOFF_SETTINGS = {
    "http_codes": "BACKOFF_HTTP_CODES",
    "exceptions": "BACKOFF_EXCEPTIONS",
    "delay_factor": "BACKOFF_DELAY_FACTOR",
    "min_delay": "BACKOFF_MIN_DELAY",
    "max_delay": "BACKOFF_MAX_DELAY",
    "jitter": "BACKOFF_JITTER",
    "window": "BACKOFF_WINDOW",
}


def _backoff_values(context: ExplainContext, scope: str, resolved: ScopeConfig) -> dict[str, Value]:
    backoff = resolved.backoff
    overrides = context.config.scopes.get(scope, {}).get("backoff") or {}
    shown = {
        "http_codes": (sorted(backoff.http_codes), _codes(backoff.http_codes)),
        "exceptions": (
            [_class_path(exc) for exc in backoff.exceptions],
            ", ".join(exc.__name__ for exc in backoff.exceptions) or "none",
        ),
        "delay_factor": (backoff.delay_factor, f"x{backoff.delay_factor:g}"),
        "min_delay": (backoff.min_delay, _seconds(backoff.min_delay)),
        "max_delay": (backoff.max_delay, _seconds(backoff.max_delay)),
        "jitter": (list(backoff.jitter), _jitter(backoff.jitter)),
        "window": (backoff.window, _seconds(backoff.window)),
    }
    values = {}
    for key, (value, text) in shown.items():
        if key in overrides:
            source = (
                f"THROTTLING_SCOPES[{scope!r}]['backoff'] "
                f"({_origin(context.settings, 'THROTTLING_SCOPES')})"
            )
        else:
            setting = _BACKOFF_SETTINGS[key]
            source = f"{setting} ({_origin(context.settings, setting)})"
        values[key] = Value(value, text, source)
    return values


def _scope_manager_value(context: ExplainContext, scope: str, resolved: ScopeConfig) -> Value:
    from slotkit.scope import ThrottlingScopeManager

    cls = resolved.manager or ThrottlingScopeManager
    if "manager" in context.config.scopes.get(scope, {}):
        source = f"THROTTLING_SCOPES[{scope!r}] ({_origin(context.settings, 'THROTTLING_SCOPES')})"
    elif context.config.scope_manager is not None:
        origin = _origin(context.settings, "THROTTLING_SCOPE_MANAGER")
        source = f"THROTTLING_SCOPE_MANAGER ({origin})"
    else:
        source = "slotkit default"
    return Value(_class_path(cls), _class_path(cls), source)


def _explain_scope(
    context: ExplainContext, scope: str, kind: str, primary: bool, amount: float | None
) -> ScopeExplanation:
    from slotkit.scope import ThrottlingScopeManager

    config = context.config
    resolved = config.scope_config(scope, kind)
    uncapped = dataclasses.replace(config, total_concurrency=0).scope_config(scope, kind)
    sources = resolved.sources

    def value(name: str, raw: Any, text: str) -> Value:
        source = sources.get(name, "default")
        return Value(raw, text, _describe_source(context, scope, kind, name, source, uncapped))

    limits = {
        "concurrency": value("concurrency", resolved.concurrency, str(resolved.concurrency)),
        "min_concurrency": value(
            "min_concurrency", resolved.min_concurrency, str(resolved.min_concurrency)
        ),
        "delay": value("delay", resolved.delay, _seconds(resolved.delay)),
        "jitter": value("jitter", list(resolved.jitter), _jitter(resolved.jitter)),
        "scope_manager": _scope_manager_value(context, scope, resolved),
    }
    # Quotas and rampup (read with getattr: explain also works where they are absent).
    if hasattr(resolved, "quota"):
        quota = resolved.quota
        limits["quota"] = value("quota", quota, "none" if quota is None else f"{quota:g}")
        limits["window"] = value("window", resolved.window, _seconds(resolved.window))
    if hasattr(resolved, "rampup"):
        rampup = resolved.rampup
        limits["rampup"] = value(
            "rampup",
            None if rampup is None else dataclasses.asdict(rampup),
            "off" if rampup is None else _rampup(rampup),
        )
    explanation = ScopeExplanation(
        id=scope,
        kind=kind,
        primary=primary,
        amount=amount,
        limits=limits,
        backoff=_backoff_values(context, scope, resolved),
    )
    if resolved.manager not in (None, ThrottlingScopeManager):
        explanation.notes.append(
            "a custom scope manager gets these values through from_crawler(crawler, config) "
            "and may apply them its own way"
        )
    return explanation


# --------------------------------------------------------------------------- explain: scopes


def _run_now(value: Any, where: str) -> tuple[Any, str | None]:
    """Resolve *value* if it needs no event loop; else ``(None, why not)``.

    Plain scope values are returned as they are (slotkit's default manager
    returns values that are awaitable too). A coroutine or other awaitable is
    stepped once: ``async def get_scopes`` methods that await nothing slow
    (the usual case) finish right there.
    """
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure

    if value is None or isinstance(value, (str, Mapping, list, tuple, set, frozenset)):
        return value, None
    if isinstance(value, Deferred):
        results: list[Any] = []
        value.addBoth(results.append)
        if not results:
            return None, f"{where} returned a Deferred that did not fire at once"
        result = results[0]
        if isinstance(result, Failure):
            result.raiseException()
        return result, None
    if inspect.iscoroutine(value):
        try:
            value.send(None)
        except StopIteration as stop:
            return stop.value, None
        value.close()
        return None, f"{where} is async and waits for I/O"
    if inspect.isawaitable(value):
        steps = value.__await__()
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value, None
        return None, f"{where} returned an awaitable that needs an event loop"
    return value, None


def _build_crawler(settings: Settings) -> Any:
    from scrapy import Spider
    from scrapy.crawler import Crawler

    class ExplainSpider(Spider):
        name = "slotkit-explain"

    crawler = Crawler(ExplainSpider, settings)
    if crawler.settings.getdict("ADDONS"):
        crawler.addons.load_settings(crawler.settings)
    return crawler


def explain(url: str, settings: Settings, meta: Mapping[str, Any] | None = None) -> Explanation:
    """Explain how slotkit would throttle a request for *url* under *settings*.

    Raises :class:`~slotkit.SettingsError` for a bad setting and
    :class:`CommandError` for a bad URL or an unusable throttling manager.
    """
    from scrapy import Request

    from slotkit.manager import (
        AUTO_SLOT,
        DOWNLOAD_SLOT,
        ThrottlingManager,
        build_manager,
        normalize_scopes,
        scope_kind,
    )
    from slotkit.settings import DOMAIN, SettingsError, ThrottlingSettings
    from slotkit.status import DEFAULT_INTERVAL
    from slotkit.validation import _number

    try:
        request = Request(url, meta=dict(meta or {}))
    except (TypeError, ValueError) as exc:
        raise CommandError(f"cannot build a request for {url!r}: {exc}") from None
    crawler = _build_crawler(settings)
    settings = crawler.settings
    config = ThrottlingSettings.from_settings(settings)
    stats_interval = _number(
        "THROTTLING_STATS_INTERVAL", settings.get("THROTTLING_STATS_INTERVAL", DEFAULT_INTERVAL)
    )
    try:
        manager = build_manager(crawler, config.manager)
    except SettingsError:
        raise
    except Exception as exc:
        raise CommandError(
            f"THROTTLING_MANAGER {_class_path(config.manager)} could not be built: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    manager_name = _class_path(getattr(manager, "inner", manager).__class__)
    manager_source = (
        "slotkit default"
        if config.manager is None
        else (f"THROTTLING_MANAGER ({_origin(settings, 'THROTTLING_MANAGER')})")
    )
    manager_note = None
    where = f"{manager_name}.get_scopes()"
    try:
        raw, why_not = _run_now(manager.get_scopes(request), where)
    except Exception as exc:
        raise CommandError(f"{where} raised {type(exc).__name__}: {exc}") from None
    if why_not is not None:
        manager_note = f"{why_not}; showing the default scopes (ThrottlingManager) instead"
        raw = ThrottlingManager(crawler).get_scopes(request)
    try:
        scopes = normalize_scopes(raw, where=where)
    except TypeError as exc:
        raise CommandError(str(exc)) from None

    context = ExplainContext(settings, config)
    slot = request.meta.get(DOWNLOAD_SLOT)
    user_slot = str(slot) if slot is not None and slot != request.meta.get(AUTO_SLOT) else None
    explained = []
    for index, (scope_id, amount) in enumerate(scopes.items()):
        # Mirror the downloader: DOWNLOAD_SLOTS keys and a user's download_slot are domain-like.
        kind = DOMAIN if scope_id in config.slots or scope_id == user_slot else scope_kind(scope_id)
        explained.append(_explain_scope(context, scope_id, kind, index == 0, amount))

    crawl = {
        "manager": Value(manager_name, manager_name, manager_source),
        "CONCURRENT_REQUESTS": Value(
            config.total_concurrency,
            f"{config.total_concurrency} (0: no cap)"
            if not config.total_concurrency
            else f"{config.total_concurrency} (caps every scope)",
            _origin(settings, "CONCURRENT_REQUESTS"),
        ),
        "BACKOFF_RESEND": Value(
            config.resend,
            f"{'on' if config.resend else 'off'}, for up to {_seconds(config.resend_timeout)}",
            _origin(settings, "BACKOFF_RESEND"),
        ),
        "THROTTLING_SCOPE_LIMIT": Value(
            config.scope_limit, str(config.scope_limit), _origin(settings, "THROTTLING_SCOPE_LIMIT")
        ),
        "THROTTLING_SCOPE_MAX_IDLE": Value(
            config.scope_max_idle,
            _seconds(config.scope_max_idle),
            _origin(settings, "THROTTLING_SCOPE_MAX_IDLE"),
        ),
        "THROTTLING_STATS_INTERVAL": Value(
            stats_interval,
            _seconds(stats_interval) if stats_interval else "off",
            _origin(settings, "THROTTLING_STATS_INTERVAL"),
        ),
    }
    notes = [note for provider in NOTE_PROVIDERS for note in provider(context)]
    return Explanation(url, manager_name, manager_note, explained, crawl, notes)


#: Values longer than this push their source further right instead of widening the column.
VALUE_WIDTH = 24


def format_explanation(explanation: Explanation) -> str:
    """The text ``python -m slotkit explain`` prints."""
    lines = [f"URL: {explanation.url}"]
    manager = explanation.crawl["manager"]
    lines.append(f"Throttling manager: {manager.shown} ({manager.source})")
    if explanation.manager_note:
        lines.append(f"  note: {explanation.manager_note}")
    lines.append("")
    if not explanation.scopes:
        lines.append(
            "No scopes: the request is not throttled (only CONCURRENT_REQUESTS limits it)."
        )
    else:
        count = len(explanation.scopes)
        ids = ", ".join(scope.id for scope in explanation.scopes)
        lines.append(f"{count} scope{'s' if count > 1 else ''}: {ids}")
        if count > 1:
            lines.append("The request is sent only when every one of its scopes allows it.")
    for scope in explanation.scopes:
        lines.append("")
        tags = [f"{scope.kind} scope"]
        if scope.primary:
            tags.append("primary: reported as download_slot")
        if scope.amount is not None:
            tags.append(f"quota amount {scope.amount:g}")
        lines.append(f"Scope {scope.id!r} ({'; '.join(tags)})")
        rows: list[tuple[str, Value | None]] = [
            (f"  {name}", value) for name, value in scope.limits.items()
        ]
        rows.append(("  backoff", None))
        rows += [(f"    {name}", value) for name, value in scope.backoff.items()]
        name_width = max(len(name) for name, _ in rows)
        value_width = min(VALUE_WIDTH, max(len(v.shown) for _, v in rows if v is not None))
        for name, row in rows:
            if row is None:
                lines.append(name)
            else:
                lines.append(f"{name:<{name_width}}  {row.shown:<{value_width}}  {row.source}")
        lines += [f"  note: {note}" for note in scope.notes]
    lines.append("")
    lines.append("Crawl-wide")
    crawl = [(name, value) for name, value in explanation.crawl.items() if name != "manager"]
    name_width = max(len(name) for name, _ in crawl)
    value_width = min(VALUE_WIDTH, max(len(value.shown) for _, value in crawl))
    for name, value in crawl:
        lines.append(f"  {name:<{name_width}}  {value.shown:<{value_width}}  {value.source}")
    if explanation.notes:
        lines.append("")
        lines.append("Notes")
        lines += [f"  - {note}" for note in explanation.notes]
    return "\n".join(lines)


# --------------------------------------------------------------------------- subcommands


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
