"""The shape of one scope's options: ``THROTTLING_SCOPES`` and ``DOWNLOAD_SLOTS`` entries.

Each entry is checked key by key when the crawler starts, and returned with
its values normalised; :class:`slotkit.settings.ThrottlingSettings` combines
them with the crawl-wide settings.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

from slotkit.backoff import BACKOFF_KEYS
from slotkit.validation import (
    _WARNED_JITTER,
    SCOPE_KEY_ALIASES,
    SettingsError,
    _closest,
    _describe,
    _integer,
    _number,
    command_line_pair,
    parse_jitter,
    unknown_key,
)

if TYPE_CHECKING:
    from slotkit.settings import ThrottlingSettings

logger = logging.getLogger("slotkit")

__all__ = [
    "DEFAULT_THROTTLING_SCOPES",
    "RAMPUP_KEYS",
    "RESERVED_SCOPE_KEYS",
    "SCOPE_KEYS",
    "SLOT_KEYS",
    "load_class",
    "parse_target",
    "positive",
    "rampup_entry",
    "slot_entry",
    "validate_scope_entry",
]

#: ``THROTTLING_SCOPES`` when the project does not set it: the site of
#: Scrapy's tutorial is a sandbox made to be crawled, so it may go fast.
#: Setting ``THROTTLING_SCOPES`` (even to ``{}``) replaces it, as with any
#: Scrapy dict setting.
DEFAULT_THROTTLING_SCOPES: dict[str, dict[str, Any]] = {
    "quotes.toscrape.com": {"concurrency": 16, "delay": 0.0},
}


#: Keys a ``THROTTLING_SCOPES`` entry may carry.
SCOPE_KEYS = frozenset(
    {
        "concurrency",
        "min_concurrency",
        "delay",
        "jitter",
        "manager",
        "backoff",
        "quota",
        "window",
        "rampup",
        "ignore_robots_txt",
    }
)
#: Keys that belong to features this release does not have yet. They are
#: refused rather than accepted and ignored, which would be a silent lie.
RESERVED_SCOPE_KEYS: frozenset[str] = frozenset()
#: Keys of a scope's ``"rampup"`` dict.
RAMPUP_KEYS = frozenset({"backoff_target", "delay_factor", "min_delay"})

#: ``DOWNLOAD_SLOTS`` keys Scrapy 2.19 understands.
SLOT_KEYS = frozenset({"concurrency", "delay", "jitter", "randomize_delay"})


def positive(where: str, value: object) -> float:
    return _number(where, value, accepted="a number > 0", check=lambda number: number > 0)


def load_class(where: str, value: object) -> type:
    if isinstance(value, type):
        return value
    if not isinstance(value, str):
        raise SettingsError(f"{where} must be a class or an import path (got {_describe(value)})")
    try:
        loaded = load_object(value)
    except Exception as exc:  # any import-time failure is the setting's fault
        raise SettingsError(f"{where} could not be imported from {value!r}: {exc}") from None
    if not isinstance(loaded, type):
        raise SettingsError(f"{where} must name a class (got {_describe(loaded)})")
    return loaded


def validate_scope_entry(setting: str, scope: object, entry: object) -> dict[str, Any]:
    """Check one ``THROTTLING_SCOPES`` entry; return it with values normalised."""
    if not isinstance(scope, str) or not scope:
        raise SettingsError(f"{setting} keys must be non-empty scope ids (got {_describe(scope)})")
    where = f"{setting}[{scope!r}]"
    _warn_siteless_key(setting, scope)
    if not isinstance(entry, Mapping):
        raise SettingsError(
            f"{where} must be a dict of scope options such as "
            f"{{'concurrency': 2, 'delay': 1.0}} (got {_describe(entry)})"
        )
    result: dict[str, Any] = {}
    for key, value in entry.items():
        if key in RESERVED_SCOPE_KEYS:
            raise SettingsError(
                f"{where}[{key!r}] is not supported by this version of slotkit yet "
                f"(got {_describe(value)}); accepted keys: {', '.join(sorted(SCOPE_KEYS))}"
            )
        if key not in SCOPE_KEYS:
            raise _nested_key(where, key, value) or unknown_key(
                where, key, SCOPE_KEYS, SCOPE_KEY_ALIASES
            )
        if key == "concurrency":
            result[key] = _integer(f"{where}['concurrency']", value, minimum=1)
        elif key == "min_concurrency":
            result[key] = _integer(f"{where}['min_concurrency']", value, minimum=1)
        elif key == "delay":
            result[key] = _number(f"{where}['delay']", value)
        elif key == "jitter":
            result[key] = parse_jitter(f"{where}['jitter']", value)
        elif key == "manager":
            result[key] = load_class(f"{where}['manager']", value)
        elif key == "backoff":
            result[key] = value  # checked against the BACKOFF_* defaults by ThrottlingSettings
        elif key in ("quota", "window"):
            result[key] = positive(f"{where}[{key!r}]", value)
        elif key == "rampup":
            result[key] = rampup_entry(f"{where}['rampup']", value)
        elif key == "ignore_robots_txt":
            if not isinstance(value, bool):
                raise SettingsError(
                    f"{where}['ignore_robots_txt'] must be True or False (got {_describe(value)})"
                )
            result[key] = value
    if result.get("min_concurrency", 1) > result.get("concurrency", math.inf):
        raise SettingsError(
            f"{where}['min_concurrency'] ({result['min_concurrency']}) must not exceed "
            f"its concurrency ({result['concurrency']})"
        )
    return result


#: A host name, with a port perhaps: what a site's scope id looks like.
_HOST_LIKE = re.compile(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+(:\d+)?")
_WARNED_KEYS: set[str] = set()


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _warn_siteless_key(setting: str, scope: str) -> None:
    """Say (once) when a key looks meant for a site but no site's scope id equals it.

    A site's scope id is its lower-case host name (``host:port`` keys match
    whatever their case): ``"http://a.test"`` and ``"A.test"`` match no
    request's site, silently. They still serve requests that name them
    (``throttling_scopes`` meta, ``download_slot``, a custom manager), so
    this is a warning, and a path (``"api.example.com/"``, the spec's
    endpoint recipe) is taken as such a name.
    """
    if scope in _WARNED_KEYS:
        return
    if "://" in scope:
        site = scope.split("://", 1)[1].split("/", 1)[0].lower()
    elif scope != scope.lower() and _HOST_LIKE.fullmatch(scope) and ":" not in scope:
        site = scope.lower()
    elif scope.lower() == "localhost" and scope != "localhost":
        site = "localhost"
    elif scope.startswith("[") and scope.endswith("]"):
        # A URL's host is an IPv6 address without its brackets.
        site = scope[1:-1].lower()
    elif ":" in scope and scope != scope.lower() and _is_ip(scope):
        site = scope.lower()
    elif not scope.isascii() and "." in scope and "/" not in scope:
        # Scrapy sends an internationalized host name in its ASCII form.
        try:
            site = scope.encode("idna").decode("ascii").lower()
        except UnicodeError:
            return
    else:
        return
    _WARNED_KEYS.add(scope)
    logger.warning(
        "slotkit: %s key %r is no site's scope id (a site's is its lower-case host "
        "name, or host:port: %r); as written it only serves requests that name it "
        "(throttling_scopes meta, download_slot or a custom manager)",
        setting,
        scope,
        site,
    )


def _nested_key(where: str, key: object, value: object) -> SettingsError | None:
    """The error for a backoff or rampup option written at the entry's top level."""
    homes = [
        name for name, keys in (("backoff", BACKOFF_KEYS), ("rampup", RAMPUP_KEYS)) if key in keys
    ]
    if not homes:
        return None
    return SettingsError(
        f"{where} has an unknown key {key!r}: it is an option of the scope's "
        f"{' or '.join(repr(home) for home in homes)} dict, as in "
        f"{where}[{homes[0]!r}] = {{{key!r}: {value!r}}} "
        f"(accepted keys here: {', '.join(sorted(SCOPE_KEYS))})"
    )


def parse_target(where: str, value: object) -> tuple[int, int]:
    """A rampup backoff target: an int, or a ``[low, high]`` range."""
    pair = command_line_pair(value, bare=True)
    if isinstance(pair, (list, tuple)):
        if len(pair) != 2:
            raise SettingsError(
                f"{where} must be an integer or a [low, high] pair (got {_describe(value)})"
            )
        low = _integer(f"{where}[0]", pair[0], minimum=0)
        high = _integer(f"{where}[1]", pair[1], minimum=low)
        return (low, high)
    target = _integer(where, value, minimum=0)
    return (target, target)


def rampup_entry(where: str, value: object) -> dict[str, Any] | None:
    """Check a scope's ``"rampup"`` value: a bool, or a dict of overrides."""
    if isinstance(value, bool):
        return {} if value else None
    if not isinstance(value, Mapping):
        raise SettingsError(
            f"{where} must be True, False or a dict with keys from "
            f"{', '.join(sorted(RAMPUP_KEYS))} (got {_describe(value)})"
        )
    result: dict[str, Any] = {}
    for key, item in value.items():
        if key not in RAMPUP_KEYS:
            raise unknown_key(where, key, RAMPUP_KEYS)
        if key == "backoff_target":
            result[key] = parse_target(f"{where}['backoff_target']", item)
        elif key == "delay_factor":
            result[key] = _number(
                f"{where}['delay_factor']",
                item,
                accepted="a number between 0 and 1, exclusive",
                check=lambda factor: 0 < factor < 1,
            )
        else:
            result[key] = _number(f"{where}['min_delay']", item)
    return result


def slot_entry(key: str, entry: object) -> dict[str, Any]:
    """Map a ``DOWNLOAD_SLOTS`` entry onto scope options."""
    where = f"DOWNLOAD_SLOTS[{key!r}]"
    if not isinstance(entry, Mapping):
        raise SettingsError(f"{where} must be a dict (got {_describe(entry)})")
    result: dict[str, Any] = {}
    for name, value in entry.items():
        if name not in SLOT_KEYS:
            # Scrapy ignores unknown DOWNLOAD_SLOTS keys, and configs that work with
            # the stock downloader must keep working: warn instead of failing.
            logger.warning(
                "%s has an unknown key %r%s; ignored, as Scrapy does (accepted keys: %s)",
                where,
                name,
                _closest(str(name), SLOT_KEYS, aliases=SCOPE_KEY_ALIASES),
                ", ".join(sorted(SLOT_KEYS)),
            )
            continue
        if name == "concurrency":
            result["concurrency"] = _integer(f"{where}['concurrency']", value, minimum=1)
        elif name == "delay":
            result["delay"] = _number(f"{where}['delay']", value)
        elif name == "jitter":
            result["jitter"] = parse_jitter(f"{where}['jitter']", value)
        elif name == "randomize_delay" and "jitter" not in entry:
            result["jitter"] = parse_jitter(f"{where}['randomize_delay']", bool(value))
    return result


_WARNED_QUOTAS: set[str] = set()
_WARNED_FLOORS: set[str] = set()


def forget_setting_warnings() -> None:
    """A new crawl starts: its settings' warnings are said again, once each.

    Settings are parsed again after the crawl's start (each scope manager
    reads its entry), hence the sets; kept per process, a second crawl in the
    same process (a test session, ``CrawlerProcess`` with two spiders) was
    told nothing.
    """
    _WARNED_KEYS.clear()
    _WARNED_QUOTAS.clear()
    _WARNED_FLOORS.clear()
    _WARNED_JITTER.clear()


def warn_serial_quotas(
    scopes: Mapping[str, Mapping[str, Any]],
    slots: Mapping[str, Mapping[str, Any]],
    default: int,
    manager: type | None,
    total: int,
) -> None:
    """Say (once per scope) when a quota scope will send one request at a time.

    A scope that is not a site (``"api"``, ``"cost"``) takes its concurrency
    from ``THROTTLING_SCOPE_CONCURRENCY``, 1 by default, as the spec says;
    given a quota and no ``concurrency``, it then spends its quota one
    response time at a time. A probe: 20 units per 2 s with 0.5 s answers
    spent 2 units a second, a fifth of it, with nothing said.
    """
    if default != 1 or manager is not None or total == 1:
        return  # a default chosen, a manager of their own, or one request at a time anyway
    # Here, not at the top: slotkit.scope_ids imports slotkit.settings, which imports us.
    from slotkit.scope_ids import scope_kind
    from slotkit.settings import CUSTOM

    for scope, entry in scopes.items():
        if "quota" not in entry or "concurrency" in entry or "manager" in entry:
            continue
        if entry["quota"] <= 1:
            continue  # one request per window: a concurrency would not spend it faster
        if "concurrency" in slots.get(scope, {}):
            continue  # DOWNLOAD_SLOTS gives it one
        if scope in _WARNED_QUOTAS or scope_kind(scope) != CUSTOM:
            continue
        _WARNED_QUOTAS.add(scope)
        logger.warning(
            "slotkit: THROTTLING_SCOPES[%r] has a quota but no 'concurrency': a scope that "
            "is not a site sends one request at a time (THROTTLING_SCOPE_CONCURRENCY = 1), "
            "which can spend far less than the quota; give it a 'concurrency' (say 8) to "
            "spend it faster",
            scope,
        )


def warn_capped_floors(config: ThrottlingSettings) -> None:
    """Say (once per scope) when a ``min_concurrency`` is above the concurrency
    the scope gets from elsewhere (``CONCURRENT_REQUESTS_PER_DOMAIN``, a
    ``DOWNLOAD_SLOTS`` entry, the ``CONCURRENT_REQUESTS`` cap): the floor is
    lowered to it. Written beside a ``concurrency`` in the same entry, the
    same mistake is refused (:func:`scope_entry`).
    """
    # Here, not at the top: slotkit.scope_ids imports slotkit.settings, which imports us.
    from slotkit.scope_ids import scope_kind
    from slotkit.settings import CAPPED_SOURCE, CUSTOM, DOMAIN

    for scope, entry in config.scopes.items():
        floor = entry.get("min_concurrency")
        if floor is None or scope in _WARNED_FLOORS:
            continue
        # DOWNLOAD_SLOTS keys are sites, as the downloader has them.
        kind = DOMAIN if scope in config.slots else scope_kind(scope)
        resolved = config.scope_config(scope, kind)
        if floor <= resolved.concurrency:
            continue
        _WARNED_FLOORS.add(scope)
        source = resolved.sources.get("concurrency", "default")
        advice = f"give the entry a 'concurrency' of at least {floor} to keep it"
        if source == CAPPED_SOURCE:
            source, advice = "the CONCURRENT_REQUESTS cap", "raise CONCURRENT_REQUESTS to keep it"
        elif source == "default":
            source = config.default_concurrency_setting(kind)
            if kind == CUSTOM:
                # "vm" may be a custom scope, or a request's single-label host.
                source += (
                    f", if {scope!r} is a custom scope; as a request's host it is a site's, "
                    f"with CONCURRENT_REQUESTS_PER_DOMAIN = {config.domain_concurrency}"
                )
        logger.warning(
            "slotkit: THROTTLING_SCOPES[%r]['min_concurrency'] (%d) is above the scope's "
            "concurrency (%d, from %s); it is lowered to %d: %s",
            scope,
            floor,
            resolved.concurrency,
            source,
            resolved.concurrency,
            advice,
        )
