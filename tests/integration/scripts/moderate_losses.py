"""A plain PyTorch job (no perfmon API) that loses a moderate share of each step to one cause.

Losses a busy-only verdict would call healthy: not enough to push "busy" under 70%, enough to
matter. Run under ``perfmon run``; the verdict must name the cause.

* ``comm``    2-rank gloo DDP (torchrun), a 1024-wide MLP on a batch of 128, plus a second
              all-reduce of 1M floats after backward: the step waits ~25-35% on peers.
* ``loader``  one DataLoader worker whose samples sleep on simulated storage reads: the
              step waits ``--wait-share`` (25%) for the next batch. ``--workers 2`` is its fix:
              two workers read in parallel, faster than the step consumes.
* ``compute`` in-memory batches, compute-bound.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)


def mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1))


class SlowStorage(Dataset):
    """Whole batches, each costing ``read_s`` of simulated storage latency in the worker (it sleeps,
    using no CPU), then a copy of one prepared batch."""

    def __init__(self, batch: int, width: int, read_s: float) -> None:
        self.x, self.y, self.read_s = torch.randn(batch, width), torch.randn(batch, 1), read_s

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int):
        time.sleep(self.read_s)
        return self.x.clone(), self.y.clone()


def compute_step_s(model: nn.Module, width: int, steps: int = 20) -> float:
    """The median time of a forward and backward on an in-memory batch: the step's compute, timed
    without an optimizer step (which zero-code mode would count as a training step)."""
    x, y = torch.randn(256, width), torch.randn(256, 1)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        nn.functional.mse_loss(model(x), y).backward()
        times.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["comm", "loader", "compute"])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--wait-share", type=float, default=0.25,
                    help="loader: the share of each step planted as the wait for the next batch")
    ap.add_argument("--workers", type=int, default=1, help="loader: DataLoader workers (1 plants the wait)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="stop after this long (--steps still caps it): twins run side by side end together")
    args = ap.parse_args()
    width = 512
    model: nn.Module = mlp(width)
    extra = None
    if args.scenario == "comm":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo")
        model = DDP(model)
        extra = torch.zeros(1 << 15)          # a metrics/EMA all-reduce the job does after backward
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if args.scenario == "loader":
        # the worker delivers a batch every `read_s`, slower than the step computes one, so the step
        # waits for the rest: read_s is set from this machine's own compute, so the planted share
        # holds on a fast or a slow machine
        read_s = compute_step_s(model, width) / (1.0 - args.wait_share)
        batches = iter(DataLoader(SlowStorage(256, width, read_s), batch_size=None, num_workers=args.workers,
                                  persistent_workers=True, prefetch_factor=2))
    else:
        x, y = torch.randn(256, width), torch.randn(256, 1)
        batches = iter(lambda: (x, y), None)
    stop = time.monotonic() + args.seconds if args.seconds is not None else float("inf")
    for _ in range(args.steps):
        if time.monotonic() >= stop:
            break
        xb, yb = next(batches)
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        if extra is not None:
            import torch.distributed as dist
            dist.all_reduce(extra)
        opt.step()
    print("done", os.getpid())
    if args.scenario == "comm":
        import torch.distributed as dist
        dist.destroy_process_group()
        # leave as tests/compat/job.py does: exit handlers, then no interpreter finalisation (torch gloo teardown abort)
        sys.stdout.flush()
        atexit._run_exitfuncs()
        os._exit(0)


if __name__ == "__main__":
    main()
