"""The resolved configuration of one scope: what its scope manager is built from.

:class:`~slotkit.settings.ThrottlingSettings` resolves it from the settings
(defaults, then ``DOWNLOAD_SLOTS``, then ``THROTTLING_SCOPES``); a custom
scope manager receives :meth:`ScopeConfig.as_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slotkit.backoff import BackoffRules
from slotkit.rampup import RampupConfig
from slotkit.validation import NO_JITTER, Jitter

__all__ = ["ScopeConfig"]


@dataclass(frozen=True, slots=True)
class ScopeConfig:
    """The resolved configuration of one scope.

    slotkit's own scope manager is built from it; a custom one receives
    :meth:`as_dict` in ``from_crawler(crawler, config)``. ``backoff`` is a
    :class:`slotkit.backoff.BackoffRules`, the ``"backoff"`` entry of
    :class:`slotkit.BackoffConfig` with every missing key filled in.
    """

    concurrency: int
    delay: float
    jitter: Jitter = NO_JITTER
    min_concurrency: int = 1
    manager: type | None = None
    backoff: BackoffRules = field(default_factory=BackoffRules)
    quota: float | None = None
    window: float = 60.0
    rampup: RampupConfig | None = None
    ignore_robots_txt: bool = False
    #: Where each value came from (``"default"``, ``"THROTTLING_SCOPES"``, ...).
    sources: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The config as the plain dict a scope manager's ``from_crawler`` receives."""
        return {
            "concurrency": self.concurrency,
            "min_concurrency": self.min_concurrency,
            "delay": self.delay,
            "jitter": list(self.jitter),
            "backoff": {
                "http_codes": sorted(self.backoff.http_codes),
                "exceptions": list(self.backoff.exceptions),
                "delay_factor": self.backoff.delay_factor,
                "max_delay": self.backoff.max_delay,
                "min_delay": self.backoff.min_delay,
                "jitter": list(self.backoff.jitter),
                "window": self.backoff.window,
            },
            **({} if self.quota is None else {"quota": self.quota}),
            "window": self.window,
            "rampup": None
            if self.rampup is None
            else {
                "backoff_target": list(self.rampup.target),
                "delay_factor": self.rampup.delay_factor,
                "min_delay": self.rampup.min_delay,
                "window": self.rampup.window,
            },
        }
