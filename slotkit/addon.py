"""The Scrapy add-on: switch slotkit on with one line.

In a project's ``settings.py``::

    ADDONS = {"slotkit.Addon": 0}

The add-on sets ``DOWNLOADER = "slotkit.Downloader"`` and, once slotkit's
throttling-aware scheduler is available, ``SCHEDULER`` and
``SCHEDULER_PRIORITY_QUEUE`` too. Every value is written at the ``"addon"``
priority, so anything the user set in the project, on the command line or in
a spider's ``custom_settings`` wins; a value that was not applied for that
reason is named in the log line the add-on writes.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from scrapy.settings import SETTINGS_PRIORITIES

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

logger = logging.getLogger("slotkit")

__all__ = ["Addon"]

#: The priority add-ons write at (Scrapy's ``SETTINGS_PRIORITIES["addon"]``).
ADDON_PRIORITY = "addon"

DOWNLOADER = "slotkit.Downloader"

#: Where the throttling-aware scheduler classes live, and their names there.
SCHEDULER_MODULE = "slotkit.scheduler"
SCHEDULER_CLASS = "ThrottlingAwareScheduler"
PRIORITY_QUEUE_CLASS = "ThrottlingAwarePriorityQueue"


def _scheduler_settings() -> dict[str, str]:
    """``SCHEDULER``/``SCHEDULER_PRIORITY_QUEUE`` values, if slotkit ships those classes yet.

    Both or neither: the scheduler and its priority queue work as a pair.
    """
    try:
        module = importlib.import_module(SCHEDULER_MODULE)
    except ImportError:
        return {}
    if not (hasattr(module, SCHEDULER_CLASS) and hasattr(module, PRIORITY_QUEUE_CLASS)):
        return {}
    return {
        "SCHEDULER": f"{SCHEDULER_MODULE}.{SCHEDULER_CLASS}",
        "SCHEDULER_PRIORITY_QUEUE": f"{SCHEDULER_MODULE}.{PRIORITY_QUEUE_CLASS}",
    }


def _is_slotkit_downloader(value: object) -> bool:
    """Whether the ``DOWNLOADER`` setting *value* is slotkit's downloader (or a subclass)."""
    from scrapy.utils.misc import load_object

    from slotkit.downloader import Downloader

    try:
        cls = value if isinstance(value, type) else load_object(str(value))
    except (ImportError, NameError, ValueError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, Downloader)


class Addon:
    """Scrapy add-on that enables slotkit (``ADDONS = {"slotkit.Addon": 0}``)."""

    def wanted_settings(self) -> list[dict[str, str]]:
        """The settings this add-on writes, in groups that are applied all or nothing."""
        wanted = [{"DOWNLOADER": DOWNLOADER}]
        # ---- Throttling-aware scheduling --------------------------------------------
        # slotkit.scheduler.ThrottlingAwareScheduler / ThrottlingAwarePriorityQueue keep
        # requests whose scopes cannot send yet in the scheduler instead of the
        # downloader. They are set only when slotkit.scheduler provides both, and only
        # together: if the user chose either one, neither is touched.
        # They also need slotkit's downloader: see update_settings().
        scheduler = _scheduler_settings()
        if scheduler:
            wanted.append(scheduler)
        # -------------------------------------------------------------------------------
        return wanted

    def update_settings(self, settings: BaseSettings) -> None:
        """Write :meth:`wanted_settings` at the add-on priority; log what was set and kept."""
        ceiling = SETTINGS_PRIORITIES[ADDON_PRIORITY]
        applied: list[str] = []
        kept: list[str] = []
        for group in self.wanted_settings():
            chosen = {
                name: settings.get(name)
                for name in group
                if (settings.getpriority(name) or 0) > ceiling
            }
            if chosen:
                kept += [f"{name}={value!r}" for name, value in chosen.items()]
                continue
            if "SCHEDULER" in group and not _is_slotkit_downloader(settings.get("DOWNLOADER")):
                # The throttling-aware scheduler asks the downloader when requests may go.
                kept.append("SCHEDULER (DOWNLOADER is not slotkit's)")
                continue
            for name, value in group.items():
                settings.set(name, value, priority=ADDON_PRIORITY)
                applied.append(f"{name}={value}")
        message = "slotkit add-on: set " + (", ".join(applied) or "nothing")
        if kept:
            message += "; kept the user's " + ", ".join(kept)
        logger.info(message)
