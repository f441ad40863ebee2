"""pytest plugin for Scrapy compatibility runs (loaded with ``-p slotkit_compat_plugin``).

Environment variables, all set by ``compat/run_scrapy_tests.py``:

``SLOTKIT_COMPAT_DOWNLOADER``
    Import path of the downloader class under test.  ``sitecustomize`` (same folder)
    already swapped it into ``scrapy.settings.default_settings``; this plugin checks
    that it took, applies it itself if it did not, fails the session early when the
    class cannot be imported, and shows it in the report header.
``SLOTKIT_COMPAT_OUTCOMES``
    JSON-lines file that receives one record per test phase report (and per failed
    collection) as they arrive, on the controlling process only, so a run that gets
    killed still leaves what it had.
``SLOTKIT_COMPAT_STATS_DIR``
    Folder where every process (controller and xdist workers) writes, at session end, which
    downloader classes the ``ExecutionEngine`` objects it built really used.
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from pathlib import Path
from typing import IO, Any

import pytest

_DOWNLOADER_ENV = "SLOTKIT_COMPAT_DOWNLOADER"
_OUTCOMES_ENV = "SLOTKIT_COMPAT_OUTCOMES"
_STATS_ENV = "SLOTKIT_COMPAT_STATS_DIR"
_MAX_REPR = 4000

_engine_downloaders: Counter[str] = Counter()
_fallback_used = False
_outcomes_file: IO[str] | None = None


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _apply_downloader(expected: str) -> None:
    global _fallback_used
    from scrapy.settings import Settings, default_settings
    from scrapy.utils.misc import load_object

    current = default_settings.DOWNLOADER
    if current != expected:
        # sitecustomize did not run (shadowed?); patch now, before any test builds Settings.
        _fallback_used = True
        default_settings.DOWNLOADER = expected
    built = Settings()["DOWNLOADER"]
    if built != expected:
        raise pytest.UsageError(
            f"slotkit compat: Settings()['DOWNLOADER'] is {built!r}, expected {expected!r}"
        )
    try:
        load_object(expected)
    except Exception as exc:
        raise pytest.UsageError(
            f"slotkit compat: cannot import DOWNLOADER {expected!r}: {exc!r}"
        ) from exc


def _wrap_engine_init() -> None:
    from scrapy.core.engine import ExecutionEngine

    original = ExecutionEngine.__init__
    if getattr(original, "_slotkit_compat_wrapped", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        downloader = getattr(self, "downloader", None)
        if downloader is not None:
            _engine_downloaders[_class_path(type(downloader))] += 1

    __init__._slotkit_compat_wrapped = True  # type: ignore[attr-defined]
    ExecutionEngine.__init__ = __init__  # type: ignore[method-assign]


def _write_outcome(record: dict[str, Any]) -> None:
    if _outcomes_file is not None:
        _outcomes_file.write(json.dumps(record) + "\n")
        _outcomes_file.flush()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    global _outcomes_file
    expected = os.environ.get(_DOWNLOADER_ENV)
    if expected:
        _apply_downloader(expected)
    _wrap_engine_init()
    out = os.environ.get(_OUTCOMES_ENV)
    if out and not _is_xdist_worker(config):
        _outcomes_file = Path(out).open("a", encoding="utf-8")  # noqa: SIM115 - kept open for the session


def pytest_unconfigure(config: pytest.Config) -> None:
    global _outcomes_file
    if _outcomes_file is not None:
        _outcomes_file.close()
        _outcomes_file = None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    # Written here, not at unconfigure: xdist workers may be torn down before that.
    config = session.config
    stats_dir = os.environ.get(_STATS_ENV)
    if not stats_dir:
        return
    worker = "main"
    if _is_xdist_worker(config):
        worker = str(config.workerinput.get("workerid", "worker"))  # type: ignore[attr-defined]
    from scrapy.settings import default_settings
    from scrapy.utils.misc import load_object

    try:
        expected_class = _class_path(load_object(default_settings.DOWNLOADER))
    except Exception:
        expected_class = None
    data = {
        "worker": worker,
        "pid": os.getpid(),
        "default_settings_downloader": default_settings.DOWNLOADER,
        "expected_class": expected_class,
        "plugin_fallback_patch": _fallback_used,
        "engine_downloaders": dict(_engine_downloaders),
    }
    path = Path(stats_dir) / f"engines-{worker}-{os.getpid()}.json"
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


def pytest_report_header(config: pytest.Config) -> list[str]:
    from scrapy.settings import default_settings

    guard = "off" if os.environ.get("SLOTKIT_COMPAT_NET_GUARD") == "0" else "on"
    return [f"slotkit-compat: DOWNLOADER = {default_settings.DOWNLOADER} (network guard {guard})"]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # pytest-rerunfailures reports intermediate attempts with the outcome "rerun".
    if _outcomes_file is None or str(report.outcome) == "rerun":
        return
    record: dict[str, Any] = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "duration": round(report.duration, 4),
    }
    if hasattr(report, "wasxfail"):
        record["wasxfail"] = True
    if report.skipped and isinstance(report.longrepr, tuple):
        record["longrepr"] = str(report.longrepr[2])[-_MAX_REPR:]  # (path, line, reason)
    elif report.failed or report.skipped:
        record["longrepr"] = report.longreprtext[-_MAX_REPR:]
    _write_outcome(record)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _outcomes_file is None or not report.failed:
        return
    _write_outcome(
        {
            "nodeid": report.nodeid,
            "when": "collect",
            "outcome": "failed",
            "duration": 0.0,
            "longrepr": report.longreprtext[-_MAX_REPR:],
        }
    )
