"""perfmon's reported cost against the measured one, on the same CPU job.

Each round runs one process per mode, in alternating order: ``plain`` (no probe), ``api``
(``probe.start`` + ``step()``) and ``watch`` (``api`` + ``watch(model, opt)``). Each times
``--steps`` steps of a small MLP after a warm-up; the probed ones also print what the probe says
it cost over those steps, as a viewer computes it (``perfmon_analysis.overhead`` on two samples'
``cost``: training-thread time per step, its bound with GIL waits, its threads' CPU over the
process's). The measured cost is the mode's mean step against plain's.

    python bench/bench_cost.py [--rounds 6] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = r"""
import json, sys, time
import torch
mode, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 1024)
mon = None
if mode != "plain":
    import probe
    mon = probe.start(job="bench-cost", sample_hz=0.1)
    if mode == "watch":
        mon.watch(model, opt)

def one():
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()

def run(n):
    for _ in range(n):
        if mon is None:
            one()
        else:
            with mon.step():
                one()

run(20)
before = mon.sampler.sample_once()["cost"] if mon is not None else None
t0 = time.perf_counter()
run(steps)
wall = time.perf_counter() - t0
out = {"step_s": wall / steps}
if mon is not None:
    from perfmon_analysis.overhead import overhead
    from perfmon_analysis.readings import cost_reading
    after = mon.sampler.sample_once()["cost"]
    o = overhead(0, [cost_reading(before, 0.0), cost_reading(after, wall)], wall / steps)
    out.update(train_per_step_s=o.train_per_step_s, bound_per_step_s=o.train_bound_per_step_s, cpu_frac=o.cpu_frac)
    mon.close()
print(json.dumps(out))
"""

MODES = ("plain", "api", "watch")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    env = {**os.environ, "PERFMON_DIR": tempfile.mkdtemp(prefix="pm-cost-")}
    os.chmod(env["PERFMON_DIR"], 0o700)
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mode in order:
            out = subprocess.run([sys.executable, "-c", JOB, mode, str(args.steps)], capture_output=True, text=True,
                                 cwd=ROOT, env=env, check=True)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    plain = statistics.median(x["step_s"] for x in runs["plain"])
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.rounds} rounds x {args.steps} steps")
    for mode in MODES:
        steps = [x["step_s"] for x in runs[mode]]
        step = statistics.median(steps)
        line = (f"{mode:>6}: step {step * 1e3:.2f} ms median (rounds {min(steps) * 1e3:.2f}-{max(steps) * 1e3:.2f});"
                f" measured cost {(step - plain) * 1e6:+.0f} µs/step ({(step / plain - 1) * 100:+.1f}%)")
        if mode != "plain":
            train = statistics.median(x["train_per_step_s"] for x in runs[mode])
            bound = statistics.median(x["bound_per_step_s"] for x in runs[mode])
            cpu = statistics.median(x["cpu_frac"] for x in runs[mode])
            line += (f"; reported {train * 1e6:.1f} µs/step ({train / step * 100:.3f}% of the step, at most"
                     f" {bound * 1e6:.1f} with GIL waits), {cpu * 100:.2f}% of CPU")
        print(line)


if __name__ == "__main__":
    main()
