"""The fault suite at full size (the CI-sized runs are tests/integration/test_faults.py;
both call tests/integration/faults.py). Prints one JSON line of figures per fault.

    python bench/bench_faults.py kill9 [--points 1000]     # perfmon report on every file, in-process
    python bench/bench_faults.py forks [--workers 400]      # fork, forkserver and spawn, 400 each
    python bench/bench_faults.py storm [--cycles 10000 --stalled 50 --blocks 5 --block-seconds 4]
    python bench/bench_faults.py other-user
    python bench/bench_faults.py warnings

The soak (30 minutes at >= 1,000 steps/s with a viewer) is bench/bench_soak.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration import faults  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("fault", choices=["kill9", "forks", "storm", "other-user", "warnings"])
    ap.add_argument("--points", type=int, default=1000)
    ap.add_argument("--report-every", type=int, default=1)
    ap.add_argument("--max-delay", type=float, default=0.5)
    ap.add_argument("--workers", type=int, default=400)
    ap.add_argument("--methods", default="fork,forkserver,spawn")
    ap.add_argument("--cycles", type=int, default=10_000)
    ap.add_argument("--stalled", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--block-seconds", type=float, default=4.0)
    args = ap.parse_args()
    t0 = time.monotonic()
    if args.fault == "kill9":
        f = faults.kill9(args.points, seed=2026, max_delay=args.max_delay, report_every=args.report_every,
                         subprocess_report=False)
        sizes = sorted(f.pop("bytes", []))
        f["file_bytes_min_median_max"] = [sizes[0], sizes[len(sizes) // 2], sizes[-1]] if sizes else None
        out = [f]
    elif args.fault == "forks":
        out = []
        for method in args.methods.split(","):
            f = faults.forks(method, args.workers, viewers=2, timeout=3600)
            if not f.get("rc"):
                f.pop("stderr", None)
            print(json.dumps(f), flush=True)      # each method as soon as it is done
        print(f"# {args.fault}: {time.monotonic() - t0:.0f} s", flush=True)
        return 0
    elif args.fault == "storm":
        out = [faults.storm(args.cycles, args.stalled, block_seconds=args.block_seconds, blocks=args.blocks)]
    elif args.fault == "other-user":
        out = [faults.other_user("nobody")]
    else:
        runs = faults.warnings_runs()
        plain = runs["plain"]["losses"]
        out = [{name: {"rc": r["rc"], "identical_losses": r.get("losses") == plain, "steps_recorded":
                       r.get("steps_recorded"), "syncs_per_step": r.get("syncs")} for name, r in runs.items()}]
    for f in out:
        print(json.dumps(f), flush=True)
    print(f"# {args.fault}: {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
