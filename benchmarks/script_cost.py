"""The shared store's cost per acquire, in instructions of ``redis-server``, under callgrind.

Run from the repository root (needs ``redis-server`` and ``valgrind`` on PATH)::

    python -m benchmarks.script_cost                    # this checkout's script
    python -m benchmarks.script_cost --against HEAD~3   # and an earlier commit's

Redis runs every script call on its one thread, so the script's time per
acquire is both the floor of Redis's own latency and what limits how many
requests per second one Redis serves for all workers. Timings of a 0.1 ms
call on a shared virtual machine swing by half; instruction counts do not.
Each case starts ``redis-server`` on 127.0.0.1 under
``valgrind --tool=callgrind``, registers ``--workers`` workers (ids sharing
a host name, as real ones do), runs a few calls to warm up, zeroes the
counters, runs ``--calls`` acquires of one scope (each giving back the
previous request's lease on the way, as a crawl does), and divides the
instructions counted by the calls. Cases:

``heartbeat``  calls carrying the worker's heartbeat (one per half second
               per worker in a crawl);
``light``      calls without it (the others; not understood by scripts
               before the heartbeat became optional: reported as ``null``).

Results go to stdout and ``benchmarks/results/script_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slotkit.shared.redis_process import free_port, start_redis

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "slotkit" / "shared" / "script.lua"
KEYS = ["{cost}:w", "{cost}:s:a", "{cost}:l:a"]
HOST = "worker-host-7f3a2b"
TOTALS = re.compile(r"^([\d,]+)\s.*PROGRAM TOTALS", re.MULTILINE)


def acquire_argv(worker: str, lease: int, heartbeat: bool) -> list[str]:
    """One acquire of scope ``a`` (no delay, room to spare), giving lease - 1 back."""
    from slotkit.shared.twin import fmt

    head = ["acquire", "", worker, fmt(5.0) if heartbeat else ""]
    head += ["1", f"l{lease - 1}", "3", "1000000"] if lease else ["0"]
    scope = [fmt(1.0), fmt(0.0), "1000000", fmt(-1.0), fmt(60.0), fmt(0.0)]
    scope += [fmt(2.0), fmt(1.0), fmt(60.0), fmt(60.0), fmt(1.0)]
    scope += ["0", "1", fmt(1.0), fmt(0.0), fmt(0.0), "1"]
    return [*head, f"l{lease}", fmt(60.0), fmt(30.0), fmt(600.0), "1", *scope]


def cost(source: str, workers: int, calls: int, heartbeat: bool) -> float | None:
    """Instructions per acquire of *source*, or None if the script refuses the call."""
    import redis

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        callgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        # Under valgrind the server starts some 50 times slower than natively.
        server = start_redis("redis-server", port, tmp, timeout=120, wrapper=callgrind)
        try:
            client = redis.Redis(port=port)
            sha = client.script_load(source)
            far = time.time() + 3600
            others = {f"{HOST}:{1000 + i}:{i:08x}": int(far * 1000) for i in range(workers - 1)}
            if others:
                client.zadd(KEYS[0], others)
            me = f"{HOST}:{1000 + workers}:abcdef12"

            def call(i: int, carry: bool) -> None:
                client.evalsha(sha, len(KEYS), *KEYS, *acquire_argv(me, i, carry))

            for i in range(20):
                call(i, True)
            try:
                call(20, heartbeat)
            except redis.ResponseError:
                return None
            zero = subprocess.run(["callgrind_control", "-z", str(server.pid)], check=False)
            if zero.returncode:
                raise RuntimeError("callgrind_control could not reach the server")
            for i in range(21, 21 + calls):
                call(i, heartbeat)
            subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True)
            dumps = sorted(Path(tmp).glob("callgrind.out*"))
            text = subprocess.run(
                ["callgrind_annotate", str(dumps[-1])], capture_output=True, text=True, check=True
            ).stdout
        finally:
            server.terminate()
            server.wait()
    match = TOTALS.search(text)
    if match is None:
        raise RuntimeError("no PROGRAM TOTALS in callgrind's output")
    return int(match.group(1).replace(",", "")) / calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--against", help="also measure the script of this git revision")
    parser.add_argument("--out", default="script_cost.json")
    args = parser.parse_args(argv)
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate", "redis-server"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found on PATH")
    sources = {"this checkout": SCRIPT.read_text()}
    if args.against:
        sources[args.against] = subprocess.run(
            ["git", "show", f"{args.against}:slotkit/shared/script.lua"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    results: list[dict[str, Any]] = []
    for name, source in sources.items():
        for heartbeat in (True, False):
            per_call = cost(source, args.workers, args.calls, heartbeat)
            row = {
                "script": name,
                "case": "heartbeat" if heartbeat else "light",
                "workers": args.workers,
                "instructions_per_acquire": None if per_call is None else round(per_call),
            }
            print(json.dumps(row), flush=True)
            results.append(row)
    out = ROOT / "benchmarks" / "results" / args.out
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"argv": sys.argv, "results": results}, indent=2))


if __name__ == "__main__":
    main()
