"""A 2-rank DDP (gloo) CPU training loop that knows nothing of perfmon; ``--sleep K`` sleeps K times its
forward and backward's own compute after ``opt.zero_grad()``, before the forward (~5 ms on an idle
machine with K = 2; the test takes 4, so the sleep outweighs the all-reduce however slow the machine's
gloo): under ``perfmon run`` that is time between steps, the loop's own wait, on every step.

Each rank prints one JSON line by its own clock over the last ``WINDOW`` iterations (an iteration: from
one ``zero_grad`` to the next, as a step's start to the next's): ``rank``, ``iter_median_s``, ``sleep_share``
(the sleep's share of the iterations) and ``exposed_share``: the time in ``loss.backward()`` beyond its
solo compute (the same backward under ``no_sync()``, without DDP's all-reduce, timed before training) as
a share of the iterations: DDP's gradient all-reduce that backward did not hide.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--sleep", type=float, default=0.0, help="times the step's own compute")
args = parser.parse_args()

WINDOW = 50
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))


x, y = torch.randn(64, 512), torch.randn(64, 1)
# one bucket: the all-reduce starts when backward's compute is done and nothing overlaps it, so the time
# backward spends beyond its compute is the all-reduce's, not compute slowed by a gloo thread beside it;
# gradients as views of the bucket: no copies in and out of it either
model = DDP(build(), bucket_cap_mb=64, gradient_as_bucket_view=True)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
solo_bwd, solo_step = [], []
for _ in range(35):                     # the backward's own compute: DDP without its all-reduce (no_sync)
    with model.no_sync():
        t0 = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        solo_bwd.append(t2 - t1)
        solo_step.append(t2 - t0)
compute = statistics.median(solo_bwd[5:])
nap = args.sleep * statistics.median(solo_step[5:])
starts, bwds, sleeps = [], [], []
for _i in range(args.steps):
    starts.append(time.perf_counter())
    opt.zero_grad()
    if args.sleep:
        t0 = time.perf_counter()
        time.sleep(nap)
        sleeps.append(time.perf_counter() - t0)
    loss = nn.functional.mse_loss(model(x), y)
    t0 = time.perf_counter()
    loss.backward()
    bwds.append(time.perf_counter() - t0)
    opt.step()
end = time.perf_counter()
dist.barrier()
spans = [b - a for a, b in zip(starts, starts[1:] + [end])]
whole = sum(spans[-WINDOW:])
own = {"rank": rank, "pid": os.getpid(), "iter_median_s": statistics.median(spans),
       "sleep_share": sum(sleeps[-WINDOW:]) / whole,
       "exposed_share": max(0.0, sum(bwds[-WINDOW:]) - compute * len(bwds[-WINDOW:])) / whole}
sys.stdout.write(json.dumps(own) + "\n")     # one write: the two ranks share the pipe, and never split a line
sys.stdout.flush()
dist.destroy_process_group()
