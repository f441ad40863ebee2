"""``explain``'s model: the values it reports, the context its extensions see,
and the registries of source describers and crawl-wide note providers (with
the built-in notes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slotkit.setting_names import unknown_setting_names

if TYPE_CHECKING:
    from scrapy.settings import Settings

    from slotkit.settings import ThrottlingSettings

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
    return [
        "AUTOTHROTTLE_ENABLED is on: slotkit applies its equivalents (shown above as "
        "'AutoThrottle mapping') and keeps Scrapy's AutoThrottle from changing delays; "
        "see `python -m slotkit migrate`."
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


def _per_ip_note(context: ExplainContext) -> list[str]:
    limit = context.config.ip_concurrency
    if not limit:
        return []
    return [
        f"CONCURRENT_REQUESTS_PER_IP is {limit}: a request whose host is a name also "
        f"gets its address as a scope (limit {limit}), looked up once at crawl time "
        "before the host's first request; shown above only if the address is already "
        "in Scrapy's DNS cache."
    ]


def _setting_names_note(context: ExplainContext) -> list[str]:
    # The crawl warns of these at start; a misspelt name explains a value
    # that is not what the project meant, so explain says it too.
    return [
        f"the setting {name} is not one slotkit reads{hint}"
        for name, hint in unknown_setting_names(context.settings)
    ]


NOTE_PROVIDERS.extend(
    [_setting_names_note, _downloader_note, _robots_note, _autothrottle_note, _per_ip_note]
)
