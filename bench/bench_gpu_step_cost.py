"""perfmon's cost on a fast GPU step, against the SIMULATED CUDA device (tests/sim): no GPU here.

The first GPU run (an H200) measured the watcher's step hooks at 57 + 54 µs a step with sync counting
on, 2% of a 6.8 ms step, most of it the four CUDA event records of every step. The step timer now
records events on one step per ``StepTimer.TIME_EVERY`` (0.1 s). This runs a watched job of 5 ms
simulated GPU steps (``syncs=True``, a forward and an optimizer step each) and alternates, in one
process, rounds with events on every step (``TIME_EVERY = 0``, the previous design) and rounds with
the sampled subset. Per step: event records, and the training-thread seconds the probe reports for
its step hooks and step calls (its own ``cost`` section, as the viewer reads it). A simulated event
record is a Python call, not a ``cudaEventRecord``: the records per step are the design's figure;
the seconds are this machine's Python, not a GPU's driver cost.

    python bench/bench_gpu_step_cost.py [--seconds 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import probe  # noqa: E402
from perfmon_analysis.readings import cost_reading  # noqa: E402
from probe.cost import CostSource  # noqa: E402
from probe.gpu import cuda as gpu_cuda  # noqa: E402
from tests.sim.simulated_cuda import SimulatedCuda  # noqa: E402

STEP_S = 0.005


def round_(mon, model, opt, cuda: SimulatedCuda, seconds: float, every: float) -> dict[str, float]:
    gpu_cuda.StepTimer.TIME_EVERY = every
    source = CostSource(mon)
    x = torch.ones(8)
    for _ in range(20):                     # settle: the first steps after a switch
        with mon.step():
            model(x).sum().backward()
            opt.step()
            cuda.run(STEP_S)
        cuda.synchronize()
    before, records = cost_reading(source.read()["cost"], time.time()), cuda.calls.count("record")
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        with mon.step():
            model(x).sum().backward()
            opt.step()
            cuda.run(STEP_S)                # 5 ms of kernels; the host waits for them below
        cuda.synchronize()
        steps += 1
    after = cost_reading(source.read()["cost"], time.time() + 1.0)
    hooks = sum(s for _, s in after.hooks) - sum(s for _, s in before.hooks)
    return {"steps": steps, "records": (cuda.calls.count("record") - records) / steps,
            "hooks_us": hooks / steps * 1e6,
            "train_us": ((after.train_s or 0.0) - (before.train_s or 0.0)) / steps * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("PERFMON_DIR", tempfile.mkdtemp(prefix="pm-bench-"))
    cuda = SimulatedCuda()
    gpu_cuda.backend = cuda
    model = torch.nn.Linear(8, 8)
    cuda.place(model)                       # model.cuda() on the simulated device
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = probe.start(job="bench-gpu-step-cost", serve=False)
    mon.watch(model=model, optimizer=opt, syncs=True)
    sampled = gpu_cuda.StepTimer.TIME_EVERY
    got: dict[str, list[dict[str, float]]] = {"every step": [], f"one step per {sampled} s": []}
    try:
        for _ in range(args.rounds):
            for name, every in (("every step", 0.0), (f"one step per {sampled} s", sampled)):
                got[name].append(round_(mon, model, opt, cuda, args.seconds, every))
    finally:
        mon.close()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, SIMULATED CUDA, {STEP_S * 1e3:.0f} ms steps, "
          f"{args.rounds} rounds x {args.seconds} s each way, alternated; medians (min-max)")
    print("events timed on      | steps/s | event records/step | step hooks µs/step  | step calls µs/step | "
          "of a 5 ms step")
    for name, rows in got.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        lo = {k: min(r[k] for r in rows) for k in rows[0]}
        hi = {k: max(r[k] for r in rows) for k in rows[0]}
        print(f"{name:<20} | {med['steps'] / args.seconds:7.0f} | {med['records']:18.2f} | "
              f"{med['hooks_us']:6.1f} ({lo['hooks_us']:.1f}-{hi['hooks_us']:.1f}) | "
              f"{med['train_us']:6.1f} ({lo['train_us']:.1f}-{hi['train_us']:.1f}) | "
              f"{med['train_us'] / (STEP_S * 1e6):.2%}")


if __name__ == "__main__":
    main()
