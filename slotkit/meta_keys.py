"""The request meta keys slotkit reads, and a word about misspelt ones.

A misspelt setting gets a warning at start (see :mod:`slotkit.validation`);
a misspelt meta key (``throttling_scope``) would otherwise be ignored as
silently, and its request sent with its site's limits only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from slotkit.validation import _closest

logger = logging.getLogger("slotkit")

__all__ = ["META_KEYS", "warn_unknown_meta_keys"]

#: The ``throttling_*`` request meta keys slotkit reads.
META_KEYS = frozenset({"throttling_scopes", "throttling_delay", "throttling_dont_track"})
PREFIX = "throttling"
_WARNED: set[str] = set()


def warn_unknown_meta_keys(meta: Mapping[Any, Any]) -> None:
    """Warn once per key about a ``throttling*`` meta key slotkit does not read."""
    for key in meta:
        if (
            isinstance(key, str)
            and key.startswith(PREFIX)
            and key not in META_KEYS
            and key not in _WARNED
        ):
            _WARNED.add(key)
            logger.warning(
                "slotkit: request meta key %r is not one slotkit reads%s; it is ignored "
                "(keys read: %s)",
                key,
                _closest(key, META_KEYS),
                ", ".join(sorted(META_KEYS)),
            )
