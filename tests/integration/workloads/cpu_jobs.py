"""Small real CPU training jobs with one induced bottleneck each, instrumented with the probe API.

Run as ``python cpu_jobs.py SCENARIO``; the probe records to ``$PERFMON_RECORD``.
Multi-rank scenarios expect RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the
environment (the test starts one process per rank) and use gloo.

Scenarios (what is induced, and how):
* healthy        in-memory batches, a compute-bound MLP step (~15 ms)
* step_gaps      healthy plus a blocking checkpoint every 10 steps (torch.save,
                 fsync, and slow storage simulated by a 0.25 s pause)
* data_loading   DataLoader, 2 workers whose __getitem__ waits on a slow read
                 (simulated storage latency: the worker blocks, using no CPU)
* data_preprocessing  DataLoader, 1 worker doing heavy CPU transforms per sample
* communication  2-rank DDP, 8M-parameter model (32 MB of gradients), batch of 2
* load_imbalance 2-rank DDP, small model, rank 1's batches are 3x larger
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import probe

torch.set_num_threads(1)
SCENARIO = sys.argv[1]
mon = probe.start(job=f"wl-{SCENARIO}")


def mlp(width: int, depth: int = 2) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def train(model: nn.Module, batches, steps: int, *, on_step=None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon.watch(model=model, optimizer=opt)
    it = iter(mon.loader(batches))
    for i in range(steps):
        x, y = next(it)
        with mon.step(samples=len(x)):
            with mon.phase("forward"):
                loss = nn.functional.mse_loss(model(x), y)
            with mon.phase("backward"):
                opt.zero_grad()
                loss.backward()
            with mon.phase("optimizer"):
                opt.step()
        if on_step is not None:
            on_step(i, model)


def endless(batch: int, width: int):
    x, y = torch.randn(batch, width), torch.randn(batch, 1)
    while True:
        yield x, y


class SlowReads(Dataset):
    """Each sample waits on simulated storage latency; the worker sleeps rather than computes."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        time.sleep(0.012)
        return torch.randn(64), torch.randn(1)


class HeavyTransforms(Dataset):
    """Each sample is decoded/augmented on the CPU (repeated FFTs and a sort): pure computation."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(1 << 15, generator=g)
        for _ in range(12):
            x = torch.fft.irfft(torch.fft.rfft(x) * 0.5, n=x.numel())
            x = torch.sort(x).values
        return x[:64], x[:1]


def checkpoint(directory: str):
    def save(i: int, model: nn.Module) -> None:
        if i % 10 != 9:
            return
        t0 = time.perf_counter()
        path = os.path.join(directory, "ckpt.pt")
        with open(path, "wb") as fh:
            torch.save(model.state_dict(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        time.sleep(0.25)        # slow shared storage
        mon.event("checkpoint", seconds=time.perf_counter() - t0, path=path)
    return save


def ddp_model(width: int, depth: int) -> nn.Module:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    return DDP(mlp(width, depth))


def main() -> None:
    if SCENARIO == "healthy":
        train(mlp(1024), endless(128, 1024), steps=80)
    elif SCENARIO == "step_gaps":
        with tempfile.TemporaryDirectory() as tmp:
            train(mlp(1024), endless(128, 1024), steps=60, on_step=checkpoint(tmp))
    elif SCENARIO == "data_loading":
        loader = DataLoader(SlowReads(), batch_size=8, num_workers=2, persistent_workers=True)
        train(mlp(64), loader, steps=40)
    elif SCENARIO == "data_preprocessing":
        loader = DataLoader(HeavyTransforms(), batch_size=4, num_workers=1, persistent_workers=True)
        train(mlp(64), loader, steps=30)
    elif SCENARIO == "communication":
        model = ddp_model(1024, 7)              # ~7.3M parameters: ~29 MB all-reduced per step
        train(model, endless(2, 1024), steps=30)
    elif SCENARIO == "load_imbalance":
        rank = int(os.environ["RANK"])
        model = ddp_model(256, 2)              # uneven shards: rank 1's batches are 3x larger
        train(model, endless(768 if rank == 1 else 256, 256), steps=60)
    else:
        raise SystemExit(f"unknown scenario {SCENARIO}")
    mon.close()
    if SCENARIO in ("communication", "load_imbalance"):
        import torch.distributed as dist

        dist.destroy_process_group()
        # leave as tests/compat/job.py does: exit handlers, then no interpreter finalisation (torch gloo teardown abort)
        sys.stdout.flush()
        atexit._run_exitfuncs()
        os._exit(0)


if __name__ == "__main__":
    main()
