"""``explain`` for one scope: its effective limits and backoff settings, each
with a description of the setting (and its priority) it comes from."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from slotkit.cli.common import _origin
from slotkit.cli.explanation import SOURCE_DESCRIBERS, ExplainContext, ScopeExplanation, Value
from slotkit.cli.formatting import _class_path, _codes, _jitter, _rampup, _seconds

if TYPE_CHECKING:
    from scrapy.settings import Settings

    from slotkit.settings import ScopeConfig, ThrottlingSettings

# --------------------------------------------------------------------------- explain: sources


def _default_setting(config: ThrottlingSettings, settings: Settings, kind: str, name: str) -> str:
    """The setting a ``"default"`` source stands for."""
    from scrapy.settings import SETTINGS_PRIORITIES

    if name == "concurrency":
        return config.default_concurrency_setting(kind)
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
        elif key == "max_delay" and _autothrottle_max_delay(context) is not None:
            source = "AUTOTHROTTLE_MAX_DELAY (AutoThrottle mapping)"
        elif (
            key in ("min_delay", "delay_factor")
            and resolved.rampup is not None
            and value != getattr(context.config.backoff, key)
        ):
            source = f"rampup's smaller steps ({_BACKOFF_SETTINGS[key]} not set)"
        else:
            setting = _BACKOFF_SETTINGS[key]
            source = f"{setting} ({_origin(context.settings, setting)})"
        values[key] = Value(value, text, source)
    return values


def _autothrottle_max_delay(context: ExplainContext) -> float | None:
    """The backoff cap the AutoThrottle mapping set (``None`` if it set none)."""
    mapping = context.config.autothrottle
    return None if mapping is None else mapping.max_delay


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
