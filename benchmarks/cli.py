"""Command line driver: ``python -m benchmarks [throughput|delay|all] [options]``.

Each crawl runs in a fresh child process (see :mod:`benchmarks._child`);
this module only schedules the children, gathers their JSON results, prints
tables and writes ``benchmarks/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks._shared import RESULT_PREFIX
from benchmarks.stats import median

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
RESULTS_DIR = PACKAGE_DIR / "results"

STOCK_PATH = "scrapy.core.downloader.Downloader"
SLOTKIT_PATH = "slotkit.Downloader"

# Settings every throughput crawl gets (overridable with -s).
THROUGHPUT_SETTINGS: dict[str, Any] = {
    "DOWNLOAD_DELAY": 0,
    # The spider yields nothing, but with the default of 100 Scrapy's scraper
    # spawns 100 asyncio tasks per callback, which more than halves the
    # throughput and hides the downloader's share of the work.
    "CONCURRENT_ITEMS": 1,
}


class Column:
    """One downloader being compared: a label and an import path."""

    def __init__(self, label: str, path: str) -> None:
        self.label = label
        self.path = path
        self.skip_reason: str | None = None


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    parts = [str(REPO_ROOT)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def check_importable(path: str) -> str | None:
    """Return ``None`` if *path* imports in a child process, else the error."""
    module, _, attr = path.rpartition(".")
    code = f"import importlib; getattr(importlib.import_module({module!r}), {attr!r})"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_child_env(),
        cwd=REPO_ROOT,
        check=False,
    )
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {proc.returncode}"


def run_child(spec: dict[str, Any], timeout: float, *, verbose: bool) -> dict[str, Any]:
    """Run one crawl in a child process and return its result dict."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks._child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=_child_env(),
        cwd=REPO_ROOT,
        timeout=timeout,
        check=False,
    )
    result: dict[str, Any] | None = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
    stderr = proc.stderr.strip()
    if result is None:
        tail = "\n".join(stderr.splitlines()[-25:])
        return {
            **spec,
            "problems": [f"child failed (exit {proc.returncode})"],
            "stderr_tail": tail,
        }
    if stderr:
        result["stderr_lines"] = len(stderr.splitlines())
        result["stderr_head"] = "\n".join(stderr.splitlines()[:10])
        if verbose:
            print(f"    [child stderr]\n{stderr}", file=sys.stderr)
    return result


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _parse_settings(pairs: list[str]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            msg = f"-s expects KEY=VALUE, got {pair!r}"
            raise SystemExit(msg)
        settings[key] = _parse_value(value)
    return settings


def _fmt(value: float | None, spec: str = ".1f") -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return format(value, spec)


def _print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def _report_problems(result: dict[str, Any]) -> None:
    if result.get("problems"):
        print(f"    !! {result['downloader']}: {'; '.join(result['problems'])}")
        if result.get("stderr_tail"):
            print("    " + result["stderr_tail"].replace("\n", "\n    "))
    elif result.get("stderr_head"):
        first = result["stderr_head"].splitlines()[0]
        print(f"    note: child wrote {result['stderr_lines']} stderr line(s), first: {first}")


def _order(columns: list[Column], rep: int) -> list[Column]:
    """Alternate the run order between repetitions (A B, B A, A B, ...)."""
    return columns if rep % 2 == 0 else list(reversed(columns))


def bench_throughput(args: argparse.Namespace, columns: list[Column]) -> dict[str, Any]:
    """Run the throughput benchmark and return its JSON-ready summary."""
    settings = {
        **THROUGHPUT_SETTINGS,
        "CONCURRENT_REQUESTS": args.concurrency,
        **({"INMEMORY_LATENCY": args.latency} if args.latency else {}),
        **args.settings,
    }
    active = [c for c in columns if c.skip_reason is None]
    print(
        f"\n== throughput: {args.requests} requests, CONCURRENT_REQUESTS="
        f"{settings['CONCURRENT_REQUESTS']}, latency={args.latency}s, "
        f"{args.reps} repetition(s) per downloader"
    )
    cases: list[dict[str, Any]] = []
    for hosts in args.hosts:
        runs: dict[str, list[dict[str, Any]]] = {c.label: [] for c in active}
        for rep in range(args.reps):
            for col in _order(active, rep):
                spec = {
                    "kind": "throughput",
                    "downloader": col.path,
                    "requests": args.requests,
                    "hosts": hosts,
                    "settings": settings,
                }
                result = run_child(spec, args.timeout, verbose=args.verbose)
                runs[col.label].append(result)
                print(
                    f"  hosts={hosts:<6} rep {rep + 1}/{args.reps} {col.label:<8}"
                    f" {_fmt(result.get('rps'), '.0f'):>7} req/s"
                    f" ({_fmt(result.get('wall_s'), '.2f')} s wall),"
                    f" {_fmt(result.get('rpcs'), '.0f'):>7} req/CPU-s"
                )
                _report_problems(result)
        summary: dict[str, Any] = {}
        for col in active:
            good = [r for r in runs[col.label] if not r.get("problems")]
            summary[col.label] = {
                "median_rps": median([r["rps"] for r in good]) if good else None,
                "median_rpcs": median([r["rpcs"] for r in good]) if good else None,
                "valid_runs": len(good),
                "rps_runs": [r.get("rps") for r in runs[col.label]],
                "rpcs_runs": [r.get("rpcs") for r in runs[col.label]],
            }
        cases.append({"hosts": hosts, "summary": summary, "runs": runs})

    labels = [c.label for c in active]
    ratio_key = _ratio_key(labels)
    headers = ["hosts"]
    for metric in ("req/s", "req/CPU-s"):
        headers += [f"{lab} {metric}" for lab in labels]
        if ratio_key:
            headers.append(f"ratio {metric}")
    rows = []
    for case in cases:
        row = [str(case["hosts"])]
        for key in ("median_rps", "median_rpcs"):
            row += [_fmt(case["summary"][lab][key], ".0f") for lab in labels]
            if ratio_key:
                num = case["summary"][ratio_key[0]][key]
                den = case["summary"][ratio_key[1]][key]
                ratio = num / den if num and den else None
                case["ratio" if key == "median_rps" else "ratio_cpu"] = ratio
                row.append(_fmt(ratio, ".3f"))
        rows.append(row)
    print(
        f"\nthroughput, median of {args.reps} run(s) (higher is better; "
        f"ratio = {ratio_key[2] if ratio_key else 'n/a'}):"
    )
    _print_table(headers, rows)
    return {"settings": settings, "requests": args.requests, "reps": args.reps, "cases": cases}


def _ratio_key(labels: list[str]) -> tuple[str, str, str] | None:
    if "slotkit" in labels and "stock" in labels:
        return ("slotkit", "stock", "slotkit/stock")
    return None


def bench_delay(args: argparse.Namespace, columns: list[Column]) -> dict[str, Any]:
    """Run the delay-precision benchmark and return its JSON-ready summary."""
    settings = {
        "DOWNLOAD_DELAY": args.delay,
        "DOWNLOAD_DELAY_JITTER": 0,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        **({"INMEMORY_LATENCY": args.latency} if args.latency else {}),
        **args.settings,
    }
    active = [c for c in columns if c.skip_reason is None]
    print(
        f"\n== delay precision: {args.delay_requests} requests to one host, "
        f"DOWNLOAD_DELAY={settings['DOWNLOAD_DELAY']}, jitter "
        f"{settings['DOWNLOAD_DELAY_JITTER']}, per-host concurrency "
        f"{settings['CONCURRENT_REQUESTS_PER_DOMAIN']}, {args.delay_reps} run(s) each"
    )
    # The floor: plain callLater chains on the same reactor, no crawl. What a
    # downloader's overshoot adds on top of this row is its own doing.
    floor = Column("reactor", "-")
    active = [*active, floor]
    runs: dict[str, list[dict[str, Any]]] = {c.label: [] for c in active}
    for rep in range(args.delay_reps):
        for col in _order(active, rep):
            spec = {
                "kind": "timer" if col is floor else "delay",
                "downloader": col.path,
                "requests": args.delay_requests,
                "hosts": 1,
                "settings": settings,
            }
            result = run_child(spec, args.timeout, verbose=args.verbose)
            runs[col.label].append(result)
            print(
                f"  rep {rep + 1}/{args.delay_reps} {col.label:<8} "
                f"short gaps {result.get('short_gaps', '-')}/{result.get('gaps', '-')}, "
                f"overshoot p50 {_fmt(result.get('overshoot_p50_ms'), '.2f')} ms, "
                f"p99 {_fmt(result.get('overshoot_p99_ms'), '.2f')} ms"
            )
            _report_problems(result)

    headers = [
        "downloader",
        "gaps",
        "gaps < delay",
        "< delay-1ms",
        "min gap ms",
        "overshoot p50 ms",
        "overshoot p99 ms",
        "overshoot max ms",
    ]
    rows = []
    summary: dict[str, Any] = {}
    for col in active:
        for i, r in enumerate(runs[col.label]):
            label = col.label if len(runs[col.label]) == 1 else f"{col.label} #{i + 1}"
            rows.append(
                [
                    label,
                    str(r.get("gaps", "-")),
                    str(r.get("short_gaps", "-")),
                    str(r.get("short_gaps_1ms", "-")),
                    _fmt(r.get("min_gap_ms"), ".2f"),
                    _fmt(r.get("overshoot_p50_ms"), ".2f"),
                    _fmt(r.get("overshoot_p99_ms"), ".2f"),
                    _fmt(r.get("overshoot_max_ms"), ".2f"),
                ]
            )
        good = [r for r in runs[col.label] if not r.get("problems")]
        summary[col.label] = {
            "short_gaps_total": sum(r["short_gaps"] for r in good),
            "short_gaps_1ms_total": sum(r["short_gaps_1ms"] for r in good),
            "overshoot_p50_ms_median": median([r["overshoot_p50_ms"] for r in good]),
            "overshoot_p99_ms_median": median([r["overshoot_p99_ms"] for r in good]),
            "valid_runs": len(good),
        }
    print(
        "\ndelay precision (gap = time between consecutive dispatches; lower is better;"
        "\n'reactor' = bare callLater chains on the same reactor, the floor):"
    )
    _print_table(headers, rows)
    return {
        "settings": settings,
        "requests": args.delay_requests,
        "reps": args.delay_reps,
        "summary": summary,
        "runs": runs,
    }


def _versions() -> dict[str, str]:
    code = "import scrapy, twisted; print(scrapy.__version__, twisted.__version__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env=_child_env(),
    ).stdout.split()
    return {
        "python": platform.python_version(),
        "scrapy": out[0] if out else "?",
        "twisted": out[1] if len(out) > 1 else "?",
        "platform": platform.platform(),
        "cpu_count": str(os.cpu_count()),
        "loadavg_at_save": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _git_revision() -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() or None


def _write_json(name: str, args: argparse.Namespace, columns: list[Column], data: Any) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {
        "benchmark": name,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "git_revision": _git_revision(),
        "versions": _versions(),
        "downloaders": {c.label: {"path": c.path, "skipped": c.skip_reason} for c in columns},
        "quick": args.quick,
        "results": data,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser for ``python -m benchmarks``."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Compare slotkit.Downloader with Scrapy's stock downloader "
        "through the real Scrapy engine, with an in-memory download handler.",
    )
    p.add_argument(
        "benchmark",
        nargs="?",
        choices=["throughput", "delay", "all"],
        default="all",
        help="which benchmark to run (default: all)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke mode: 1,000 requests over 1/100/1,000 hosts, 1 repetition, 20 delay requests",
    )
    p.add_argument(
        "--downloader",
        choices=["stock", "slotkit", "both"],
        default="both",
        help="run only one downloader (default: both)",
    )
    p.add_argument(
        "--slotkit-path",
        default=SLOTKIT_PATH,
        help=f"import path used for the 'slotkit' column (default: {SLOTKIT_PATH}); "
        "point it at the stock downloader to smoke-test both columns",
    )
    p.add_argument("--requests", type=int, help="throughput: requests per crawl (20000)")
    p.add_argument(
        "--hosts",
        type=lambda s: [int(x) for x in s.split(",")],
        help="throughput: comma-separated host counts (1,100,10000)",
    )
    p.add_argument("--reps", type=int, help="throughput: runs per downloader and case (5)")
    p.add_argument(
        "--concurrency", type=int, default=100, help="CONCURRENT_REQUESTS (default: 100)"
    )
    p.add_argument(
        "--latency",
        type=float,
        default=0.0,
        help="simulated response latency in seconds, via INMEMORY_LATENCY (default: 0)",
    )
    p.add_argument("--delay", type=float, default=0.1, help="delay: DOWNLOAD_DELAY (0.1)")
    p.add_argument("--delay-requests", type=int, help="delay: requests per crawl (200)")
    p.add_argument("--delay-reps", type=int, help="delay: runs per downloader (1)")
    p.add_argument(
        "-s",
        "--set",
        dest="raw_settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Scrapy setting for every crawl (VALUE parsed as JSON if possible)",
    )
    p.add_argument("--name", help="results file stem (default: benchmark name, '-quick' suffixed)")
    p.add_argument(
        "--timeout", type=float, default=900, help="seconds before a child crawl is killed"
    )
    p.add_argument("--no-save", action="store_true", help="do not write JSON results")
    p.add_argument("-v", "--verbose", action="store_true", help="echo child stderr")
    return p


def _apply_defaults(args: argparse.Namespace) -> None:
    quick = args.quick
    if args.requests is None:
        args.requests = 1000 if quick else 20000
    if args.hosts is None:
        args.hosts = [1, 100, 1000] if quick else [1, 100, 10000]
    if args.reps is None:
        args.reps = 1 if quick else 5
    if args.delay_requests is None:
        args.delay_requests = 20 if quick else 200
    if args.delay_reps is None:
        args.delay_reps = 1
    args.settings = _parse_settings(args.raw_settings)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; return the process exit status."""
    args = build_parser().parse_args(argv)
    _apply_defaults(args)

    columns = []
    if args.downloader in ("stock", "both"):
        columns.append(Column("stock", STOCK_PATH))
    if args.downloader in ("slotkit", "both"):
        columns.append(Column("slotkit", args.slotkit_path))
    for col in columns:
        error = check_importable(col.path)
        if error:
            col.skip_reason = f"cannot import {col.path}: {error}"
            print(f"SKIPPING the {col.label} column: {col.skip_reason}")
        elif col.label == "slotkit" and col.path != SLOTKIT_PATH:
            print(f"note: the slotkit column runs {col.path}")
    if all(c.skip_reason for c in columns):
        print("nothing to run")
        return 1

    suffix = "-quick" if args.quick else ""
    todo = ["throughput", "delay"] if args.benchmark == "all" else [args.benchmark]
    failures = 0
    for name in todo:
        data = (
            bench_throughput(args, columns) if name == "throughput" else bench_delay(args, columns)
        )
        failures += _count_failures(data)
        digests = _digests(data)
        if len(digests) > 1:
            print(f"WARNING: slotkit/ sources changed during the run ({sorted(digests)})")
        if not args.no_save:
            stem = f"{args.name}-{name}" if args.name and len(todo) > 1 else args.name
            path = _write_json(stem or f"{name}{suffix}", args, columns, data)
            print(f"results written to {path.relative_to(REPO_ROOT)}")
    if failures:
        print(f"\n{failures} run(s) reported problems (see above)")
        return 2
    return 0


def _all_runs(data: dict[str, Any]) -> list[dict[str, Any]]:
    if "cases" in data:
        return [r for case in data["cases"] for rs in case["runs"].values() for r in rs]
    return [r for rs in data["runs"].values() for r in rs]


def _digests(data: dict[str, Any]) -> set[str]:
    return {r["slotkit_digest"] for r in _all_runs(data) if r.get("slotkit_digest")}


def _count_failures(data: dict[str, Any]) -> int:
    return sum(1 for r in _all_runs(data) if r.get("problems"))
