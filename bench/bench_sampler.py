"""Sampler thread cost: CPU per second at 1 Hz, and each source's cost per sample.

Sources as a watched CPU training job has them: host (psutil), DataLoader workers
(2 live workers), memory breakdown (every 2 s), compute, comm; plus the GPU source
twice: against this machine's real NVML (no driver here: "no NVIDIA GPU" state)
and against the SIMULATED NVML of tests/sim with one Hopper-like GPU. The
simulated figure is only the probe's own Python around NVML calls: real driver
calls are not measured here (no GPU).

Costs are CPU time (``time.thread_time`` / the sampler thread's CPU clock): the
machine is shared, so wall time would mostly measure the neighbours.

    python bench/bench_sampler.py [--reads 200] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # for tests.sim

import probe  # noqa: E402
from probe.gpu import GpuSource  # noqa: E402
from probe.gpu.nvml import Nvml  # noqa: E402
from tests.sim import simulated_pynvml  # noqa: E402


class Items(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.ones(4)


def per_read_cpu(source, reads: int) -> float:
    """Median CPU µs of one ``read()`` over ``reads`` calls (in chunks of 10)."""
    chunks = []
    for _ in range(max(1, reads // 10)):
        t0 = time.thread_time()
        for _ in range(10):
            source.read()
        chunks.append((time.thread_time() - t0) / 10 * 1e6)
    return statistics.median(chunks)


def thread_cpu(thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    os.environ.setdefault("PERFMON_DIR", tempfile.mkdtemp(prefix="pm-bench-"))
    os.chmod(os.environ["PERFMON_DIR"], 0o700)
    torch.set_num_threads(1)

    mon = probe.start(job="bench-sampler", serve=False, sample_hz=1.0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(50)])
    opt = torch.optim.AdamW(model.parameters())
    mon.watch(model=model, optimizer=opt)
    loader = DataLoader(Items(), batch_size=4, num_workers=2, persistent_workers=True)
    batches = iter(mon.loader(loader))
    for _ in range(3):
        next(batches)
        with mon.step():
            model(torch.randn(2, 64)).sum().backward()
            opt.step()
            opt.zero_grad()

    sources = {s.name: s for s in mon.sampler.sources}
    sim_nvml = Nvml(simulated_pynvml.build([simulated_pynvml.SimulatedGpu()]))
    sim_gpu = GpuSource(sim_nvml, sim_nvml.devices)
    sim_gpu.read()
    sim_nvml.devices[0].gpm.prev_t -= 1.0        # GPM reads once per interval; make every read a full one

    def sim_read() -> dict:
        sim_nvml.devices[0].gpm.prev_t = time.monotonic() - 1.0
        return sim_gpu.read()

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cpus")
    print(f"CPU µs per read (median of {args.reads}):")
    memory = sources.get("memory")
    for name, source in sources.items():
        if source is memory:
            continue
        print(f"  {name:<16} {per_read_cpu(source, args.reads):8.1f}")
    if memory is not None:
        memory.last_read = float("-inf")
        t0 = time.thread_time()
        memory.read()                              # a full read: walk (cached) + psutil + record
        full = (time.thread_time() - t0) * 1e6
        print(f"  {'memory (full)':<16} {full:8.1f}   (runs every 2 s; other ticks return at once)")
    print(f"  {'gpu (simulated)':<16} {per_read_cpu(type('S', (), {'read': staticmethod(sim_read)}), args.reads):8.1f}"
          "   (SIMULATED NVML: the probe's own Python only, not driver time)")

    # the real sampler thread at 1 Hz, measured by its own CPU clock
    mon.sampler.stop_event.set()
    mon.sampler.join(2)
    from probe.sampler import Sampler
    sampler = Sampler(list(sources.values()), lambda record: None, hz=1.0)
    sampler.start()
    time.sleep(0.2)
    c0, t0 = thread_cpu(sampler), time.monotonic()
    time.sleep(args.seconds)
    c1, t1 = thread_cpu(sampler), time.monotonic()
    sampler.stop_event.set()
    sampler.join(2)
    share = (c1 - c0) / (t1 - t0)
    print(f"sampler thread at 1 Hz: {share * 1e6:.0f} µs CPU per second = {share * 100:.3f}% of one core "
          f"({args.seconds:.0f} s, real sources, no GPU)")
    mon.close()


if __name__ == "__main__":
    main()
