"""A job whose loader costs two thirds of each step, and its fixed twin (``perfmon compare``'s pair,
and ``perfmon report``'s gains against a real fix).

Plain PyTorch (no perfmon API), run under ``perfmon run``. Every planted cost is a wait, not
computation, so the pair differs by the same amount on any number of cores and under any load:

* each step waits ``STEP_S`` on a simulated accelerator (a sleep in the forward, as a host waits
  on a GPU) around a tiny real model;
* ``slow``: one loader worker reads each batch from simulated storage, ``READ_S`` = 3 x ``STEP_S``
  (a sleep): a batch arrives every ``READ_S``, and the step waits ~2/3 of its time for it;
* ``fixed``: the batches cached in memory (no worker, no read): the step never waits.

Each trains for ``--seconds``, so twins started together step at the same time, under the same load.

The batch is the stored bytes (the step decodes them), so the slow twin's worker hands no tensor
over through shared memory: no per-batch round trip to a worker that may be waiting for a core.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)
WIDTH, BATCH = 64, 32
STEP_S = 0.04
READ_S = 3 * STEP_S
WAIT_SHARE = 1 - STEP_S / READ_S      # the slow twin's planted data wait, as a share of its step


class Storage(Dataset):
    """Whole batches as stored bytes, each after ``read_s`` of simulated storage latency."""

    def __init__(self, read_s: float) -> None:
        self.stored, self.read_s = torch.randn(BATCH, WIDTH + 1).numpy().tobytes(), read_s

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> bytes:
        if self.read_s:
            time.sleep(self.read_s)
        return self.stored


class Accelerator(nn.Module):
    """The step's device time, simulated: the host waits ``STEP_S`` for it, using no CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(STEP_S)
        return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["slow", "fixed"])
    ap.add_argument("--seconds", type=float, default=6.0,
                    help="train this long: twins started together step side by side, under the same load")
    args = ap.parse_args()
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), Accelerator(), nn.Linear(WIDTH, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if args.mode == "slow":
        loader = DataLoader(Storage(READ_S), batch_size=None, num_workers=1, persistent_workers=True)
    else:
        loader = DataLoader(Storage(0.0), batch_size=None)
    batches = iter(loader)
    stop = time.monotonic() + args.seconds
    while time.monotonic() < stop:
        batch = torch.frombuffer(bytearray(next(batches)), dtype=torch.float32).view(BATCH, WIDTH + 1)
        loss = nn.functional.mse_loss(model(batch[:, :WIDTH]), batch[:, WIDTH:])
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
