"""End-to-end smoke check of the benchmark harness.

``python -m benchmarks.smoke`` runs ``python -m benchmarks --quick`` with the
stock downloader in *both* columns (so it works before ``slotkit.Downloader``
exists), checks the exit status, and checks the JSON files it wrote. It
takes well under a minute.
"""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.cli import REPO_ROOT, RESULTS_DIR, STOCK_PATH, _child_env


def main() -> int:
    """Run the quick benchmark against the stock downloader; 0 on success."""
    name = "smoke"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks",
        "--quick",
        "--slotkit-path",
        STOCK_PATH,
        "--name",
        name,
    ]
    print("running:", " ".join(cmd[1:]))
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=_child_env(), check=False)
    errors = []
    if proc.returncode != 0:
        errors.append(f"benchmark exited with status {proc.returncode}")
    for part in ("throughput", "delay"):
        path = RESULTS_DIR / f"{name}-{part}.json"
        if not path.exists():
            errors.append(f"{path} missing")
            continue
        data = json.loads(path.read_text())
        results = data["results"]
        if part == "throughput":
            for case in results["cases"]:
                for label in ("stock", "slotkit"):
                    if not case["summary"][label]["median_rps"]:
                        errors.append(f"throughput hosts={case['hosts']} {label}: no rate")
                if not case.get("ratio"):
                    errors.append(f"throughput hosts={case['hosts']}: no ratio")
        else:
            for label in ("stock", "slotkit"):
                if results["summary"][label]["valid_runs"] < 1:
                    errors.append(f"delay {label}: no valid run")
    for error in errors:
        print("SMOKE FAILURE:", error)
    print("smoke check", "FAILED" if errors else "passed")
    return 1 if errors else 0


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    sys.exit(main())
