"""Instructions per request, slotkit against the stock downloader, under callgrind.

Run from the repository root (needs ``valgrind`` on PATH; ``apt-get install valgrind``)::

    python -m benchmarks.instructions                 # 1, 100 hosts and a new host per request
    python -m benchmarks.instructions --hosts 1 --small 200 --large 700

Wall-clock throughput on a shared virtual machine swings by more than the
few percent separating the two downloaders. The number of instructions a
crawl executes does not: each case runs the throughput crawl of
:mod:`benchmarks._child` (real engine, in-memory handler) under
``valgrind --tool=callgrind`` at two sizes, and the difference divided by the
difference in requests is the cost of one request, start-up cancelled out.
Results go to stdout and ``benchmarks/results/instructions.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.cli import SLOTKIT_PATH, STOCK_PATH, THROUGHPUT_SETTINGS

ROOT = Path(__file__).resolve().parent.parent
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def instructions(downloader: str, hosts: int, requests: int) -> int:
    """Instructions one crawl of *requests* over *hosts* executes (0 hosts: one per request)."""
    spec = {
        "kind": "throughput",
        "downloader": downloader,
        "requests": requests,
        "hosts": hosts or requests,
        "settings": {**THROUGHPUT_SETTINGS, "CONCURRENT_REQUESTS": 100},
    }
    run = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "benchmarks._child",
            json.dumps(spec),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    found = COLLECTED.search(run.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{run.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions")
    parser.add_argument("--hosts", default="1,100,0", help="host counts; 0 = a new host each")
    parser.add_argument("--small", type=int, default=400, help="requests of the small crawl")
    parser.add_argument("--large", type=int, default=1400, help="requests of the large crawl")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    extra = args.large - args.small
    print(f"{'hosts':>8}  {'stock/request':>14}  {'slotkit/request':>16}  {'slotkit/stock':>13}")
    for hosts in (int(h) for h in args.hosts.split(",")):
        per_request = {}
        for label, path in (("stock", STOCK_PATH), ("slotkit", SLOTKIT_PATH)):
            small = instructions(path, hosts, args.small)
            large = instructions(path, hosts, args.large)
            per_request[label] = (large - small) / extra
        ratio = per_request["slotkit"] / per_request["stock"]
        name = str(hosts) if hosts else "new each"
        print(
            f"{name:>8}  {per_request['stock']:>14,.0f}  "
            f"{per_request['slotkit']:>16,.0f}  {ratio:>13.3f}",
            flush=True,
        )
        rows.append({"hosts": hosts, **per_request, "ratio": ratio})
    out = ROOT / "benchmarks" / "results" / "instructions.json"
    out.write_text(json.dumps({"small": args.small, "large": args.large, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
