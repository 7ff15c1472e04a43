"""What the multi-node path costs today (issue 13): N ranks split over 2 "nodes" on this machine,
each a light probe process (tests/integration/jobs/api_job.py: 20 steps/s, no torch), viewed with
``perfmon report JOB --hosts node1,node2`` through a relay per node (local transport).

Prints, per N: ranks seen, steps ingested per second, and the CPU seconds the viewer and the two
relays used per second of following (all records are forwarded today: no summaries yet).

    python bench/bench_relay.py [--ranks 16 64] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "integration" / "jobs" / "api_job.py"


def run(n: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        procs = []
        for rank in range(n):
            node = base / f"node{1 + rank * 2 // n}"
            node.mkdir(mode=0o700, exist_ok=True)
            env = {**os.environ, "PERFMON_DIR": str(node), "RANK": str(rank), "WORLD_SIZE": str(n)}
            procs.append(subprocess.Popen([sys.executable, str(JOB), "relaybench", "100000", "20", "15", "15"],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        for p in procs:
            p.stdout.readline()                      # its socket is listening
        time.sleep(2.0)                              # a backlog of steps to backfill, as on a real attach
        env = {**os.environ, "PERFMON_VIA": f"env PERFMON_DIR={base}/{{host}}",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "tui.cli", "report", "relaybench", "--hosts", "node1,node2",
                              "--json", "--seconds", str(seconds)], capture_output=True, text=True, env=env)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        for p in procs:
            p.kill()
            p.wait()
        report = json.loads(out.stdout)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        steps = sum(r["steps"] for r in report["ranks"])
        return {"ranks": n, "seen": len(report["ranks"]), "wall_s": round(wall, 1),
                "viewer_and_relays_cpu_s_per_s": round(cpu / wall, 3), "steps_in_report": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    for n in args.ranks:
        print(json.dumps(run(n, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
