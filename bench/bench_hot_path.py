"""Main-thread cost of the probe's hot path: ``loader()`` + ``step()`` per step.

Measured in one run, probe vs no probe, on the same loop so machine noise hits
both alike: (time with probe - time without) / steps. Repeated and the median
taken. Cases: no viewer, one viewer (a separate process reading the stream), and
``step()`` alone (no ``loader()``). Budget: under 2 µs per step. The same difference in
the training thread's CPU clock leaves out what a loaded machine adds (the thread waiting
for a core) and the waits for the GIL while a probe thread runs. Beside them, what the
probe reports of itself for the same loop, as a viewer computes it
(``perfmon_analysis.overhead`` on two of its ``cost`` readings, the header's "perfmon
cost"): its clock reads around ``step()`` plus the ``step()``/``loader()`` wrappers'
calls at their cost calibrated at start-up; and its upper bound with the GIL waits, that
plus the CPU its threads used during the loop.

    python bench/bench_hot_path.py [--steps 100000] [--repeats 7]
    python bench/bench_hot_path.py --ab /tmp/perfmon-main [--rounds 6]   # against another tree (bench/ab.py)
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


def baseline(n: int) -> tuple[float, float]:
    """(wall, training-thread CPU) seconds of the bare loop."""
    data = range(n)
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in data:
        pass
    return time.perf_counter() - t0, time.thread_time() - c0


def with_probe(mon, n: int, loader: bool) -> dict[str, float]:
    """Wall and training-thread CPU seconds of the loop; the probe's own report of its
    training-thread seconds per step, of which its clock reads', and its bound with GIL waits."""
    data = range(n)
    source = CostSource(mon)
    before = cost_reading(source.read()["cost"], time.time())
    c0, t0 = time.thread_time(), time.perf_counter()
    if loader:
        for _ in mon.loader(data):
            with mon.step():
                pass
    else:
        for _ in data:
            with mon.step():
                pass
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    after = cost_reading(source.read()["cost"], time.time() + 1.0)
    reported = overhead(mon.rank, [before, after], None)
    clock_reads = next(p.value for p in reported.parts if p.name == STEP_CALLS)
    return {"wall": wall, "cpu": cpu, "reported": reported.train_per_step_s, "reads": clock_reads,
            "bound": reported.train_bound_per_step_s}


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
    ap.add_argument("--ab", metavar="OTHER_TREE", help="alternate rounds with another tree's probe (bench/ab.py)")
    ap.add_argument("--rounds", type=int, default=6, help="with --ab: rounds of each tree")
    ap.add_argument("--ab-json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ab:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from ab import compare
        compare("bench/bench_hot_path.py", args.ab, args.rounds, ["--steps", str(args.steps), "--repeats", "1"])
        return
    os.environ.setdefault("PERFMON_DIR", tempfile.mkdtemp(prefix="pm-bench-"))
    os.chmod(os.environ["PERFMON_DIR"], 0o700)
    mon = probe.start(job="bench-hot-path")
    results: dict[str, dict[str, list[float]]] = {}
    for case, viewed, loader in (("no viewer", False, True), ("one viewer", True, True),
                                 ("step() alone", False, False)):
        viewer = None
        if viewed:
            viewer = subprocess.Popen([sys.executable, "-c", VIEWER, str(mon.socket_path)], stdout=subprocess.PIPE)
            viewer.stdout.readline()
        got: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            drain_queue(mon)
            base_wall, base_cpu = baseline(args.steps)
            drain_queue(mon)
            run = with_probe(mon, args.steps, loader)
            row = {"wall": (run["wall"] - base_wall) / args.steps, "cpu": (run["cpu"] - base_cpu) / args.steps,
                   "reported": run["reported"], "reads": run["reads"], "bound": run["bound"]}
            for key, seconds in row.items():
                got.setdefault(key, []).append(seconds * 1e6)
        results[case] = got
        if viewer is not None:
            viewer.kill()
            viewer.wait()
    calibrated = {name: round(seconds * 1e6, 2) for name, seconds in (mon._wrapper_cost or {}).items()}
    mon.close()
    if args.ab_json:         # one round's figures for bench/ab.py: µs/step, wall and thread CPU per case
        import json
        print(json.dumps({f"{case} {key}": statistics.median(got[key]) for case, got in results.items()
                          for key in ("wall", "cpu")}))
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.steps} steps x {args.repeats} repeats; "
          f"wrappers calibrated at start-up (µs a call): {calibrated}")
    print("µs/step, medians    measured: wall (min-max)   thread CPU | reported: total (clock reads)  bound w/ GIL")
    for case, got in results.items():
        m = {key: statistics.median(values) for key, values in got.items()}
        print(f"{case:>12}  {m['wall']:>16.2f} ({min(got['wall']):.2f}-{max(got['wall']):.2f}) {m['cpu']:>11.2f} |"
              f" {m['reported']:>14.2f} ({m['reads']:.2f}) {m['bound']:>13.2f}")


if __name__ == "__main__":
    main()
