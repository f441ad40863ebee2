"""Backoff configuration: what triggers it and how steep the curve is.

``BACKOFF_*`` settings give the crawl-wide values; a scope's ``"backoff"``
dict in ``THROTTLING_SCOPES`` overrides any of ``http_codes``,
``exceptions``, ``delay_factor``, ``max_delay``, ``min_delay`` and
``jitter``, each key left out falling back to its global setting.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

from slotkit.validation import Jitter, SettingsError, _describe, _number, parse_jitter, unknown_key

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "BACKOFF_KEYS",
    "BackoffRules",
    "backoff_from_dict",
    "read_backoff",
    "scope_backoff",
]

DEFAULT_HTTP_CODES = (429, 502, 503, 504, 520, 521, 522, 523, 524)
DEFAULT_EXCEPTIONS = (
    "scrapy.exceptions.DownloadFailedError",
    "scrapy.exceptions.DownloadTimeoutError",
    "scrapy.exceptions.ResponseDataLossError",
)
#: Keys of a scope's ``"backoff"`` dict.
BACKOFF_KEYS = frozenset(
    {"http_codes", "exceptions", "delay_factor", "max_delay", "min_delay", "jitter"}
)


@dataclass(frozen=True, slots=True)
class BackoffRules:
    """The backoff rules of one scope, resolved: every global setting filled in.

    What users write is :class:`slotkit.BackoffConfig`, the ``"backoff"`` dict
    of a ``THROTTLING_SCOPES`` entry, whose missing keys these rules fill.
    """

    http_codes: frozenset[int] = frozenset(DEFAULT_HTTP_CODES)
    exceptions: tuple[type[BaseException], ...] = ()
    delay_factor: float = 2.0
    max_delay: float = 300.0
    min_delay: float = 1.0
    jitter: Jitter = (-0.1, 0.1)
    #: A quiet window after which the delay recovers one step (0: never recovers).
    window: float = 60.0

    def is_trigger_status(self, status: int) -> bool:
        return status in self.http_codes

    def is_trigger_exception(self, exception: BaseException) -> bool:
        return bool(self.exceptions) and isinstance(exception, self.exceptions)


def _http_codes(where: str, value: object) -> frozenset[int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise SettingsError(f"{where} must be a list of HTTP status codes (got {_describe(value)})")
    codes = set()
    for code in value:
        if isinstance(code, str) and code.strip().isdecimal():
            # ["429"]: Scrapy's own RETRY_HTTP_CODES takes digit strings (int() of each).
            code = int(code)
        if isinstance(code, bool) or not isinstance(code, int) or not 100 <= code <= 599:
            raise SettingsError(
                f"{where} must contain HTTP status codes from 100 to 599 (got {_describe(code)})"
            )
        codes.add(code)
    return frozenset(codes)


def _exceptions(where: str, value: object) -> tuple[type[BaseException], ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise SettingsError(
            f"{where} must be a list of exception classes or import paths (got {_describe(value)})"
        )
    classes = []
    for item in value:
        loaded: Any = item
        if isinstance(item, str):
            try:
                loaded = load_object(item)
            except Exception as exc:  # any import-time failure is the setting's fault
                raise SettingsError(
                    f"{where} names {item!r}, which cannot be imported: {exc}"
                ) from None
        if not (isinstance(loaded, type) and issubclass(loaded, BaseException)):
            raise SettingsError(f"{where} must contain exception classes (got {_describe(item)})")
        classes.append(loaded)
    return tuple(classes)


def _factor(where: str, value: object) -> float:
    return _number(where, value, accepted="a number > 1", check=lambda factor: factor > 1.0)


#: Shortest window accepted: below it, window arithmetic would stall in float rounding.
MIN_WINDOW = 0.001


def _window(value: object) -> float:
    return _number(
        "BACKOFF_WINDOW",
        value,
        accepted=f"0 (no recovery, no rampup) or a number >= {MIN_WINDOW:g}",
        check=lambda window: window == 0 or window >= MIN_WINDOW,
    )


def _check_bounds(where: str, config: BackoffRules) -> BackoffRules:
    # A max below the (default) min is a request for short backoffs, not a
    # contradiction worth stopping the crawl: the cap wins.
    if config.min_delay > config.max_delay:
        return replace(config, min_delay=config.max_delay)
    return config


def _from_command_line(value: object) -> object:
    """``"429,503"`` (as ``scrapy crawl -s`` passes lists) as a list; anything else as is.

    Digit-only items become ints, as Scrapy's ``getlist`` users would expect
    of status codes; the other checks then apply unchanged. A JSON list
    (``-s 'BACKOFF_HTTP_CODES=[429,503]'``) is read as one, as ``python -m
    slotkit explain`` reads it (an acceptance probe: the crawl refused it).
    """
    if not isinstance(value, str):
        return value
    if value.lstrip().startswith("["):
        with contextlib.suppress(ValueError):
            parsed = json.loads(value)
            if isinstance(parsed, list):
                return parsed
    items = [item.strip() for item in value.split(",") if item.strip()]
    return [int(item) if item.isdecimal() else item for item in items]


def read_backoff(settings: BaseSettings) -> BackoffRules:
    """The crawl-wide backoff rules from the ``BACKOFF_*`` settings."""
    codes = _from_command_line(settings.get("BACKOFF_HTTP_CODES"))
    exceptions = _from_command_line(settings.get("BACKOFF_EXCEPTIONS"))
    config = BackoffRules(
        http_codes=_http_codes(
            "BACKOFF_HTTP_CODES", DEFAULT_HTTP_CODES if codes is None else codes
        ),
        exceptions=_exceptions(
            "BACKOFF_EXCEPTIONS", DEFAULT_EXCEPTIONS if exceptions is None else exceptions
        ),
        delay_factor=_factor("BACKOFF_DELAY_FACTOR", settings.get("BACKOFF_DELAY_FACTOR", 2.0)),
        max_delay=_number("BACKOFF_MAX_DELAY", settings.get("BACKOFF_MAX_DELAY", 300.0)),
        min_delay=_number("BACKOFF_MIN_DELAY", settings.get("BACKOFF_MIN_DELAY", 1.0)),
        jitter=parse_jitter("BACKOFF_JITTER", settings.get("BACKOFF_JITTER", 0.1)),
        window=_window(settings.get("BACKOFF_WINDOW", 60.0)),
    )
    return _check_bounds("BACKOFF_MIN_DELAY/BACKOFF_MAX_DELAY", config)


def scope_backoff(default: BackoffRules, where: str, entry: object) -> BackoffRules:
    """Apply a scope's ``"backoff"`` overrides to *default*; raise naming *where* on bad input."""
    if not isinstance(entry, Mapping):
        raise SettingsError(
            f"{where} must be a dict with keys from {', '.join(sorted(BACKOFF_KEYS))} "
            f"(got {_describe(entry)})"
        )
    changes: dict[str, Any] = {}
    for key, value in entry.items():
        if key not in BACKOFF_KEYS:
            raise unknown_key(where, key, BACKOFF_KEYS)
        item = f"{where}[{key!r}]"
        if key == "http_codes":
            changes[key] = _http_codes(item, value)
        elif key == "exceptions":
            changes[key] = _exceptions(item, value)
        elif key == "delay_factor":
            changes[key] = _factor(item, value)
        elif key == "jitter":
            changes[key] = parse_jitter(item, value)
        else:
            changes[key] = _number(item, value)
    return _check_bounds(where, replace(default, **changes))


def capped(delay: float, config: BackoffRules) -> tuple[float, bool]:
    """*delay* capped at ``max_delay``, and whether the cap bit."""
    if math.isfinite(delay) and delay <= config.max_delay:
        return delay, False
    return config.max_delay, True


def backoff_from_dict(raw: Any) -> BackoffRules | None:
    """Rebuild a :class:`BackoffRules` from a scope config dict (``None``: the defaults)."""
    if not raw:
        return None
    overrides = {key: value for key, value in raw.items() if key != "window"}
    config = scope_backoff(BackoffRules(), "backoff", overrides)
    if "window" in raw:
        config = replace(config, window=float(raw["window"]))
    return config
