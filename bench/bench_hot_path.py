"""Main-thread cost of the probe's hot path: ``loader()`` + ``step()`` per step.

Measured in one run, probe vs no probe, on the same loop so machine noise hits
both alike: (time with probe - time without) / steps. Repeated and the median
taken. Cases: no viewer, and one viewer (a separate process reading the stream).
Budget: under 2 µs per step. Beside it, what the probe reports of itself for the
same loop (``probe.cost``: its training-thread time in ``step()``, the ``loader()`` wrapper not
counted), which a viewer shows as the header's "perfmon cost".

    python bench/bench_hot_path.py [--steps 200000] [--repeats 7]
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


def baseline(n: int) -> float:
    data = range(n)
    t0 = time.perf_counter()
    for _ in data:
        pass
    return time.perf_counter() - t0


def with_probe(mon, n: int) -> tuple[float, float]:
    """(wall seconds of the loop, the probe's own report of its training-thread seconds per step)."""
    data = range(n)
    own, steps = mon._own_s, mon._own_steps
    t0 = time.perf_counter()
    for _ in mon.loader(data):
        with mon.step():
            pass
    wall = time.perf_counter() - t0
    return wall, (mon._own_s - own) / max(1, mon._own_steps - steps)


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
    for case in ("no viewer", "one viewer"):
        viewer = None
        if case == "one viewer":
            viewer = subprocess.Popen([sys.executable, "-c", VIEWER, str(mon.socket_path)], stdout=subprocess.PIPE)
            viewer.stdout.readline()
        costs, reported = [], []
        for _ in range(args.repeats):
            drain_queue(mon)
            base = baseline(args.steps)
            drain_queue(mon)
            probed, own = with_probe(mon, args.steps)
            costs.append((probed - base) / args.steps * 1e6)
            reported.append(own * 1e6)
        results[case] = costs, reported
        if viewer is not None:
            viewer.kill()
            viewer.wait()
    mon.close()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.steps} steps x {args.repeats} repeats")
    for case, (costs, reported) in results.items():
        print(f"{case:>10}: median {statistics.median(costs):.2f} µs/step  (min {min(costs):.2f}, max {max(costs):.2f});"
              f" the probe reports {statistics.median(reported):.2f} µs/step of its own")


if __name__ == "__main__":
    main()
