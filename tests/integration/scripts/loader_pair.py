"""A job whose loader costs ~30% of each step, and its fixed twin (``perfmon compare``'s pair).

Plain PyTorch (no perfmon API), run under ``perfmon run``. Each batch costs the worker a simulated
storage read (a sleep, no CPU) of ``compute / (1 - 0.3)``, timed on this machine, so:

* ``slow``   one loader worker: a batch arrives every read, and the step waits ~30% of it;
* ``fixed``  three workers read in parallel: batches arrive faster than the step computes them.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)
WIDTH, BATCH, WAIT_SHARE = 512, 256, 0.3


class SlowStorage(Dataset):
    """Whole batches, each after ``read_s`` of simulated storage latency."""

    def __init__(self, read_s: float) -> None:
        self.x, self.y, self.read_s = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1), read_s

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int):
        time.sleep(self.read_s)
        return self.x.clone(), self.y.clone()


def compute_s(model: nn.Module, steps: int = 20) -> float:
    """Median forward + backward time on an in-memory batch (no optimizer step: not a training step)."""
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        nn.functional.mse_loss(model(x), y).backward()
        times.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["slow", "fixed"])
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    read_s = compute_s(model) / (1.0 - WAIT_SHARE)
    workers = 1 if args.mode == "slow" else 3
    batches = iter(DataLoader(SlowStorage(read_s), batch_size=None, num_workers=workers, persistent_workers=True,
                              prefetch_factor=2))
    for _ in range(args.steps):
        xb, yb = next(batches)
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
