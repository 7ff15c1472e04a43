"""Main-thread cost of the probe's hot path: ``loader()`` + ``step()`` per step.

Measured in one run, probe vs no probe, on the same loop so machine noise hits
both alike: (time with probe - time without) / steps. Repeated and the median
taken. Cases: no viewer, one viewer (a separate process reading the stream), and
``step()`` alone (no ``loader()``). Budget: under 2 µs per step. Beside it, what the
probe reports of itself for the same loop, as a viewer computes it
(``perfmon_analysis.overhead`` on two of its ``cost`` readings, the header's "perfmon
cost"): its clock reads around ``step()`` plus the ``step()``/``loader()`` wrappers'
calls at their cost calibrated at start-up.

    python bench/bench_hot_path.py [--steps 100000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import probe
from perfmon_analysis.overhead import STEP_CALLS, overhead
from perfmon_analysis.readings import cost_reading
from probe.cost import CostSource


def baseline(n: int) -> float:
    data = range(n)
    t0 = time.perf_counter()
    for _ in data:
        pass
    return time.perf_counter() - t0


def with_probe(mon, n: int, loader: bool) -> tuple[float, float, float]:
    """(wall seconds of the loop, the probe's own report of its training-thread seconds per step,
    of which its clock reads')."""
    data = range(n)
    source = CostSource(mon)
    before = cost_reading(source.read()["cost"], time.time())
    t0 = time.perf_counter()
    if loader:
        for _ in mon.loader(data):
            with mon.step():
                pass
    else:
        for _ in data:
            with mon.step():
                pass
    wall = time.perf_counter() - t0
    after = cost_reading(source.read()["cost"], time.time() + 1.0)
    reported = overhead(mon.rank, [before, after], None)
    clock_reads = next(p.value for p in reported.parts if p.name == STEP_CALLS)
    return wall, reported.train_per_step_s, clock_reads


def drain_queue(mon) -> None:
    """Let the sender empty the buffer so no run starts with a backlog."""
    deadline = time.monotonic() + 10
    while mon._q and time.monotonic() < deadline:
        time.sleep(0.01)


VIEWER = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
print("ready", flush=True)
while s.recv(1 << 20):
    pass
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    os.environ.setdefault("PERFMON_DIR", tempfile.mkdtemp(prefix="pm-bench-"))
    os.chmod(os.environ["PERFMON_DIR"], 0o700)
    mon = probe.start(job="bench-hot-path")
    results = {}
    for case, viewed, loader in (("no viewer", False, True), ("one viewer", True, True),
                                 ("step() alone", False, False)):
        viewer = None
        if viewed:
            viewer = subprocess.Popen([sys.executable, "-c", VIEWER, str(mon.socket_path)], stdout=subprocess.PIPE)
            viewer.stdout.readline()
        costs, reported, reads = [], [], []
        for _ in range(args.repeats):
            drain_queue(mon)
            base = baseline(args.steps)
            drain_queue(mon)
            probed, own, clock_reads = with_probe(mon, args.steps, loader)
            costs.append((probed - base) / args.steps * 1e6)
            reported.append(own * 1e6)
            reads.append(clock_reads * 1e6)
        results[case] = costs, reported, reads
        if viewer is not None:
            viewer.kill()
            viewer.wait()
    calibrated = {name: round(seconds * 1e6, 2) for name, seconds in (mon._wrapper_cost or {}).items()}
    mon.close()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.steps} steps x {args.repeats} repeats; "
          f"wrappers calibrated at start-up (µs a call): {calibrated}")
    for case, (costs, reported, reads) in results.items():
        print(f"{case:>12}: median {statistics.median(costs):.2f} µs/step  (min {min(costs):.2f}, max {max(costs):.2f});"
              f" the probe reports {statistics.median(reported):.2f} µs/step of its own"
              f" (clock reads {statistics.median(reads):.2f}, the rest calibrated wrappers)")

if __name__ == "__main__":
    main()
