"""perfmon's cost on a fast GPU step: ~5 ms steps with a ``.item()`` each (the host waits for the device
every step, so whatever perfmon adds on the training thread adds to the step), alternated in one
process between no probe, CUDA events on every step (``StepTimer.TIME_EVERY = 0``, the design the first
GPU run measured at 2% of a 6.8 ms step on an H200) and events on one step per 0.1 s (the design now).

Per design: the step's wall time, its difference from the step without perfmon, the probe's own report
of its training-thread time per step (its ``cost`` section, as the viewer's ``perfmon_cost`` reads it)
and CUDA event records per step. ``--cuda`` runs on the real GPU (bf16 matmuls sized to ~5 ms; what
scripts/gpu_check.sh runs); without it the SIMULATED CUDA device of tests/sim, where an event record
is a Python call, not a ``cudaEventRecord``: those seconds are this machine's Python, not a GPU
driver's, and the records per step are the design's figure.

    python bench/bench_gpu_step_cost.py [--cuda] [--seconds 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import probe  # noqa: E402
from perfmon_analysis.readings import cost_reading  # noqa: E402
from probe.cost import CostSource  # noqa: E402
from probe.gpu import cuda as gpu_cuda  # noqa: E402

STEP_S = 0.005


class Sim:
    """The simulated device: kernels on its stream, a loss tensor whose item() waits for them."""

    name = "SIMULATED CUDA (tests/sim)"

    def __init__(self) -> None:
        from tests.sim.simulated_cuda import SimulatedCuda, SimulatedDeviceTensor

        self.cuda, self.tensor = SimulatedCuda(), SimulatedDeviceTensor
        gpu_cuda.backend = self.cuda

    def model(self) -> torch.nn.Module:
        model = torch.nn.Linear(8, 8)
        self.cuda.place(model)
        return model

    def step(self, model: torch.nn.Module, opt: Any) -> float:
        model(torch.ones(8)).sum().backward()
        opt.step()
        self.cuda.run(STEP_S)
        return self.tensor(self.cuda, 1.0).item()

    def records(self) -> int:
        return self.cuda.calls.count("record")


class Real:
    """The GPU: bf16 matmuls sized to ~5 ms a step, the step's loss read with .item()."""

    def __init__(self) -> None:
        self.name = f"CUDA {torch.cuda.get_device_name()}"
        self.a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        self.b, self.out = torch.randn_like(self.a), torch.empty_like(self.a)
        for _ in range(200):
            torch.matmul(self.a, self.b, out=self.out)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(100):
            torch.matmul(self.a, self.b, out=self.out)
        torch.cuda.synchronize()
        self.n = max(1, round(STEP_S / ((time.perf_counter() - t0) / 100)))
        self.recorded = 0
        real = gpu_cuda.backend.record_on

        def counted(event: Any, index: Any = None) -> None:
            self.recorded += 1
            real(event, index)

        gpu_cuda.backend.record_on = counted

    def model(self) -> torch.nn.Module:
        return torch.nn.Linear(8, 8).cuda()

    def step(self, model: torch.nn.Module, opt: Any) -> float:
        loss = model(torch.ones(8, device="cuda")).sum()
        loss.backward()
        opt.step()
        for _ in range(self.n):
            torch.matmul(self.a, self.b, out=self.out)
        return (loss + self.out[0, 0]).item()

    def records(self) -> int:
        return self.recorded


def round_(mon: Any, device: Any, models: dict[str, Any], seconds: float, every: float | None) -> dict[str, float]:
    """One round: ``every`` None runs the unwatched model without perfmon's step; else events every
    ``every`` seconds on the watched one."""
    model, opt = models["plain" if every is None else "watched"]
    if every is not None:
        gpu_cuda.StepTimer.TIME_EVERY = every
    source = CostSource(mon)
    for _ in range(20):                     # settle after a switch
        if every is None:
            device.step(model, opt)
        else:
            with mon.step():
                device.step(model, opt)
    before, records = cost_reading(source.read()["cost"], time.time()), device.records()
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        if every is None:
            device.step(model, opt)
        else:
            with mon.step():
                device.step(model, opt)
        steps += 1
    wall = (time.perf_counter() - t0) / steps
    after = cost_reading(source.read()["cost"], time.time() + 1.0)
    train = ((after.train_s or 0.0) - (before.train_s or 0.0)) / steps if every is not None else 0.0
    return {"step_us": wall * 1e6, "train_us": train * 1e6, "records": (device.records() - records) / steps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda", action="store_true", help="the real GPU (else the simulated device)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("PERFMON_DIR", tempfile.mkdtemp(prefix="pm-bench-"))
    device = Real() if args.cuda else Sim()
    models = {}
    for name in ("plain", "watched"):
        model = device.model()
        models[name] = (model, torch.optim.SGD(model.parameters(), lr=1e-3))
    mon = probe.start(job="bench-gpu-step-cost", serve=False)
    mon.watch(model=models["watched"][0], optimizer=models["watched"][1], syncs=True)
    sampled = gpu_cuda.StepTimer.TIME_EVERY
    designs = {"no perfmon": None, "events every step": 0.0, f"events every {sampled} s": sampled}
    got: dict[str, list[dict[str, float]]] = {name: [] for name in designs}
    try:
        for _ in range(args.rounds):
            for name, every in designs.items():
                got[name].append(round_(mon, device, models, args.seconds, every))
    finally:
        mon.close()
    base = statistics.median(r["step_us"] for r in got["no perfmon"])
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cpus, {device.name}, "
          f"~{STEP_S * 1e3:.0f} ms steps with a .item() each, sync counting on; {args.rounds} rounds x "
          f"{args.seconds} s each design, alternated; medians (min-max)")
    print(f"{'design':<24} | {'step µs':>20} | {'+ on the step':>13} | {'perfmon reports µs/step':>24} | "
          f"{'of the step':>11} | event records/step")
    for name, rows in got.items():
        step = [r["step_us"] for r in rows]
        train = [r["train_us"] for r in rows]
        med = statistics.median(train)
        print(f"{name:<24} | {statistics.median(step):8.1f} ({min(step):.0f}-{max(step):.0f}) | "
              f"{statistics.median(step) - base:+13.1f} | {med:8.1f} ({min(train):.1f}-{max(train):.1f}) | "
              f"{med / statistics.median(step):11.2%} | {statistics.median(r['records'] for r in rows):.2f}")


if __name__ == "__main__":
    main()
