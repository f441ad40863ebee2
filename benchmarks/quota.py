"""Crawling an API with a fixed-window quota, using a slotkit scope quota.

``python -m benchmarks.quota`` starts a small Twisted web server on
127.0.0.1 (in its own process) that behaves like a metered API: it accepts
``--limit`` requests per fixed ``--window``-second window (windows aligned on
multiples of the window since the Unix epoch, as a counter keyed on
``time // window`` would be), answers every request over that with 429, and
takes ``--latency`` seconds to answer. Every response carries the IETF
draft headers::

    RateLimit-Policy: "default";q=20;w=2
    RateLimit: "default";r=<remaining>;t=<seconds until the window resets>

``t`` is a whole number of seconds rounded up, as the draft's integer type
requires, so a client that honours it may wait up to a second too long.

The crawl runs in another process with ``DOWNLOADER = "slotkit.Downloader"``
and :func:`slotkit_settings`: the site's scope gets ``quota = limit`` and
``window = window``; enough pages for ``--windows`` windows are given as start
requests. The server logs every request (arrival time, status); from that
log the benchmark reports the most requests the server saw in one window
(target: ≤ limit), the mean utilisation of the windows (200s / limit,
target ≥ 90%), the 429s (target 0) and the pages never answered 200.

Utilisation is averaged over the *interior* windows: the first window the
crawl touches starts at a random point of the server's window, and the last
one only holds what was left. Both are in the JSON (``per_window``).

Tables go to stdout; JSON to ``benchmarks/results/quota.json``
(``quota-quick.json`` with ``--quick``, or ``--name``). Exit status 2 if a
target was missed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCOPE = "127.0.0.1"
TARGET_UTILISATION = 90.0


# The server (its own process)


def serve(limit: int, window: float, latency: float, log_path: str) -> int:
    """Run the fixed-window API on a free 127.0.0.1 port until SIGTERM."""
    from twisted.internet import reactor
    from twisted.web import resource, server

    clock: Any = reactor  # the reactor provides many interfaces; mypy knows one at a time

    log = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed at exit
    counts: Counter[int] = Counter()
    policy = f'"default";q={limit};w={window:g}'

    class Api(resource.Resource):
        isLeaf = True

        def render_GET(self, request: Any) -> Any:
            now = time.time()
            index = math.floor(now / window)
            reset = (index + 1) * window - now
            used = counts[index]
            counts[index] = used + 1
            accepted = used < limit
            remaining = max(0, limit - used - 1) if accepted else 0
            status = 200 if accepted else 429
            path = request.path.decode(errors="replace")
            log.write(f"{now:.6f} {status} {index} {path}\n")
            request.setResponseCode(status)
            request.setHeader(b"content-type", b"application/json")
            request.setHeader(b"ratelimit-policy", policy.encode())
            request.setHeader(
                b"ratelimit", f'"default";r={remaining};t={max(1, math.ceil(reset))}'.encode()
            )
            body = json.dumps({"path": path, "ok": accepted}).encode()

            if latency > 0:
                gone: list[bool] = []
                request.notifyFinish().addErrback(lambda _: gone.append(True))

                def finish() -> None:
                    if not gone:  # the client may have hung up meanwhile
                        request.write(body)
                        request.finish()

                clock.callLater(latency, finish)
                return server.NOT_DONE_YET
            return body

    site = server.Site(Api())
    site.noisy = False
    port = clock.listenTCP(0, site, interface="127.0.0.1")
    signal.signal(signal.SIGTERM, lambda *_: clock.callFromThread(clock.stop))
    sys.stdout.write(f"PORT {port.getHost().port}\n")
    sys.stdout.flush()
    clock.run(installSignalHandlers=False)
    log.close()
    return 0


class ApiServer:
    """Start :func:`serve` in a child process; stop it on exit, whatever happened."""

    def __init__(self, limit: int, window: float, latency: float) -> None:
        self.limit = limit
        self.window = window
        self.latency = latency
        fd, self.log_path = tempfile.mkstemp(prefix="slotkit-quota-", suffix=".log")
        os.close(fd)
        self.process: subprocess.Popen[str] | None = None
        self.port: int | None = None

    def __enter__(self) -> ApiServer:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.quota",
                "--serve",
                "--limit",
                str(self.limit),
                "--window",
                str(self.window),
                "--latency",
                str(self.latency),
                "--log",
                self.log_path,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            if not line.startswith("PORT "):
                raise RuntimeError(f"API server did not start (said {line!r})")
            self.port = int(line.split()[1])
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if process.stdout:
            process.stdout.close()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.port}/items/{index:04d}"

    def log(self) -> list[tuple[float, int, int, str]]:
        rows = []
        for raw in Path(self.log_path).read_text(encoding="utf-8").splitlines():
            parts = raw.split(" ", 3)
            if len(parts) == 4:
                rows.append((float(parts[0]), int(parts[1]), int(parts[2]), parts[3]))
        return rows

    def cleanup(self) -> None:
        Path(self.log_path).unlink(missing_ok=True)


# The driver


def slotkit_settings(limit: int, window: float, concurrency: int) -> dict[str, Any]:
    """The user configuration: the API's published quota as the scope's quota.

    ``concurrency`` only bounds how many requests are in flight; the quota
    decides how many go out per window. No ``delay``: the quota is the limit,
    and requests may go out back to back while it lasts.
    """
    return {
        "DOWNLOADER": "slotkit.Downloader",
        "THROTTLING_SCOPES": {
            SCOPE: {"quota": limit, "window": window, "concurrency": concurrency, "delay": 0.0}
        },
    }


def analyse(rows: list[tuple[float, int, int, str]], pages: set[str], limit: int) -> dict[str, Any]:
    per_window: dict[int, Counter[int]] = {}
    for _, status, index, _ in rows:
        per_window.setdefault(index, Counter())[status] += 1
    indexes = sorted(per_window)
    windows = []
    if indexes:
        for index in range(indexes[0], indexes[-1] + 1):
            counter = per_window.get(index, Counter())
            windows.append(
                {
                    "window": index,
                    "requests": sum(counter.values()),
                    "ok": counter.get(200, 0),
                    "rate_limited": counter.get(429, 0),
                }
            )
    interior = windows[1:-1]
    ok_paths = {path for _, status, _, path in rows if status == 200}
    statuses = Counter(status for _, status, _, _ in rows)

    def mean_util(items: list[dict[str, Any]]) -> float | None:
        return 100.0 * sum(w["ok"] for w in items) / (limit * len(items)) if items else None

    return {
        "requests": len(rows),
        "ok": statuses.get(200, 0),
        "rate_limited": statuses.get(429, 0),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "lost": len(pages - ok_paths),
        "windows": len(windows),
        "max_requests_per_window": max((w["requests"] for w in windows), default=0),
        "max_ok_per_window": max((w["ok"] for w in windows), default=0),
        "utilisation_interior_pct": mean_util(interior),
        "utilisation_all_but_last_pct": mean_util(windows[:-1]),
        "min_ok_interior": min((w["ok"] for w in interior), default=None),
        "span_s": rows[-1][0] - rows[0][0] if rows else 0.0,
        "per_window": windows,
        # [seconds since the first request, status, server window] per request
        "log": [[round(t - rows[0][0], 4), status, index] for t, status, index, _ in rows],
    }


def run_one(args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    pages = args.limit * args.windows
    settings = {**slotkit_settings(args.limit, args.window, concurrency), **args.extra}
    server = ApiServer(args.limit, args.window, args.latency)
    try:
        with server:
            urls = [server.url(i) for i in range(pages)]
            spec = {"urls": urls, "settings": settings, "patches": args.patch}
            started = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.ratelimit", "--child", json.dumps(spec)],
                capture_output=True,
                text=True,
                timeout=args.timeout,
                check=False,
            )
            elapsed = time.monotonic() - started
            server.stop()
            rows = server.log()
    finally:
        server.cleanup()
    crawl = None
    for line in proc.stdout.splitlines():
        if line.startswith("RATELIMIT-RESULT "):
            crawl = json.loads(line[len("RATELIMIT-RESULT ") :])
    problems = []
    if proc.returncode != 0 or crawl is None:
        problems.append(f"child exited {proc.returncode}: {proc.stderr[-3000:]}")
    elif crawl.get("finish_reason") != "finished":
        problems.append(f"finish_reason={crawl.get('finish_reason')!r}")
    if args.verbose and proc.stderr:
        sys.stderr.write(proc.stderr[-5000:])
    paths = {f"/items/{i:04d}" for i in range(pages)}
    result = {
        "setup": f"slotkit quota c={concurrency}",
        "concurrency": concurrency,
        "settings": settings,
        "patches": args.patch,
        "pages": pages,
        "process_s": elapsed,
        **analyse(rows, paths, args.limit),
        "crawl": crawl,
        "problems": problems,
    }
    misses = list(problems)
    if result["max_requests_per_window"] > args.limit:
        misses.append(f"{result['max_requests_per_window']} requests in one window > {args.limit}")
    util = result["utilisation_interior_pct"]
    if util is None or util < TARGET_UTILISATION:
        shown = "n/a" if util is None else f"{util:.1f}"
        misses.append(f"utilisation {shown}% < {TARGET_UTILISATION:g}%")
    if result["rate_limited"]:
        misses.append(f"{result['rate_limited']} responses 429")
    if result["lost"]:
        misses.append(f"{result['lost']} pages lost")
    result["target_misses"] = misses
    return result


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    header = (
        f"{'setup':<20} {'pages':>5} {'windows':>7} {'max/win':>7} {'util %':>7} "
        f"{'min 200/win':>11} {'429s':>5} {'lost':>5} {'crawl s':>8}"
    )
    rows = [header, "-" * len(header)]
    for r in results:
        util = r["utilisation_interior_pct"]
        crawl = r.get("crawl") or {}
        rows.append(
            f"{r['setup']:<20} {r['pages']:>5} {r['windows']:>7} {r['max_requests_per_window']:>7} "
            f"{'n/a' if util is None else f'{util:.1f}':>7} {r['min_ok_interior']!s:>11} "
            f"{r['rate_limited']:>5} {r['lost']:>5} {crawl.get('wall_s', 0.0):>8.1f}"
        )
    rows.append("")
    rows.append(
        f"server: {args.limit} requests per fixed {args.window:g} s window, 429 beyond, "
        f"{args.latency * 1000:g} ms per response, RateLimit + RateLimit-Policy headers"
    )
    rows.append(
        "max/win: most requests the server received in one window (limit "
        f"{args.limit}); util: mean 200s / limit over interior windows"
    )
    for r in results:
        per = " ".join(str(w["ok"]) for w in r["per_window"])
        rows.append(f"{r['setup']}: 200s per window: {per}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quota", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="4 windows instead of 10")
    parser.add_argument("--limit", type=int, default=20, help="requests per server window (N)")
    parser.add_argument("--window", type=float, default=2.0, help="server window, seconds (W)")
    parser.add_argument("--windows", type=int, default=None, help="windows' worth of pages (10)")
    parser.add_argument("--latency", type=float, default=0.02, help="server response time, s")
    parser.add_argument(
        "--concurrency",
        default=None,
        help="comma-separated scope concurrencies to run (default 1,4)",
    )
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("-s", dest="extra_raw", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--patch", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--name", default=None)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.limit, args.window, args.latency, args.log)
    from benchmarks.ratelimit import parse_extra

    if args.windows is None:
        args.windows = 4 if args.quick else 10
    if args.concurrency is None:
        args.concurrency = "1,4"
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    args.extra = parse_extra(args.extra_raw)
    results = []
    for rep in range(args.reps):
        for concurrency in concurrencies:
            print(
                f"[{rep + 1}/{args.reps}] slotkit quota, concurrency {concurrency} ...",
                file=sys.stderr,
                flush=True,
            )
            result = run_one(args, concurrency)
            result["rep"] = rep
            results.append(result)
    print(table(results, args))
    status = 0
    for r in results:
        verdict = (
            "all targets met"
            if not r["target_misses"]
            else "MISSED: " + "; ".join(r["target_misses"])
        )
        print(f"{r['setup']} (rep {r['rep'] + 1}): {verdict}")
        status = status or (2 if r["target_misses"] else 0)
    name = args.name or ("quota-quick" if args.quick else "quota")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"{name}.json"
    payload = {
        "benchmark": "quota",
        "argv": sys.argv,
        "args": {k: v for k, v in vars(args).items() if k not in ("extra_raw", "serve", "log")},
        "targets": {
            "max_per_window": args.limit,
            "utilisation_min_pct": TARGET_UTILISATION,
            "rate_limited": 0,
            "lost": 0,
        },
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
        "results": results,
    }
    out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"\nJSON: {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
