"""The request meta keys slotkit reads, and a word about misspelt ones.

A misspelt setting gets a warning at start (see :mod:`slotkit.validation`);
a misspelt meta key (``throttling_scope``, ``throttle_delay``) would
otherwise be ignored as silently, and its request sent with its site's
limits only.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger("slotkit")

__all__ = ["META_KEYS", "MetaKeyCheck", "misspelt_meta_key"]

#: The ``throttling_*`` request meta keys slotkit reads.
META_KEYS = frozenset({"throttling_scopes", "throttling_delay", "throttling_dont_track"})
#: Distinct meta keys judged per crawl before the verdicts are forgotten
#: (keys made up per request must not grow the cache without bound).
MAX_JUDGED = 10_000


def misspelt_meta_key(key: object) -> str | None:
    """What *key* looks like a misspelling of ("" if nothing close), or ``None``
    if it does not look meant for slotkit at all."""
    if not isinstance(key, str) or key in META_KEYS or key.startswith("_"):
        return None
    close = difflib.get_close_matches(key, sorted(META_KEYS), n=1, cutoff=0.8)
    if close:
        return close[0]
    return "" if key.startswith("throttl") else None


class MetaKeyCheck:
    """Warns once per crawl about each meta key that looks meant for slotkit but is not one."""

    def __init__(self) -> None:
        #: key -> what it looks like a misspelling of (None: a key of someone else's).
        self._judged: dict[Any, str | None] = {}

    def check(self, keys: Iterable[Any]) -> None:
        judged = self._judged
        for key in keys:
            if key in judged:
                continue  # the usual case: every key was seen before
            if len(judged) >= MAX_JUDGED:
                judged.clear()
            verdict = judged[key] = misspelt_meta_key(key)
            if verdict is not None:
                logger.warning(
                    "slotkit: request meta key %r is ignored: slotkit reads %s%s",
                    key,
                    ", ".join(sorted(META_KEYS)),
                    f" (did you mean {verdict!r}?)" if verdict else "",
                )
