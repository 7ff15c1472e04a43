"""Cost of issue 27's probe side: the step's CPU clock reads and the ``where`` sampler.

1. Hot path, µs/step: ``loader()`` + empty ``step()`` minus the bare loop, interleaved in one
   process for three CPU-clock policies: as shipped (every step after one of 2 ms or more, one
   fast step in 32), every step (two ``thread_time()`` reads each), never.
2. A real CPU training step (torch Linear forward/backward/SGD, ~10 ms, plus a little Python) with
   the ``where`` sampler on (default rate) and off, in alternating blocks of the same process.

    python bench/bench_where.py [--steps 100000] [--repeats 5] [--blocks 8] [--block-steps 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import probe
from probe import core, where

POLICIES = {"shipped": (core.CPU_TIMED_STEP_S, core.CPU_TIMED_EVERY_MASK),
            "every step": (0.0, 0),
            "never": (float("inf"), (1 << 62) - 1)}


def bare(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    return time.perf_counter() - t0


def probed(mon, n: int) -> float:
    t0 = time.perf_counter()
    for _ in mon.loader(range(n)):
        with mon.step():
            pass
    return time.perf_counter() - t0


def drain(mon) -> None:
    deadline = time.monotonic() + 10
    while mon._q and time.monotonic() < deadline:
        time.sleep(0.01)


def hot_path(mon, steps: int, repeats: int) -> dict[str, list[float]]:
    costs: dict[str, list[float]] = {name: [] for name in POLICIES}
    for _ in range(repeats):
        for name, (step_s, mask) in POLICIES.items():
            core.CPU_TIMED_STEP_S, core.CPU_TIMED_EVERY_MASK = step_s, mask
            mon._cpu_next = name != "never"
            drain(mon)
            base = bare(steps)
            drain(mon)
            costs[name].append((probed(mon, steps) - base) / steps * 1e6)
    core.CPU_TIMED_STEP_S, core.CPU_TIMED_EVERY_MASK = POLICIES["shipped"]
    return costs


def training(mon, blocks: int, block_steps: int) -> dict[str, list[float]]:
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 512)
    words = "the quick brown fox jumps over the lazy dog".split() * 20

    def step() -> None:
        with mon.step():
            loss = model(x).square().mean()
            " ".join(sorted(words)).split()          # a little Python in the step
            loss.backward()
            opt.step()
            opt.zero_grad()

    for _ in range(20):
        step()
    per_step: dict[str, list[float]] = {"off": [], "on": []}
    sampler_cpu: list[float] = []
    for _ in range(blocks):
        for mode in ("off", "on"):
            sampler = None
            if mode == "on":
                sampler = where.WhereSampler(mon, mon.emit, where.DEFAULT_HZ)
                sampler.start()
            t0 = time.perf_counter()
            for _ in range(block_steps):
                step()
            per_step[mode].append((time.perf_counter() - t0) / block_steps * 1e3)
            if sampler is not None:
                cpu = where._reader(sampler.ident)()[0]          # the sampler thread's own CPU time
                sampler_cpu.append(cpu / (time.perf_counter() - t0) * 100)
                sampler.stop_event.set()
                sampler.join()
            drain(mon)
    print(f"sampler thread CPU: {statistics.median(sampler_cpu):.3f}% of one core (median of {len(sampler_cpu)} blocks)")
    return per_step


def _row(name: str, values: list[float], unit: str) -> str:
    return (f"| {name} | {statistics.median(values):.2f} {unit} | {min(values):.2f} | {max(values):.2f} | "
            f"{len(values)} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block-steps", type=int, default=100)
    args = ap.parse_args()
    os.environ.setdefault("PERFMON_DIR", tempfile.mkdtemp(prefix="pm-bench-"))
    os.chmod(os.environ["PERFMON_DIR"], 0o700)
    os.environ["PERFMON_WHERE_HZ"] = "0"      # the sampler is started by hand in part 2
    mon = probe.start(job="bench-where", serve=False)
    reads = 200_000
    t0 = time.perf_counter()
    for _ in range(reads):
        time.thread_time()
    read_us = (time.perf_counter() - t0) / reads * 1e6
    print(f"time.thread_time(): {read_us:.2f} µs per call")
    print("| hot path: CPU clock | median µs/step | min | max | repeats |\n|---|---|---|---|---|")
    for name, values in hot_path(mon, args.steps, args.repeats).items():
        print(_row(name, values, "µs"))
    print("\n| training step: where sampler | median ms/step | min | max | blocks |\n|---|---|---|---|---|")
    results = training(mon, args.blocks, args.block_steps)
    for mode, values in results.items():
        print(_row(mode, values, "ms"))
    mon.close()


if __name__ == "__main__":
    main()
