"""What a module profile or a torch.profiler capture costs the job (issues 16 and 15), in one run.

A real CPU job (tests/integration/scripts/profile_job.py: four Linear blocks and one looped
block, batch 512, width 384, one thread) is profiled ``--profiles`` times at each depth with
``perfmon profile`` (``--op capture``: captured with ``perfmon capture``); its recording gives
every step's time. For each: the median step of the 20 steps before it, the mean of the
profiled steps, and the median of the 20 steps from the 10th step after it (the job must be back
to its own pace: nothing survives a profile or a capture).

    python bench/bench_profile.py [--profiles 3] [--depths 1 3] [--op profile|capture]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from probe.recording import read_recording, recording_files  # noqa: E402
from tests.integration.streamutil import kill_tree  # noqa: E402

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "profile_job.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=int, default=3)
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--op", choices=("profile", "capture"), default="profile")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sock = tmp / "sock"
        sock.mkdir(mode=0o700)
        env = {**os.environ, "PERFMON_DIR": str(sock), "PERFMON_JOB": "bench-profile"}
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "watch", str(tmp), "600"], env=env,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        profiles = []
        try:
            while not (tmp / "ready").exists():
                if proc.poll() is not None:
                    raise SystemExit(proc.stderr.read())
                time.sleep(0.2)
            for depth in (args.depths if args.op == "profile" else [0]):
                for _ in range(args.profiles):
                    extra = ["--depth", str(depth), "--steps", "5"] if args.op == "profile" else ["--steps", "3"]
                    out = subprocess.run([sys.executable, "-m", "tui.cli", args.op, "bench-profile", "--json", *extra],
                                         env=env, capture_output=True, text=True, timeout=120, check=True)
                    result = json.loads(out.stdout)
                    profiles.append((depth, result["captures"][0] if args.op == "capture" else result))
                    time.sleep(2.0)      # steps after the profile, for the "after" median
            (tmp / "stop").write_text("")
            proc.wait(60)
        finally:
            kill_tree(proc)
        steps = {r["step"]: r["dur"] for f in recording_files(tmp / "rec") for r in read_recording(f).records
                 if r["k"] == "step"}
    print(f"{'depth':>5} {'modules':>7} {'before':>9} {'profiled':>9} {'cost':>6} {'after':>9} {'after/before':>12}")
    for depth, p in profiles:
        first, last = p["first_step"], p["last_step"]
        before = statistics.median(steps[s] for s in range(first - 20, first))
        inside = statistics.mean(steps[s] for s in range(first, last + 1))
        after = statistics.median(steps[s] for s in range(last + 10, last + 30))
        print(f"{depth:>5} {len(p.get('modules', [])):>7} {before * 1e3:>7.2f}ms {inside * 1e3:>7.2f}ms "
              f"{inside / before - 1:>+6.0%} {after * 1e3:>7.2f}ms {after / before:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
