"""How long this machine keeps a runnable process from running: the floor under any p99.

Run from the repository root (no dependencies)::

    python -m benchmarks.stalls --seconds 10

One process spins on the clock for ``--seconds`` and records every gap
between two consecutive readings longer than 0.3 ms: moments it was
runnable and did not run (another task had the CPU, or the hypervisor gave
the virtual CPU to another guest). On an otherwise idle machine every such
gap is the machine's, not the code's; a latency measured across processes
cannot have a p99 below the gaps that come about once per hundred calls.
Also reports the CPU time stolen by the hypervisor in the same period
(``/proc/stat``, Linux). Results go to stdout and
``benchmarks/results/stalls.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GAP = 0.0003


def stolen_ticks() -> tuple[int, int] | None:
    """(stolen, total) CPU ticks since boot, or None off Linux."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return ticks[7], sum(ticks)


def spin(seconds: float) -> list[float]:
    """Read the clock in a tight loop; return every gap longer than :data:`GAP`."""
    gaps = []
    last = time.perf_counter()
    end = last + seconds
    while last < end:
        now = time.perf_counter()
        if now - last > GAP:
            gaps.append(now - last)
        last = now
    return sorted(gaps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    before = stolen_ticks()
    gaps = spin(args.seconds)
    after = stolen_ticks()
    result: dict[str, object] = {
        "seconds": args.seconds,
        "gaps_over_0_3_ms": len(gaps),
        "gaps_over_1_ms": sum(g > 0.001 for g in gaps),
        "gaps_over_2_ms": sum(g > 0.002 for g in gaps),
        "longest_ms": [round(g * 1000, 2) for g in gaps[-5:]],
    }
    if before and after:
        stolen, total = after[0] - before[0], after[1] - before[1]
        result["steal_pct"] = round(100 * stolen / max(total, 1), 2)
    print(json.dumps(result))
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "stalls.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
