"""From stock Scrapy throttling settings (and AutoThrottle) to slotkit's.

Two uses share one table:

* at crawl start, with ``AUTOTHROTTLE_ENABLED = True``, the downloader applies
  the mapping below, silences Scrapy's AutoThrottle extension (so the delay
  is never steered by two controllers) and logs one warning listing the
  settings to write instead;
* ``python -m slotkit migrate`` prints the equivalent settings of a project,
  with a note per change.

=================================  =========================================
AutoThrottle                       slotkit
=================================  =========================================
``AUTOTHROTTLE_ENABLED = True``    nothing: throttling is always on
``AUTOTHROTTLE_START_DELAY``       ``DOWNLOAD_DELAY`` (the larger of the two)
``AUTOTHROTTLE_MAX_DELAY``         ``BACKOFF_MAX_DELAY``
``AUTOTHROTTLE_TARGET_CONCURRENCY``  ``"rampup": True`` on site scopes
``AUTOTHROTTLE_DEBUG = True``      ``THROTTLING_DEBUG = True``
meta ``autothrottle_dont_adjust_delay``  meta ``throttling_dont_track``
=================================  =========================================
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import ScrapyDeprecationWarning
from scrapy.settings import SETTINGS_PRIORITIES

from slotkit.validation import _number, as_bool, default_jitter, per_ip_limit

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger("slotkit")

__all__ = [
    "AutoThrottleMapping",
    "Change",
    "autothrottle_mapping",
    "migration_report",
    "silence_autothrottle",
]

SOURCE = "AutoThrottle mapping"

#: ``DOWNLOAD_SLOTS`` keys that mean the same in ``THROTTLING_SCOPES``.
_SLOT_KEYS_KEPT = frozenset({"concurrency", "delay", "jitter"})


@dataclass(frozen=True, slots=True)
class Change:
    """One setting to write (or drop), and why (*note* may span several lines)."""

    setting: str
    value: Any
    note: str


@dataclass(frozen=True, slots=True)
class AutoThrottleMapping:
    """What AutoThrottle settings mean for slotkit, for a crawl that still has them."""

    delay: float | None
    max_delay: float | None
    debug: bool
    rampup: bool
    #: The project's own DOWNLOAD_DELAY: AutoThrottle never went below it, so
    #: neither does the rampup standing in for it.
    min_delay: float = 0.0


def _float(settings: BaseSettings, name: str, default: float) -> float:
    """A number setting, refused with the setting's name if it is not one."""
    return _number(name, settings.get(name, default))


def _bool(settings: BaseSettings, name: str) -> bool:
    return as_bool(settings, name)


def _explicit(settings: BaseSettings, name: str) -> bool:
    return (settings.getpriority(name) or 0) > SETTINGS_PRIORITIES["default"]


def autothrottle_mapping(settings: BaseSettings) -> AutoThrottleMapping | None:
    """The mapping in force, or ``None`` without ``AUTOTHROTTLE_ENABLED``.

    Explicit slotkit settings win over mapped AutoThrottle ones.
    """
    if not _bool(settings, "AUTOTHROTTLE_ENABLED"):
        return None
    start = _float(settings, "AUTOTHROTTLE_START_DELAY", 5.0)
    own = _float(settings, "DOWNLOAD_DELAY", 0.0)
    delay = max(own, start)
    max_delay = None
    if not _explicit(settings, "BACKOFF_MAX_DELAY"):
        max_delay = _float(settings, "AUTOTHROTTLE_MAX_DELAY", 60.0)
    return AutoThrottleMapping(
        delay=delay,
        max_delay=max_delay,
        debug=_bool(settings, "AUTOTHROTTLE_DEBUG"),
        rampup=_float(settings, "AUTOTHROTTLE_TARGET_CONCURRENCY", 1.0) > 0,
        min_delay=own,
    )


def _autothrottle_changes(settings: BaseSettings) -> list[Change]:
    own = settings.getfloat("DOWNLOAD_DELAY")
    start = settings.getfloat("AUTOTHROTTLE_START_DELAY", 5.0)
    if start > own:
        note = (
            "from AUTOTHROTTLE_START_DELAY: every site's delay, lowered only where rampup "
            "is on (one step per quiet BACKOFF_WINDOW; AutoThrottle lowered it from latency "
            f"within seconds). Without rampup, DOWNLOAD_DELAY = {own!r} (the project's own) "
            "is far faster, and backoff still slows a site that answers 429/5xx"
        )
    else:
        note = (
            "every site's delay: the project's own, which AutoThrottle never went below "
            "(its AUTOTHROTTLE_START_DELAY is not larger)"
        )
    changes = [
        Change("AUTOTHROTTLE_ENABLED", None, "drop it: slotkit throttles every crawl"),
        Change("DOWNLOAD_DELAY", max(own, start), note),
        _max_delay_change(settings),
        Change(
            "example: THROTTLING_SCOPES",
            {"example.com": {"rampup": {"min_delay": own} if own > 0 else True}},
            "from AUTOTHROTTLE_TARGET_CONCURRENCY: rampup probes for the fastest rate a site "
            "tolerates, reacting to 429/5xx instead of latency"
            + (
                f"; min_delay keeps DOWNLOAD_DELAY = {own!r} its floor, as AutoThrottle did"
                if own > 0
                else ""
            ),
        ),
    ]
    if settings.getbool("AUTOTHROTTLE_DEBUG"):
        changes.append(Change("THROTTLING_DEBUG", True, "from AUTOTHROTTLE_DEBUG"))
    changes.append(
        Change(
            "meta: throttling_dont_track",
            True,
            "replaces the autothrottle_dont_adjust_delay request meta key",
        )
    )
    return changes


def _max_delay_change(settings: BaseSettings) -> Change:
    # A BACKOFF_MAX_DELAY the project sets already wins at run time (see
    # autothrottle_mapping): the report must not tell the user to overwrite it.
    if _explicit(settings, "BACKOFF_MAX_DELAY"):
        return Change(
            "BACKOFF_MAX_DELAY",
            settings.getfloat("BACKOFF_MAX_DELAY"),
            "yours, kept: it wins over AUTOTHROTTLE_MAX_DELAY, which can go",
        )
    return Change(
        "BACKOFF_MAX_DELAY",
        settings.getfloat("AUTOTHROTTLE_MAX_DELAY", 60.0),
        "from AUTOTHROTTLE_MAX_DELAY: the longest backoff",
    )


def migration_report(settings: BaseSettings) -> list[Change]:
    """Every change that moves a project's settings to slotkit."""
    changes = [Change("DOWNLOADER", "slotkit.Downloader", "switches slotkit on")]
    if settings.getbool("AUTOTHROTTLE_ENABLED"):
        changes += _autothrottle_changes(settings)
    if _explicit(settings, "RANDOMIZE_DOWNLOAD_DELAY"):
        # What the crawl runs with: a factor (0.2, 1.0) or a pair, besides the
        # boolean, and DOWNLOAD_DELAY_JITTER when it was set above it.
        low, high = default_jitter(settings)
        jitter: float | list[float] = high if low == -high else [low, high]
        changes.append(Change("DOWNLOAD_DELAY_JITTER", jitter, "replaces RANDOMIZE_DOWNLOAD_DELAY"))
    if per_ip_limit(settings) > 0:
        reason = "CONCURRENT_REQUESTS_PER_IP needs a queue that knows IP scopes"
        # The delay the project ends up with: AutoThrottle's start delay counts.
        delays = [c.value for c in changes if c.setting == "DOWNLOAD_DELAY"]
        delay = delays[-1] if delays else settings.getfloat("DOWNLOAD_DELAY")
        if settings.getdict("DOWNLOAD_SLOTS") and delay > 0:
            reason += (
                "\nrequests with a download_slot also keep their address's DOWNLOAD_DELAY "
                "(Scrapy let them skip the per-IP slot): see docs/migration.rst"
            )
        changes.append(
            Change("SCHEDULER_PRIORITY_QUEUE", "slotkit.ThrottlingAwarePriorityQueue", reason)
        )
    slots = settings.getdict("DOWNLOAD_SLOTS")
    if slots:
        scopes: dict[str, dict[str, Any]] = {}
        notes: list[str] = []
        for key, entry in slots.items():
            if isinstance(entry, Mapping):
                scopes[str(key)] = _scope_from_slot(str(key), entry, notes)
            else:
                notes.append(f"DOWNLOAD_SLOTS[{key!r}] is not a dict: left out")
        _keep_project_scopes(settings, scopes, notes)
        changes.append(
            Change(
                "THROTTLING_SCOPES",
                scopes,
                "optional: DOWNLOAD_SLOTS keeps working; THROTTLING_SCOPES also takes backoff, "
                "rampup and quota keys" + "".join(f"\n{note}" for note in notes),
            )
        )
    return changes


def _keep_project_scopes(settings: BaseSettings, scopes: dict[str, Any], notes: list[str]) -> None:
    """Merge the project's own ``THROTTLING_SCOPES`` into *scopes*, as the crawl does.

    The printed setting replaces the project's: without its entries, pasting
    it would drop them (a probe saw a quota go). Key by key the project's
    entry wins over the one made from ``DOWNLOAD_SLOTS``, as at run time.
    """
    try:
        own = settings.getdict("THROTTLING_SCOPES")
    except (TypeError, ValueError):
        notes.append("THROTTLING_SCOPES could not be read: merge your entries by hand")
        return
    for key, entry in own.items():
        made = scopes.get(str(key))
        if isinstance(made, dict) and isinstance(entry, Mapping):
            scopes[str(key)] = {**made, **entry}
        else:
            scopes[str(key)] = entry
    if own:
        notes.append("your THROTTLING_SCOPES entries are kept (key by key they win)")


def _scope_from_slot(key: str, entry: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """A ``DOWNLOAD_SLOTS`` entry as a ``THROTTLING_SCOPES`` entry that means the same.

    ``THROTTLING_SCOPES`` refuses keys it does not know, where ``DOWNLOAD_SLOTS``
    ignores them: the deprecated ``randomize_delay`` becomes the ``jitter`` Scrapy
    derives from it (an explicit ``jitter`` wins), and keys neither of them
    uses are left out. Each translation adds a line to *notes*.
    """
    where = f"DOWNLOAD_SLOTS[{key!r}]"
    scope: dict[str, Any] = {}
    dropped: list[str] = []
    for name, value in entry.items():
        if name in _SLOT_KEYS_KEPT:
            scope[name] = value
        elif name == "randomize_delay":
            if "jitter" in entry:
                notes.append(f"{where}['randomize_delay'] dropped: its 'jitter' wins")
            else:
                scope["jitter"] = 0.5 if value else 0
                notes.append(
                    f"{where}['randomize_delay'] = {value!r} became 'jitter': {scope['jitter']}"
                )
        else:
            dropped.append(repr(name))
    if dropped:
        notes.append(f"{where} keys unknown to Scrapy, left out: {', '.join(dropped)}")
    return scope


def format_report(changes: list[Change]) -> str:
    """The report as settings.py lines, each with its note as a comment."""
    lines = ["# slotkit equivalents of this project's throttling settings", ""]
    for change in changes:
        lines += [f"# {line}" for line in change.note.splitlines()]
        if change.value is None:
            lines.append(f"# {change.setting} = ...  (remove)")
        elif change.setting.startswith("example:"):
            lines.append(f"# {change.setting[9:]} = {change.value!r}")
        elif change.setting.startswith("meta:"):
            lines.append(f"# Request(meta={{{change.setting[6:]!r}: {change.value!r}}})")
        else:
            lines.append(f"{change.setting} = {change.value!r}")
        lines.append("")
    return "\n".join(lines)


def silence_autothrottle(crawler: Crawler) -> None:
    """Take the delay away from Scrapy's AutoThrottle extension, warn once with the mapping.

    The extension (if built) stays loaded but no longer hears its signals,
    so only slotkit steers the delay.
    """
    from scrapy import signals
    from scrapy.extensions.throttle import AutoThrottle

    try:
        extension = crawler.get_extension(AutoThrottle)
    except Exception:
        extension = None
    if extension is not None:
        crawler.signals.disconnect(extension._spider_opened, signal=signals.spider_opened)
        crawler.signals.disconnect(
            extension._response_downloaded, signal=signals.response_downloaded
        )
    lines = "; ".join(
        f"{change.setting} = {change.value!r}"
        for change in _autothrottle_changes(crawler.settings)
        if change.value is not None
    )
    mapping = autothrottle_mapping(crawler.settings)
    rampup = (
        " Until then, rampup starts every site at concurrency 1 (a slot's own concurrency "
        "included) and raises it one step per quiet BACKOFF_WINDOW."
        if mapping is not None and mapping.rampup
        else ""
    )
    own = crawler.settings.getfloat("DOWNLOAD_DELAY")
    start = crawler.settings.getfloat("AUTOTHROTTLE_START_DELAY", 5.0)
    slower = (
        f" Note that every site then starts at AUTOTHROTTLE_START_DELAY = {start:g}s and "
        "only rampup lowers it, one step per quiet BACKOFF_WINDOW: far slower than "
        "AutoThrottle, which followed latency. To crawl at your own pace, drop the "
        f"AUTOTHROTTLE_* settings: DOWNLOAD_DELAY = {own:g} then applies, and backoff still "
        "slows a site that answers 429/5xx."
        if start > own
        else ""
    )
    logger.warning(
        "AUTOTHROTTLE_ENABLED is set: slotkit applies its equivalents and keeps Scrapy's "
        "AutoThrottle from changing delays. Its equivalents: %s (see `python -m slotkit "
        "migrate`).%s%s",
        lines,
        rampup,
        slower,
    )
    # The log line is for people; the warning is for test suites and -W error.
    warnings.warn(
        "AUTOTHROTTLE_ENABLED is deprecated with slotkit.Downloader (slotkit maps it to "
        "throttling settings; `python -m slotkit migrate` prints them)",
        ScrapyDeprecationWarning,
        stacklevel=2,
    )
