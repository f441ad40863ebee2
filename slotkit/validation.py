"""Checks shared by every setting reader: numbers, integers, jitter, names.

Each check raises :class:`SettingsError` with a message that says where the
value came from, what arrived and what is accepted.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scrapy.settings import SETTINGS_PRIORITIES

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.settings import BaseSettings

__all__ = [
    "NO_JITTER",
    "Jitter",
    "SettingsError",
    "dict_setting",
    "parse_jitter",
    "per_ip_limit",
    "per_ip_setting",
]

logger = logging.getLogger("slotkit")

#: Jitter settings already warned about (a scope's manager parses its own again).
_WARNED_JITTER: set[str] = set()

#: Relative jitter bounds: the delay is multiplied by ``1 + uniform(low, high)``.
Jitter = tuple[float, float]
NO_JITTER: Jitter = (0.0, 0.0)


class SettingsError(ValueError):
    """A setting has a value slotkit cannot use."""


def _describe(value: object) -> str:
    return f"{value!r}, a {type(value).__name__}"


#: Scope option names written for another one, after Scrapy's names or
#: other tools' (lower case): for THROTTLING_SCOPES and DOWNLOAD_SLOTS entries.
SCOPE_KEY_ALIASES = {
    "max_concurrency": "concurrency",  # the ceiling; "min_concurrency" is rampup's floor
    "concurrent_requests": "concurrency",
    "download_delay": "delay",
    "randomize_delay": "jitter",  # DOWNLOAD_SLOTS' flag; THROTTLING_SCOPES has jitter
    "rate_limit": "quota",
    "period": "window",
}


def _closest(
    key: str,
    choices: frozenset[str],
    *,
    aliases: Mapping[str, str] | None = None,
    words: bool = True,
) -> str:
    """``"; did you mean X?"`` for the accepted key *key* was likely meant as, or ``""``.

    Known stand-ins first (*aliases*: ``max_concurrency`` is the ceiling, not
    a typo of ``min_concurrency``), then the same key in another case, then a
    close spelling of the whole key, then (with *words*) of a word that only
    one choice has (``facter`` for ``delay_factor``).
    """
    lowered = key.lower()
    by_lower = {choice.lower(): choice for choice in choices}
    meant = (aliases or {}).get(lowered)
    if meant is None or meant not in choices:
        meant = by_lower.get(lowered)
    if meant is None:
        match = difflib.get_close_matches(lowered, sorted(by_lower), n=1, cutoff=0.6)
        meant = by_lower[match[0]] if match else None
    if meant is None and words:
        owners: dict[str, set[str]] = {}
        for choice in choices:
            for word in choice.lower().split("_"):
                owners.setdefault(word, set()).add(choice)
        unique = {word: next(iter(found)) for word, found in owners.items() if len(found) == 1}
        match = difflib.get_close_matches(lowered, sorted(unique), n=1, cutoff=0.75)
        meant = unique[match[0]] if match else None
    return f"; did you mean {meant!r}?" if meant else ""


def _number(
    where: str,
    value: object,
    *,
    minimum: float = 0.0,
    accepted: str | None = None,
    check: Callable[[float], bool] | None = None,
) -> float:
    """Return *value* as a finite float >= *minimum*, or raise naming *where*.

    *check* narrows the range further (``lambda n: n > 1``) and *accepted*
    says it in words (``"a number > 1"``): a value that is no number at all
    is told the same range as one that is out of it.
    """
    number = math.nan
    if not isinstance(value, bool) and isinstance(value, (int, float, str)):
        with contextlib.suppress(ValueError, OverflowError):
            number = float(value)
    if not math.isfinite(number) or number < minimum or (check is not None and not check(number)):
        accepted = accepted or f"a number >= {minimum:g}"
        raise SettingsError(f"{where} must be {accepted} (got {_describe(value)})")
    return number


def finite_seconds(value: object) -> float | None:
    """*value* as a duration (a finite number of seconds >= 0), or None if it is none.

    For values given at run time (request meta, API arguments), whose callers
    decide between a warning and an error. A bool is no duration.
    """
    if isinstance(value, bool):
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if 0.0 <= seconds < math.inf else None


def _integer(where: str, value: object, *, minimum: int) -> int:
    """Return *value* as an int >= *minimum*, or raise naming *where*."""
    if isinstance(value, bool):
        raise SettingsError(f"{where} must be an integer >= {minimum} (got {_describe(value)})")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = int(value)
    if not isinstance(value, int) or value < minimum:
        raise SettingsError(f"{where} must be an integer >= {minimum} (got {_describe(value)})")
    return value


def parse_jitter(where: str, value: object) -> Jitter:
    """Turn a jitter setting into ``(low, high)`` relative bounds.

    A number ``x`` means ±x; a ``[low, high]`` pair is taken as is; booleans
    follow ``RANDOMIZE_DOWNLOAD_DELAY``: True is ±50%, False is none.
    """
    if isinstance(value, bool):
        return (-0.5, 0.5) if value else NO_JITTER
    pair = command_line_pair(value)
    if isinstance(pair, (list, tuple)):
        if len(pair) != 2:
            raise SettingsError(
                f"{where} must be a number or a [low, high] pair (got {_describe(value)})"
            )
        # A low below -1 is what a number above 1 means (see below), and a
        # scope manager rebuilt from a config reads it back as a pair.
        low = _number(f"{where}[0]", pair[0], minimum=-MAX_JITTER)
        high = _number(f"{where}[1]", pair[1], minimum=-1.0)
        if low > high:
            raise SettingsError(f"{where} must have low <= high (got {value!r})")
        _warn_below_zero(where, value, low)
        return (low, _at_most(f"{where}[1]", high))
    try:
        magnitude = _number(where, value)
    except SettingsError:
        raise SettingsError(
            f"{where} must be a number >= 0 (the share of the delay it may vary by, "
            f"either way), a [low, high] pair, or True/False (got {_describe(value)})"
        ) from None
    magnitude = _at_most(where, magnitude)
    _warn_below_zero(where, value, -magnitude)
    return (-magnitude, magnitude)


def _warn_below_zero(where: str, value: object, low: float) -> None:
    """A jitter reaching below a zero delay: Scrapy takes it too (its gaps are
    floored at 0), so it is no error, but some gaps will be 0."""
    if low >= -1 or where in _WARNED_JITTER:
        return
    _WARNED_JITTER.add(where)
    logger.warning(
        "slotkit: %s = %r reaches below a zero delay: some gaps will be 0 (bursts). "
        "At most 1 (a pair's low at least -1) keeps every gap above 0.",
        where,
        value,
    )


def command_line_pair(value: object, *, bare: bool = False) -> object:
    """A ``[low, high]`` pair written on the command line as ``-s 'NAME=[1,3]'``.

    Scrapy's command line hands every value over as a string. With *bare*,
    ``1,3`` is a pair too (integer settings only: for numbers with a
    fraction, ``0,5`` may well be a decimal comma, and a silent ``[0, 5]``
    would be far from what was meant). Any other string comes back
    unchanged for the caller's own checks.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    elif not (bare and "," in text):
        return value
    return [part.strip() for part in text.split(",")]


#: The largest jitter accepted (a delay times 1 + 100): beyond it the factor is
#: no longer a variation, and near float's limits it would overflow to inf/NaN.
MAX_JITTER = 100.0


def _at_most(where: str, jitter: float) -> float:
    if jitter > MAX_JITTER:
        raise SettingsError(f"{where} must be at most {MAX_JITTER:g} (got {jitter!r})")
    return jitter


def unknown_key(
    where: str, key: object, accepted: frozenset[str], aliases: Mapping[str, str] | None = None
) -> SettingsError:
    """The error for a key *where* does not take, with the closest accepted one."""
    return SettingsError(
        f"{where} has an unknown key {key!r}{_closest(str(key), accepted, aliases=aliases)} "
        f"(accepted keys: {', '.join(sorted(accepted))})"
    )


def as_bool(settings: Any, name: str, default: bool = False) -> bool:
    """``settings.getbool(name)``, refusing values Scrapy cannot read as a boolean."""
    try:
        return bool(settings.getbool(name, default))
    except (ValueError, TypeError):
        raise SettingsError(
            f"{name} must be True or False (got {_describe(settings.get(name))})"
        ) from None


def per_ip_setting(settings: BaseSettings) -> Any:
    """``CONCURRENT_REQUESTS_PER_IP`` as set (0 if unset), read without a warning.

    Scrapy 2.19 warns on every ``get`` of a non-zero value that the setting
    is deprecated in favour of per-domain limits. In slotkit it has a meaning
    of its own (IP scopes), so reading it is no use of a deprecated feature;
    indexing the settings skips that warning.
    """
    value = settings["CONCURRENT_REQUESTS_PER_IP"]
    return 0 if value is None else value


def per_ip_limit(settings: BaseSettings) -> int:
    """``CONCURRENT_REQUESTS_PER_IP`` as an int (see :func:`per_ip_setting`)."""
    return int(per_ip_setting(settings))


def dict_setting(settings: Any, name: str) -> Any:
    """A dict setting; JSON text (``scrapy crawl -s NAME='{...}'``) is parsed first."""
    value = settings.get(name)
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            return settings.getdict(name)
        except (ValueError, TypeError):
            raise SettingsError(
                f"{name} must be a dict, or JSON text of one (got {_describe(value)}"
                f"{_json_problem(value)})"
            ) from None
    return value


def _json_problem(text: str) -> str:
    """Why *text* is no JSON object, for an error message."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        # json's own words say where it stopped: single quotes, True/None and
        # a trailing comma are Python, not JSON.
        return f"; not valid JSON: {exc}; JSON wants double quotes and true/false/null"
    return "; valid JSON, but not an object"


def randomize_jitter(settings: Any) -> Jitter:
    """``RANDOMIZE_DOWNLOAD_DELAY``: Scrapy's boolean, or the spec's factor or pair.

    ``True``/``False`` (and the integers 0 and 1 and their strings, as
    Scrapy reads them) mean ±50% or none; any other number is a factor (0.2
    means ±20%; 1.0, a float, ±100%), and a ``[low, high]`` pair multiplies
    the delay by ``1 + uniform(low, high)``.
    """
    where = "RANDOMIZE_DOWNLOAD_DELAY"
    raw = settings.get(where)
    # A pair, also written "[-0.1,0.3]" on the command line: parse_jitter reads both.
    if isinstance(command_line_pair(raw), (list, tuple)):
        return parse_jitter(where, raw)
    factor = raw if isinstance(raw, (int, float)) and not isinstance(raw, bool) else None
    if isinstance(raw, str):
        try:
            factor = float(raw)
        except ValueError:
            factor = None
    # Scrapy's boolean reads 1 and "1"; the spec's factor 1.0 is a float.
    boolean = isinstance(raw, int) or (isinstance(raw, str) and raw.strip() in ("0", "1"))
    if factor is not None and not (boolean and factor in (0, 1)):
        return parse_jitter(where, factor)
    try:
        return parse_jitter(where, as_bool(settings, where))
    except SettingsError:
        raise SettingsError(
            f"{where} must be true/false, a factor such as 0.2, or a [low, high] pair (got {raw!r})"
        ) from None


def default_jitter(settings: Any) -> Jitter:
    """The jitter of scopes that set none, read the way Scrapy 2.19 reads it.

    ``DOWNLOAD_DELAY_JITTER`` is the current setting; the older boolean
    ``RANDOMIZE_DOWNLOAD_DELAY`` still wins when it was set explicitly at a
    higher priority.
    """
    default_priority = SETTINGS_PRIORITIES["default"]
    randomize_priority = settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
    jitter_priority = settings.getpriority("DOWNLOAD_DELAY_JITTER") or 0
    if randomize_priority > default_priority and randomize_priority > jitter_priority:
        return randomize_jitter(settings)
    return parse_jitter("DOWNLOAD_DELAY_JITTER", settings.get("DOWNLOAD_DELAY_JITTER", 0.5))
