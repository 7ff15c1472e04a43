"""A plain PyTorch GAN that knows nothing of perfmon: one loader batch feeds ``--critic``
discriminator (critic) steps, each on its own batch, then one generator step (``--critic 1``:
DCGAN's D step then G step; ``--critic 5``: WGAN's five critic steps per generator step).

The last stdout line is JSON: iterations (generator steps), iter_median_s (median time from one
iteration's start to the next), pid. ``--sleep`` stands in for device compute in each part.
"""

import argparse
import json
import os
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=30, help="generator steps")
parser.add_argument("--critic", type=int, default=1, help="discriminator steps per generator step")
parser.add_argument("--sleep", type=float, default=0.01, help="seconds of 'compute' in each D step (G: twice)")
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


G, D = Generator(), Discriminator()
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
loader = DataLoader(TensorDataset(torch.randn(64 * 16, 16)), batch_size=16, shuffle=True)
batches = iter(loader)


def real_batch() -> torch.Tensor:
    global batches
    try:
        return next(batches)[0]
    except StopIteration:
        batches = iter(loader)
        return next(batches)[0]


starts = []
for _ in range(args.iters):
    starts.append(time.perf_counter())
    for _ in range(args.critic):
        real = real_batch()
        opt_d.zero_grad()
        fake = G(torch.randn(16, 8))
        loss_d = D(fake.detach()).mean() - D(real).mean()
        time.sleep(args.sleep)
        loss_d.backward()
        opt_d.step()
    opt_g.zero_grad()
    loss_g = -D(G(torch.randn(16, 8))).mean()
    time.sleep(2 * args.sleep)
    loss_g.backward()
    opt_g.step()
starts.append(time.perf_counter())
print(json.dumps({"iterations": args.iters, "pid": os.getpid(),
                  "iter_median_s": statistics.median(b - a for a, b in zip(starts, starts[1:]))}))
