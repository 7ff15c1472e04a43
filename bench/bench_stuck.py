"""How long after a rank stops does the live ``perfmon report`` name it?

A real 2-rank gloo job (tests/integration/scripts/stuck_jobs.py): rank 1 sleeps before its
20th all-reduce, with the default stall threshold (10x the median step, at least 15 s). The
bench polls ``perfmon report JOB --json --seconds 1`` and prints the seconds from the stall to
the first report that says ``stuck`` with rank 1 as the culprit, for each run.

    python bench/bench_stuck.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.integration.streamutil import kill_tree  # noqa: E402

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "stuck_jobs.py"


def one_run(tmp: Path) -> float:
    sock = tmp / "sock"
    sock.mkdir(mode=0o700)
    mark = tmp / "mark"
    env = {**os.environ, "PERFMON_DIR": str(sock), "PERFMON_JOB": "bench-stuck"}
    env.pop("PERFMON_STALL_S", None)
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            str(SCRIPT), "collective", str(mark)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while not (mark.exists() and mark.read_text().endswith("\n")):
            if job.poll() is not None:
                raise SystemExit("the job ended before its stall")
            time.sleep(0.1)
        stalled = float(mark.read_text())
        while time.time() - stalled < 120:
            out = subprocess.run([sys.executable, "-m", "tui.cli", "report", "bench-stuck", "--json", "--seconds", "1"],
                                 capture_output=True, text=True, env=env, cwd=ROOT)
            verdict = json.loads(out.stdout)["verdict"] if out.returncode == 0 else {}
            if verdict.get("bottleneck") == "stuck" and verdict["stuck"]["culprit_ranks"] == [1]:
                return time.time() - stalled
        raise SystemExit("not named within 120 s")
    finally:
        kill_tree(job)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            print(f"run {i + 1}: named {one_run(Path(tmp)):.1f} s after the stall", flush=True)


if __name__ == "__main__":
    main()
