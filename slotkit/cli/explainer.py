""":func:`explain`: the scopes a request would belong to, from the throttling
manager a crawl would build, and the crawl-wide values."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from scrapy.utils.httpobj import urlparse_cached

from slotkit.cli.common import CommandError, _origin
from slotkit.cli.explanation import NOTE_PROVIDERS, ExplainContext, Explanation, Value
from slotkit.cli.formatting import _class_path, _seconds
from slotkit.cli.sources import _explain_scope
from slotkit.meta_keys import misspelt_meta_key

if TYPE_CHECKING:
    from scrapy.settings import Settings

# --------------------------------------------------------------------------- explain: scopes


#: How explain names a --meta throttling_scopes in its errors.
META_WHERE = "the throttling_scopes meta (--meta)"
#: Seconds an async get_scopes may take here (a DNS lookup, say) before the
#: default scopes are shown instead.
RUN_LIMIT = 10.0


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
        return _run_coroutine(value, where)
    if inspect.isawaitable(value):
        steps = value.__await__()
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value, None
        return None, f"{where} returned an awaitable that needs an event loop"
    return value, None


def _run_coroutine(coroutine: Any, where: str) -> tuple[Any, str | None]:
    """Run an async ``get_scopes`` on an asyncio loop of its own, briefly.

    What it awaits through asyncio works as in a crawl (the spec's per-IP
    recipe resolves its host with ``run_in_thread``); a pending Twisted
    Deferred needs the crawl's reactor, which this command does not run.
    The loop runs on a thread of its own: the caller's thread may already
    run one (explain called from a running program).
    """

    def run() -> Any:
        return asyncio.run(asyncio.wait_for(coroutine, RUN_LIMIT))

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="slotkit-explain") as pool:
        try:
            return pool.submit(run).result(), None
        except asyncio.TimeoutError:
            return None, f"{where} did not finish within {RUN_LIMIT:g}s"
        except RuntimeError as exc:
            if "bad yield" not in str(exc):
                raise
            return None, f"{where} is async and waits for I/O on the crawl's Twisted reactor"


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
    from slotkit.scope_ids import is_single_label_site
    from slotkit.scope_managers import check_scope_managers
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
    check_scope_managers(config)  # as the crawl does, so what it refuses is not explained
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
    own_get_scopes = getattr(type(getattr(manager, "inner", manager)), "get_scopes", None)
    if (
        own_get_scopes is ThrottlingManager.get_scopes
        and request.meta.get("throttling_scopes") is not None
    ):
        where = META_WHERE  # the default manager passes it on
    try:
        scopes = normalize_scopes(raw, where=where, empty_ok=where != META_WHERE)
    except TypeError as exc:
        raise CommandError(str(exc)) from None

    context = ExplainContext(settings, config)
    slot = request.meta.get(DOWNLOAD_SLOT)
    user_slot = str(slot) if slot is not None and slot != request.meta.get(AUTO_SLOT) else None
    host = urlparse_cached(request).hostname
    explained = []
    for index, (scope_id, amount) in enumerate(scopes.items()):
        # Mirror the downloader: DOWNLOAD_SLOTS keys, a user's download_slot and
        # a single-label host of the request are domain-like; anything else is
        # what its id says (an address in the URL is an IP scope, whose
        # default is CONCURRENT_REQUESTS_PER_IP when that is on).
        site_like = (
            scope_id in config.slots
            or scope_id == user_slot
            or is_single_label_site(scope_id, host)
        )
        kind = DOMAIN if site_like else scope_kind(scope_id)
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
            _resend_text(settings, config.resend, config.resend_timeout),
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
    for key in meta or {}:
        misspelt = misspelt_meta_key(key)
        if misspelt is not None:
            hint = f" (did you mean {misspelt!r}?)" if misspelt else ""
            notes.append(f"--meta key {key!r} is ignored: slotkit does not read it{hint}")
    return Explanation(url, manager_name, manager_note, explained, crawl, notes)


def _resend_text(settings: Settings, resend: bool, timeout: float) -> str:
    """Whether re-sending is in force: it follows RetryMiddleware's rules."""
    from scrapy.downloadermiddlewares.retry import RetryMiddleware
    from scrapy.utils.conf import build_component_list
    from scrapy.utils.misc import load_object

    if not resend:
        return "off"
    if not settings.getbool("RETRY_ENABLED"):
        return "off (RETRY_ENABLED is False)"
    paths = build_component_list(settings.getwithbase("DOWNLOADER_MIDDLEWARES"))
    classes = [load_object(path) for path in paths]
    if not any(isinstance(c, type) and issubclass(c, RetryMiddleware) for c in classes):
        return "off (no RetryMiddleware among DOWNLOADER_MIDDLEWARES)"
    retry_times = settings.getint("RETRY_TIMES")
    codes = {int(code) for code in settings.getlist("RETRY_HTTP_CODES")}
    where = f"where RetryMiddleware retries (RETRY_TIMES {retry_times}, 429 "
    where += "retried)" if 429 in codes else "not retried)"
    return f"on {where}, for up to {_seconds(timeout)}"
