"""Cost of knowing where steps go: the step's CPU clock reads and the ``where`` sampler.

1. Hot path, µs/step: ``loader()`` + empty ``step()`` minus the bare loop, interleaved in one
   process for three CPU-clock policies: as shipped (every step after one of 2 ms or more, one
   fast step in 32), every step (two ``thread_time()`` reads each), never.
2. A real CPU training step (torch Linear forward/backward/SGD, ~10 ms, plus a little Python) and a
   little Python between steps (the loop's own work, which the sampler now covers too), beside a
   metrics thread that sleeps most of the time (its clocks are read when the training thread waits),
   with the ``where`` sampler on (default rate) and off, in alternating blocks of the same process.
3. Attribution: steps of 30 ms busy work then a 20 ms sleep, the busy part either pure Python
   (holds the GIL) or torch calls (release it): the sleep line's share of the samples vs 40%.

    python bench/bench_where.py [--steps 100000] [--repeats 5] [--blocks 8] [--block-steps 100] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

import probe
from probe import core, thread_clocks, where

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
        " ".join(sorted(words)).split()              # and between steps: the loop's own work
        time.sleep(0.0005)

    stop = threading.Event()

    def metrics() -> None:                           # another Python thread: mostly asleep
        while not stop.wait(0.05):
            sorted(words)

    threading.Thread(target=metrics, name="metrics", daemon=True).start()

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
                cpu = thread_clocks._reader(sampler.ident)()[0]          # the sampler thread's own CPU time
                sampler_cpu.append(cpu / (time.perf_counter() - t0) * 100)
                sampler.stop_event.set()
                sampler.join()
            drain(mon)
    stop.set()
    print(f"sampler thread CPU: {statistics.median(sampler_cpu):.3f}% of one core "
          f"(median of {len(sampler_cpu)} blocks)")
    return per_step


def accuracy(mon, seconds: float) -> dict[str, float]:
    import torch
    model = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)

    def python_work(until: float) -> None:
        while time.perf_counter() < until:
            sorted(str(i) for i in range(200))

    def torch_work(until: float) -> None:
        while time.perf_counter() < until:
            model(x).detach()

    shares = {}
    for name, work in (("pure Python", python_work), ("torch calls", torch_work)):
        out: list[dict] = []
        sampler = where.WhereSampler(mon, out.append, where.DEFAULT_HZ)
        sampler.start()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            with mon.step():
                work(time.perf_counter() + 0.03)
                time.sleep(0.02)
        sampler.stop_event.set()
        sampler.join()
        samples = sum(r["samples"] for r in out)
        asleep = sum(line["n"] for r in out for line in r["lines"]
                     if line.get("call", "").startswith("time.sleep(0.02)"))
        waiting = sum(line["n"] for r in out for line in r["lines"] if line.get("state") == "waiting")
        shares[name] = (asleep / samples, waiting / samples, samples)
    return shares


def _row(name: str, values: list[float], unit: str) -> str:
    return (f"| {name} | {statistics.median(values):.2f} {unit} | {min(values):.2f} | {max(values):.2f} | "
            f"{len(values)} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block-steps", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0)
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
    print("\n| busy part of the step | sleep line's share (truth 0.40) | waiting share | samples |\n|---|---|---|---|")
    for name, (asleep, waiting, samples) in accuracy(mon, args.seconds).items():
        print(f"| {name} | {asleep:.2f} | {waiting:.2f} | {samples} |")
    mon.close()


if __name__ == "__main__":
    main()
