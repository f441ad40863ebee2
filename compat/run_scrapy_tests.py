#!/usr/bin/env python
"""Run a slice of Scrapy 2.19.0's own test suite twice and compare the outcomes.

Once with Scrapy's stock downloader and once with ``DOWNLOADER = "slotkit.Downloader"``
(or any class given with ``--downloader``).  Scrapy's test files are never edited: the
setting is injected from outside.

How it works
------------
1. The Scrapy 2.19.0 sdist is fetched from PyPI with ``pip download`` into
   ``compat/.cache/sdist/`` (kept between runs, git-ignored) and unpacked afresh into
   ``compat/.cache/src/`` for every run.
2. That throw-away copy gets two one-line patches: its HTTP(S) and DNS mock servers
   bind 127.0.0.1 instead of every interface.  A pre-flight probe module is copied
   into its ``tests/`` folder.
3. ``compat/inject/`` goes first on ``PYTHONPATH`` for pytest, its xdist workers and
   every subprocess the tests start:

   * ``sitecustomize.py`` swaps ``SLOTKIT_COMPAT_DOWNLOADER`` into
     ``scrapy.settings.default_settings.DOWNLOADER`` the moment that module is first
     imported (so every ``Settings`` object, and therefore ``get_crawler()``, sees
     it), and installs a network guard: wildcard binds are narrowed to loopback,
     non-loopback binds/connects are refused and only local names resolve.
   * ``slotkit_compat_plugin.py`` (``-p slotkit_compat_plugin``) double-checks the
     injection, records every test report as JSON lines, and counts which
     downloader class each ``ExecutionEngine`` really used.

4. Each mode first runs the probe (``tests/slotkit_compat_probe.py``: settings,
   ``get_crawler()`` + engine, one real crawl against Scrapy's mock server, network
   guard), then the selected test files with Scrapy's own pytest configuration
   (``--reactor=asyncio`` from its ``pyproject.toml``), ``-p no:cacheprovider``,
   pytest-xdist (2 workers) and pytest-timeout when available.
5. Tests that pass with the stock downloader but not with the one under test are
   re-run once, serially, to tell real differences from flaky ones.

Results go to stdout and ``compat/.cache/results.json``.  Exit status: 0 when no test
that passes with the stock downloader fails with the one under test, 1 when some do,
2 when the harness itself could not do its job; ``--report-only`` always exits 0.

Typical use::

    python compat/run_scrapy_tests.py --install-deps        # the real comparison
    python compat/run_scrapy_tests.py --dry-run            # both columns stock
    python compat/run_scrapy_tests.py --only stock --files test_crawl.py
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

SCRAPY_VERSION = "2.19.0"
STOCK_DOWNLOADER = "scrapy.core.downloader.Downloader"
DEFAULT_DOWNLOADER = "slotkit.Downloader"

COMPAT_DIR = Path(__file__).resolve().parent
REPO_ROOT = COMPAT_DIR.parent
INJECT_DIR = COMPAT_DIR / "inject"
PROBE_SOURCE = INJECT_DIR / "slotkit_compat_probe.py"
PROBE_TARGET = "tests/slotkit_compat_probe.py"

# Test files of Scrapy 2.19.0 that exercise the downloader's surroundings: the engine,
# crawls, crawler, scheduler and priority queues (which ask the downloader for slot
# keys), AutoThrottle (which drives slot delays), the downloader middlewares that
# re-schedule requests, and the per-slot settings.  Glob patterns, relative to tests/.
DEFAULT_FILES = [
    "test_engine*.py",
    "test_crawl.py",
    "test_crawler.py",
    "test_scheduler*.py",
    "test_pqueues.py",
    "test_extension_throttle.py",
    "test_downloadermiddleware_retry.py",
    "test_downloadermiddleware_robotstxt.py",
    "test_downloadermiddleware_redirect.py",
    "test_downloaderslotssettings.py",
    "test_request_left.py",
]
# More files that touch the downloader less directly (--extended).
EXTENDED_FILES = [
    "test_core_downloader.py",
    "test_downloadermiddleware.py",
    "test_downloadermiddleware_redirect_metarefresh.py",
    "test_crawler_runners.py",
    "test_closespider.py",
    "test_spider_start.py",
    "test_request_attribute_binding.py",
    "test_logstats.py",
    "test_signals.py",
]

# Scrapy's tox.ini [test-requirements] minus coverage, and pytest held below 9.2.
TEST_REQUIREMENTS = [
    "pytest>=8.4.1,<9.2",
    "pytest-twisted>=1.14.3",
    "pytest-timeout",
    "pytest-xdist",
    "pytest-rerunfailures",
    "attrs",
    "pexpect>=4.8.0",
    "psutil",
    "pyftpdlib>=2.0.1",
    "pygments",
    "sybil>=1.3.0",
    # From Scrapy's "extra-deps" env: without it the Rerp robots.txt middleware tests skip.
    "robotexclusionrulesparser",
]
# import name -> (pip requirement, hard requirement?)
IMPORT_CHECKS = {
    "pytest": ("pytest>=8.4.1,<9.2", True),
    "pytest_twisted": ("pytest-twisted>=1.14.3", True),
    "xdist": ("pytest-xdist", False),
    "pytest_timeout": ("pytest-timeout", False),
    "pexpect": ("pexpect>=4.8.0", False),
    "psutil": ("psutil", False),
    "pyftpdlib": ("pyftpdlib>=2.0.1", False),
    "attr": ("attrs", False),
    "robotexclusionrulesparser": ("robotexclusionrulesparser", False),
}

# (file, exact text, replacement): each must match exactly once.
SOURCE_PATCHES = [
    (
        "tests/mockserver/http_base.py",
        "reactor.listenTCP(0, factory)\n",
        'reactor.listenTCP(0, factory, interface="127.0.0.1")\n',
    ),
    (
        "tests/mockserver/http_base.py",
        "reactor.listenSSL(0, factory, context_factory)\n",
        'reactor.listenSSL(0, factory, context_factory, interface="127.0.0.1")\n',
    ),
    (
        "tests/mockserver/dns.py",
        "reactor.listenUDP(0, protocol)\n",
        'reactor.listenUDP(0, protocol, interface="127.0.0.1")\n',
    ),
]

GOOD = {"passed", "xfailed"}
CATEGORIES = ["passed", "failed", "error", "skipped", "xfailed", "xpassed"]


class HarnessError(Exception):
    """The harness could not do its job (as opposed to a test failing)."""


def log(msg: str) -> None:
    print(f"[compat] {msg}", flush=True)


# --------------------------------------------------------------------------- setup


def ensure_deps(install: bool, want_xdist: bool) -> dict[str, bool]:
    if install:
        log("installing Scrapy's test requirements: " + " ".join(TEST_REQUIREMENTS))
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", *TEST_REQUIREMENTS]
        if subprocess.run(cmd, check=False).returncode != 0:
            raise HarnessError("pip install of the test requirements failed")
        importlib.invalidate_caches()
    available = {name: importlib.util.find_spec(name) is not None for name in IMPORT_CHECKS}
    missing_hard = [
        IMPORT_CHECKS[n][0] for n, ok in available.items() if not ok and IMPORT_CHECKS[n][1]
    ]
    if missing_hard:
        raise HarnessError(
            f"missing {', '.join(missing_hard)} in {sys.executable}; re-run with --install-deps"
        )
    out = subprocess.run(
        [sys.executable, "-c", "import pytest; print(pytest.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    major_minor = tuple(int(p) for p in re.findall(r"\d+", out)[:2])
    if major_minor >= (9, 2):
        raise HarnessError(
            f"pytest {out} is installed; Scrapy 2.19's tests need pytest < 9.2 (use --install-deps)"
        )
    for name, ok in available.items():
        if not ok:
            log(f"optional test dependency {IMPORT_CHECKS[name][0]} is missing (--install-deps)")
    if want_xdist and not available["xdist"]:
        log("pytest-xdist missing: running serially")
    return available


def get_sdist(cache: Path) -> Path:
    sdist_dir = cache / "sdist"
    sdist = sdist_dir / f"scrapy-{SCRAPY_VERSION}.tar.gz"
    if sdist.is_file():
        return sdist
    sdist_dir.mkdir(parents=True, exist_ok=True)
    log(f"downloading the Scrapy {SCRAPY_VERSION} sdist from PyPI")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"scrapy=={SCRAPY_VERSION}",
        "-d",
        str(sdist_dir),
    ]
    if subprocess.run(cmd, check=False).returncode != 0 or not sdist.is_file():
        raise HarnessError(f"could not download scrapy=={SCRAPY_VERSION} sdist")
    return sdist


def unpack(sdist: Path, cache: Path) -> Path:
    src_root = cache / "src"
    tree = src_root / f"scrapy-{SCRAPY_VERSION}"
    if tree.exists():
        shutil.rmtree(tree)
    src_root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(src_root, filter="data")
        else:  # Python < 3.10.12: check the member paths ourselves
            for member in tar.getmembers():
                target = (src_root / member.name).resolve()
                if not str(target).startswith(str(src_root.resolve())) or member.issym():
                    raise HarnessError(f"unsafe member in sdist: {member.name}")
            tar.extractall(src_root)
    if not (tree / "tests" / "conftest.py").exists() and not (tree / "conftest.py").exists():
        raise HarnessError(f"unexpected sdist layout in {tree}")
    return tree


def patch_tree(tree: Path) -> list[str]:
    applied = []
    for rel, old, new in SOURCE_PATCHES:
        path = tree / rel
        text = path.read_text(encoding="utf-8")
        if text.count(old) != 1:
            raise HarnessError(f"patch target not found exactly once in {rel}: {old.strip()!r}")
        path.write_text(text.replace(old, new), encoding="utf-8")
        applied.append(f"{rel}: {old.strip()} -> {new.strip()}")
    # Any other server in the mock servers that would listen on every interface?
    listen = re.compile(r"\.listen(TCP|SSL|UDP)\(")
    for path in sorted((tree / "tests" / "mockserver").glob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if listen.search(line) and "interface" not in line:
                log(
                    f"warning: {path.relative_to(tree)}:{n} listens without an interface "
                    "(the network guard narrows it to loopback)"
                )
    shutil.copyfile(PROBE_SOURCE, tree / PROBE_TARGET)
    return applied


def resolve_files(tree: Path, patterns: list[str]) -> tuple[list[str], list[str]]:
    files: list[str] = []
    unmatched: list[str] = []
    for pattern in patterns:
        pattern = pattern.removeprefix("tests/")
        hits = sorted(glob.glob(str(tree / "tests" / pattern)))
        if not hits:
            unmatched.append(pattern)
        for hit in hits:
            rel = Path(hit).relative_to(tree).as_posix()
            if rel not in files:
                files.append(rel)
    return files, unmatched


def path_shim(cache: Path, downloader: str) -> str | None:
    """A PYTHONPATH entry exposing this checkout's slotkit/ when it is not installed."""
    top = downloader.split(".", 1)[0]
    if top != "slotkit" or importlib.util.find_spec("slotkit") is not None:
        return None
    if not (REPO_ROOT / "slotkit" / "__init__.py").exists():
        return None
    # Not the repo root itself: its tests/ package would shadow Scrapy's.
    shim = cache / "pathshim"
    shim.mkdir(parents=True, exist_ok=True)
    link = shim / "slotkit"
    if not link.exists():
        link.symlink_to(REPO_ROOT / "slotkit", target_is_directory=True)
    return str(shim)


# --------------------------------------------------------------------------- loopback watch


def _hex_to_addr(hexaddr: str) -> tuple[str, int]:
    host_hex, port_hex = hexaddr.split(":")
    raw = bytes.fromhex(host_hex)
    if len(raw) == 4:
        host = ".".join(str(b) for b in raw[::-1])
    else:
        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
        flat = b"".join(words)
        host = ":".join(flat[i : i + 2].hex() for i in range(0, 16, 2))
    return host, int(port_hex, 16)


def _is_loopback(host: str) -> bool:
    if "." in host and ":" not in host:
        return host.startswith("127.")
    groups = host.split(":")
    if groups == ["0000"] * 7 + ["0001"]:
        return True
    # ::ffff:127.x.y.z
    return groups[:6] == ["0000"] * 5 + ["ffff"] and groups[6].startswith("7f")


def _listeners() -> dict[str, tuple[str, str, int]]:
    found: dict[str, tuple[str, str, int]] = {}
    for proto in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{proto}").read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) < 10 or fields[3] != "0A":  # LISTEN
                    continue
                host, port = _hex_to_addr(fields[1])
                if not _is_loopback(host):
                    found[fields[9]] = (proto, host, port)
    return found


def _owner_pid(inode: str) -> int | None:
    needle = f"socket:[{inode}]"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == needle:
                        return int(proc.name)
    return None


def _is_descendant(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            return False
    return False


class LoopbackWatch:
    """Polls /proc/net for TCP listeners beyond loopback opened by the run."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.baseline = set(_listeners())
        self.violations: list[dict[str, Any]] = []
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> LoopbackWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            for inode, (proto, host, port) in _listeners().items():
                if inode in self.baseline or inode in self._seen:
                    continue
                self._seen.add(inode)
                pid = _owner_pid(inode)
                if pid is not None and _is_descendant(pid, self.root_pid):
                    self.violations.append({"proto": proto, "host": host, "port": port, "pid": pid})


# --------------------------------------------------------------------------- running pytest


@dataclasses.dataclass
class RunResult:
    mode: str
    downloader: str
    exit_code: int | None
    duration: float
    outcomes: dict[str, str]
    details: dict[str, str]
    engine_downloaders: dict[str, int]
    expected_classes: set[str]
    stats_files: int
    listener_violations: list[dict[str, Any]]
    log_path: str
    summary_line: str
    timed_out: bool


def classify(records: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, str]]:
    phases: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        phases.setdefault(rec["nodeid"], []).append(rec)
    outcomes: dict[str, str] = {}
    details: dict[str, str] = {}
    for nodeid, recs in phases.items():
        by_when = {r["when"]: r for r in recs}
        failed = [r for r in recs if r["outcome"] == "failed"]
        call = by_when.get("call")
        if failed:
            first = failed[0]
            outcome = "failed" if first["when"] == "call" else "error"
            details[nodeid] = first.get("longrepr", "")
        elif any(r["outcome"] == "skipped" for r in recs):
            skipped = next(r for r in recs if r["outcome"] == "skipped")
            outcome = "xfailed" if skipped.get("wasxfail") else "skipped"
            details[nodeid] = skipped.get("longrepr", "")
        elif call is not None and call["outcome"] == "passed":
            outcome = "xpassed" if call.get("wasxfail") else "passed"
        else:
            outcome = "error"
            details[nodeid] = "incomplete reports: " + ",".join(sorted(by_when))
        outcomes[nodeid] = outcome
    return outcomes, details


def build_env(
    downloader: str | None, extra_paths: list[str], run_dir: Path, net_guard: bool
) -> dict[str, str]:
    env = os.environ.copy()
    paths = [str(INJECT_DIR), *extra_paths]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("SLOTKIT_COMPAT_DOWNLOADER", None)
    if downloader is not None:
        env["SLOTKIT_COMPAT_DOWNLOADER"] = downloader
    env["SLOTKIT_COMPAT_OUTCOMES"] = str(run_dir / "outcomes.jsonl")
    env["SLOTKIT_COMPAT_STATS_DIR"] = str(run_dir / "stats")
    env["SLOTKIT_COMPAT_NET_GUARD"] = "1" if net_guard else "0"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_pytest(
    *,
    mode: str,
    tree: Path,
    run_dir: Path,
    targets: list[str],
    downloader: str | None,
    extra_paths: list[str],
    workers: int,
    timeout: float | None,
    run_timeout: float,
    reactor: str | None,
    net_guard: bool,
    pytest_args: list[str],
) -> RunResult:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "stats").mkdir(parents=True)
    env = build_env(downloader, extra_paths, run_dir, net_guard)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        f"--rootdir={tree}",
        "-p",
        "no:cacheprovider",
        "-p",
        "slotkit_compat_plugin",
        "-m",
        "not requires_internet",
        "-q",
        "-rfE",
        f"--junitxml={run_dir / 'junit.xml'}",
    ]
    if reactor:
        cmd.append(f"--reactor={reactor}")
    if workers > 0:
        cmd += ["-n", str(workers)]
    if timeout:
        cmd += [f"--timeout={timeout:g}"]
    cmd += [*pytest_args, *targets]
    log_path = run_dir / "pytest.log"
    (run_dir / "command.txt").write_text(
        " ".join(cmd) + "\n" + f"SLOTKIT_COMPAT_DOWNLOADER={downloader or ''}\n", encoding="utf-8"
    )
    start = time.monotonic()
    timed_out = False
    with log_path.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=tree,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        with LoopbackWatch(proc.pid) as watch:
            try:
                proc.wait(timeout=run_timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                log(f"{mode}: pytest exceeded {run_timeout:g}s, stopping it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    duration = time.monotonic() - start
    records: list[dict[str, Any]] = []
    outcomes_path = run_dir / "outcomes.jsonl"
    if outcomes_path.exists():
        for line in outcomes_path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    outcomes, details = classify(records)
    engines: Counter[str] = Counter()
    expected_classes: set[str] = set()
    stats_files = 0
    for path in (run_dir / "stats").glob("*.json"):
        stats_files += 1
        data = json.loads(path.read_text(encoding="utf-8"))
        engines.update(data.get("engine_downloaders", {}))
        if data.get("expected_class"):
            expected_classes.add(data["expected_class"])
    summary = ""
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    for line in reversed(lines):
        if (
            re.search(r"\b(passed|failed|error|errors|skipped|no tests ran)\b", line)
            and " in " in line
        ):
            summary = line.strip("= ").strip()
            break
    return RunResult(
        mode=mode,
        downloader=downloader or STOCK_DOWNLOADER,
        exit_code=proc.returncode,
        duration=duration,
        outcomes=outcomes,
        details=details,
        engine_downloaders=dict(engines),
        expected_classes=expected_classes,
        stats_files=stats_files,
        listener_violations=watch.violations,
        log_path=str(log_path),
        summary_line=summary,
        timed_out=timed_out,
    )


def check_importable(downloader: str, env: dict[str, str]) -> str | None:
    module, _, name = downloader.rpartition(".")
    code = f"import importlib; getattr(importlib.import_module({module!r}), {name!r})"
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if res.returncode == 0:
        return None
    return (res.stderr.strip().splitlines() or ["?"])[-1]


# --------------------------------------------------------------------------- reporting


def per_file(outcomes: dict[str, str]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for nodeid, outcome in outcomes.items():
        counts = table.setdefault(nodeid.split("::", 1)[0], dict.fromkeys(CATEGORIES, 0))
        counts[outcome] = counts.get(outcome, 0) + 1
    return table


def totals(outcomes: dict[str, str]) -> dict[str, int]:
    counts = dict.fromkeys(CATEGORIES, 0)
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def fmt_counts(c: dict[str, int] | None) -> str:
    if c is None:
        return "-"
    text = f"{c['passed']}/{c['failed']}/{c['error']}/{c['skipped']}"
    extra = [f"{c[k]}{k[:2]}" for k in ("xfailed", "xpassed") if c.get(k)]
    return text + (" +" + ",".join(extra) if extra else "")


def first_line(text: str) -> str:
    """A one-line reason: the first ``E`` line of a traceback plus where it was raised."""
    lines = [line.rstrip() for line in text.strip().splitlines()]
    errors = [line[1:].strip() for line in lines if line.startswith("E ") and line[1:].strip()]
    where = [line for line in lines if re.match(r"^\S+:\d+: \w", line)]
    if errors:
        reason = errors[0] + (f" ({where[-1]})" if where else "")
        return reason[:300]
    for line in reversed(lines):
        line = line.strip()
        if line and not line.startswith(("---", "===", "___")):
            return line[:300]
    return ""


def print_table(runs: dict[str, RunResult], files: list[str]) -> None:
    tables = {mode: per_file(r.outcomes) for mode, r in runs.items()}
    all_files = sorted(set(files) | {f for t in tables.values() for f in t})
    modes = list(runs)
    width = max([len(f) for f in all_files] + [10])
    header = f"{'test file':<{width}}  " + "  ".join(f"{m + ' P/F/E/S':>22}" for m in modes)
    print(header)
    print("-" * len(header))
    for f in all_files:
        cells = "  ".join(f"{fmt_counts(tables[m].get(f)):>22}" for m in modes)
        print(f"{f:<{width}}  {cells}")
    print("-" * len(header))
    cells = "  ".join(f"{fmt_counts(totals(runs[m].outcomes)):>22}" for m in modes)
    print(f"{'TOTAL':<{width}}  {cells}")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run Scrapy 2.19.0's own tests with the stock downloader and with slotkit's.",
        epilog="Arguments after '--' are passed to pytest as they are.",
    )
    parser.add_argument(
        "--downloader",
        default=DEFAULT_DOWNLOADER,
        help=f"class under test (default {DEFAULT_DOWNLOADER})",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help=f"use {STOCK_DOWNLOADER} for the slotkit column as well (validates the harness)",
    )
    parser.add_argument(
        "--only", choices=["stock", "slotkit"], help="run one mode only (no comparison)"
    )
    parser.add_argument(
        "--files",
        nargs="+",
        metavar="PATTERN",
        help="test files (glob patterns relative to Scrapy's tests/) "
        "instead of the default selection",
    )
    parser.add_argument(
        "--extended",
        action="store_true",
        help="add more downloader-adjacent test files to the selection",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="pytest-xdist workers per run, 0 = serial (default 2)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="per-test timeout in seconds, via pytest-timeout (default 180)",
    )
    parser.add_argument(
        "--run-timeout",
        type=float,
        default=1800.0,
        help="limit for one whole pytest run in seconds (default 1800)",
    )
    parser.add_argument(
        "--reactor",
        choices=["asyncio", "default", "none"],
        help="override the --reactor of Scrapy's pytest config (asyncio)",
    )
    parser.add_argument(
        "--install-deps",
        action="store_true",
        help="pip install Scrapy's test requirements into this interpreter",
    )
    parser.add_argument("--report-only", action="store_true", help="always exit 0")
    parser.add_argument(
        "--no-recheck",
        action="store_true",
        help="do not re-run differing tests to weed out flaky ones",
    )
    parser.add_argument(
        "--no-net-guard",
        action="store_true",
        help="disable the socket guard (the mock-server patches still apply)",
    )
    parser.add_argument("--cache-dir", type=Path, default=COMPAT_DIR / ".cache")
    parser.add_argument("--json", type=Path, help="results file (default <cache>/results.json)")
    args, rest = parser.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)} (pytest options go after --)")
    args.pytest_args = rest
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cache: Path = args.cache_dir.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    json_path: Path = args.json or cache / "results.json"
    downloader = STOCK_DOWNLOADER if args.dry_run else args.downloader
    modes = [args.only] if args.only else ["stock", "slotkit"]
    timings: dict[str, float] = {}
    result: dict[str, Any] = {
        "scrapy_version": SCRAPY_VERSION,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "downloaders": {"stock": STOCK_DOWNLOADER, "slotkit": downloader},
        "dry_run": args.dry_run,
        "timings": timings,
    }
    harness_errors: list[str] = []
    runs: dict[str, RunResult] = {}
    probes: dict[str, RunResult] = {}
    differences: list[dict[str, str]] = []
    flaky: list[dict[str, str]] = []
    t_all = time.monotonic()
    try:
        t0 = time.monotonic()
        available = ensure_deps(args.install_deps, args.workers > 0)
        timings["deps"] = time.monotonic() - t0
        t0 = time.monotonic()
        sdist = get_sdist(cache)
        tree = unpack(sdist, cache)
        result["patches"] = patch_tree(tree)
        timings["sdist"] = time.monotonic() - t0
        patterns = list(args.files or DEFAULT_FILES)
        if args.extended:
            patterns += EXTENDED_FILES
        files, unmatched = resolve_files(tree, patterns)
        result["files"] = files
        result["unmatched_patterns"] = unmatched
        for pattern in unmatched:
            log(f"warning: no test file matches {pattern!r} in Scrapy {SCRAPY_VERSION}")
        if not files:
            raise HarnessError("no test files selected")
        workers = args.workers if available["xdist"] else 0
        timeout = args.timeout if available["pytest_timeout"] and args.timeout > 0 else None
        shim = path_shim(cache, downloader)
        extra_paths = [shim] if shim else []
        common = {
            "tree": tree,
            "extra_paths": extra_paths,
            "run_timeout": args.run_timeout,
            "reactor": args.reactor,
            "net_guard": not args.no_net_guard,
            "timeout": timeout,
        }
        for mode in modes:
            mode_downloader = downloader if mode == "slotkit" else None
            if mode_downloader:
                problem = check_importable(
                    mode_downloader,
                    build_env(mode_downloader, extra_paths, cache, not args.no_net_guard),
                )
                if problem:
                    raise HarnessError(f"cannot import {mode_downloader}: {problem}")
            t0 = time.monotonic()
            probe = run_pytest(
                mode=f"{mode}-probe",
                run_dir=cache / "runs" / f"{mode}-probe",
                targets=[PROBE_TARGET],
                downloader=mode_downloader,
                workers=0,
                pytest_args=[],
                **common,
            )
            probes[mode] = probe
            bad = {n: o for n, o in probe.outcomes.items() if o not in ("passed", "skipped")}
            log(f"{mode}: probe {probe.summary_line or probe.exit_code} ({probe.duration:.1f}s)")
            if bad or not probe.outcomes:
                for nodeid in bad:
                    log(f"  {nodeid}: {first_line(probe.details.get(nodeid, ''))}")
                raise HarnessError(f"{mode}: pre-flight probe failed, see {probe.log_path}")
            log(
                f"{mode}: running {len(files)} test files "
                f"(workers={workers}, per-test timeout={timeout})"
            )
            run = run_pytest(
                mode=mode,
                run_dir=cache / "runs" / mode,
                targets=files,
                downloader=mode_downloader,
                workers=workers,
                pytest_args=args.pytest_args,
                **common,
            )
            timings[mode] = time.monotonic() - t0
            runs[mode] = run
            log(
                f"{mode}: {run.summary_line or 'no summary'} (exit {run.exit_code}, "
                f"{run.duration:.1f}s, log {run.log_path})"
            )
            log(f"{mode}: engines built per downloader class: {run.engine_downloaders}")
            if run.timed_out:
                harness_errors.append(f"{mode}: pytest run timed out after {args.run_timeout:g}s")
            if not run.outcomes:
                raise HarnessError(f"{mode}: no test results, see {run.log_path}")
            if run.exit_code not in (0, 1):
                harness_errors.append(
                    f"{mode}: pytest exited {run.exit_code} (internal/usage error?), "
                    f"see {run.log_path}"
                )
            for v in probe.listener_violations + run.listener_violations:
                harness_errors.append(f"{mode}: a test process listened beyond loopback: {v}")
            foreign = {
                k: v for k, v in run.engine_downloaders.items() if k not in run.expected_classes
            }
            if foreign:
                log(
                    f"{mode}: note: engines also built with {foreign} "
                    "(tests that set DOWNLOADER themselves)"
                )

        if "stock" in runs and "slotkit" in runs:
            stock, slot = runs["stock"], runs["slotkit"]
            for nodeid, outcome in sorted(stock.outcomes.items()):
                if outcome not in GOOD:
                    continue
                other = slot.outcomes.get(nodeid, "missing")
                if other not in GOOD:
                    differences.append(
                        {
                            "nodeid": nodeid,
                            "stock": outcome,
                            "slotkit": other,
                            "reason": first_line(slot.details.get(nodeid, "")),
                        }
                    )
            if differences and not args.no_recheck and len(differences) <= 300:
                log(f"re-running {len(differences)} differing test(s) serially with {downloader}")
                t0 = time.monotonic()
                recheck = run_pytest(
                    mode="slotkit-recheck",
                    run_dir=cache / "runs" / "slotkit-recheck",
                    targets=[d["nodeid"] for d in differences],
                    downloader=downloader,
                    workers=0,
                    pytest_args=args.pytest_args,
                    **common,
                )
                timings["recheck"] = time.monotonic() - t0
                confirmed: list[dict[str, str]] = []
                for d in differences:
                    again = recheck.outcomes.get(d["nodeid"], "missing")
                    d["recheck"] = again
                    (flaky if again in GOOD else confirmed).append(d)
                differences = confirmed
            result["improvements"] = sorted(
                n
                for n, o in slot.outcomes.items()
                if o in GOOD and stock.outcomes.get(n, "missing") not in GOOD
            )
    except HarnessError as exc:
        harness_errors.append(str(exc))
    timings["total"] = time.monotonic() - t_all

    # ----------------------------------------------------------------- report
    print()
    if runs:
        print("Per test file: passed/failed/error/skipped (+xfailed, xpassed)")
        print_table(runs, result.get("files", []))
        print()
    for mode, run in runs.items():
        print(
            f"{mode:>8}: {run.downloader}: {run.summary_line} "
            f"[{run.duration:.1f}s, exit {run.exit_code}]"
        )
    if "stock" in runs and "slotkit" in runs:
        print()
        print(f"Differences (pass with stock, not with {downloader}): {len(differences)}")
        for d in differences:
            print(f"  {d['nodeid']}  [{d['stock']} -> {d['slotkit']}]  {d['reason']}")
        if flaky:
            print(f"Flaky (failed with {downloader}, then passed on a serial re-run): {len(flaky)}")
            for d in flaky:
                print(f"  {d['nodeid']}  [{d['slotkit']} -> {d['recheck']}]  {d['reason']}")
        if result.get("improvements"):
            print(f"Pass only with {downloader}: {len(result['improvements'])}")
            for nodeid in result["improvements"]:
                print(f"  {nodeid}")
    for err in harness_errors:
        print(f"HARNESS ERROR: {err}")
    print("Timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))

    result["runs"] = {
        mode: {
            "downloader": run.downloader,
            "exit_code": run.exit_code,
            "duration": round(run.duration, 2),
            "summary": run.summary_line,
            "timed_out": run.timed_out,
            "log": run.log_path,
            "totals": totals(run.outcomes),
            "per_file": per_file(run.outcomes),
            "engine_downloaders": run.engine_downloaders,
            "listener_violations": run.listener_violations,
            "not_passing": {
                n: {"outcome": o, "detail": first_line(run.details.get(n, ""))}
                for n, o in sorted(run.outcomes.items())
                if o not in GOOD
            },
        }
        for mode, run in runs.items()
    }
    result["probes"] = {
        mode: {"summary": p.summary_line, "outcomes": p.outcomes} for mode, p in probes.items()
    }
    result["differences"] = differences
    result["flaky"] = flaky
    result["harness_errors"] = harness_errors
    if "stock" in runs and "slotkit" in runs:
        result["tests"] = {
            n: {
                "stock": runs["stock"].outcomes.get(n, "missing"),
                "slotkit": runs["slotkit"].outcomes.get(n, "missing"),
            }
            for n in sorted(set(runs["stock"].outcomes) | set(runs["slotkit"].outcomes))
        }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"Results written to {json_path}")

    if harness_errors:
        status = 2
    elif differences:
        status = 1
    else:
        status = 0
    if "slotkit" in runs:
        c = totals(runs["slotkit"].outcomes)
        print(
            f"slotkit: {c['passed']} passed, {c['failed'] + c['error']} failed, "
            f"{c['skipped']} skipped"
        )
    return 0 if args.report_only else status


if __name__ == "__main__":
    sys.exit(main())
