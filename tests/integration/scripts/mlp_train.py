"""A plain PyTorch training loop that knows nothing of perfmon and reports its own timings.

The last stdout line is JSON: optimizer_steps, iter_median_s (median time from one
iteration's start to the next), iters_s (each of those times), in_steps_s, wall_s and ettr (time inside steps / wall
time from the first step's start to the last step's end), pid. A step spans from the
start of its first batch fetch to the end of ``optimizer.step()``. ``--step-sleep``
stands in for device compute inside the step, so timings stay stable on a busy CPU.
``--eval-every`` runs an evaluation pass between steps the wrong way (train mode, grad
enabled: eval-shaped work); ``--leak-mb`` keeps every step's loss and a buffer alive (a
leak), adding ``rss_growth_per_step`` (bytes, over the second half of the run) to the JSON.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def resource_rss() -> int:
    """This process's resident set size now (bytes), from /proc."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30, help="optimizer steps")
parser.add_argument("--forever", action="store_true", help="train until interrupted")
parser.add_argument("--accum", type=int, default=1, help="micro-batches (backwards) per optimizer step")
parser.add_argument("--batches", type=int, default=64, help="batches per epoch")
parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (fork)")
parser.add_argument("--step-sleep", type=float, default=0.02, help="seconds of 'compute' inside each step")
parser.add_argument("--checkpoint-every", type=int, default=0, help="save a checkpoint every N steps")
parser.add_argument("--checkpoint-seconds", type=float, default=0.0, help="extra time each checkpoint takes")
parser.add_argument("--fail-at", type=int, default=0, help="raise an error after this many steps")
parser.add_argument("--eval-every", type=int, default=0, help="an evaluation pass every N steps (train mode, grad on)")
parser.add_argument("--eval-batches", type=int, default=8, help="batches per evaluation pass")
parser.add_argument("--leak-mb", type=float, default=0.0, help="keep each step's loss with its graph and this many MB")
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(args.batches * 16, 32), torch.randn(args.batches * 16, 1))
loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=args.workers,
                    multiprocessing_context="fork" if args.workers else None)
batches = iter(loader)


def next_batch():
    global batches
    try:
        return next(batches)
    except StopIteration:
        batches = iter(loader)       # a new epoch
        return next(batches)


eval_loader = DataLoader(TensorDataset(torch.randn(args.eval_batches * 16, 32), torch.randn(args.eval_batches * 16, 1)),
                         batch_size=16)


def evaluate():
    """The mistake under test: no torch.no_grad(), no model.eval(): each forward builds a graph."""
    total = 0.0
    for x, y in eval_loader:
        total += nn.functional.mse_loss(model(x), y).item()
        time.sleep(args.step_sleep / 2)
    return total


kept = []
rss = []
spans = []
ckpt = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
while args.forever or len(spans) < args.steps:
    if args.eval_every and spans and len(spans) % args.eval_every == 0:
        evaluate()
    opt.zero_grad()
    start = time.perf_counter()          # the step starts at its first batch fetch, as perfmon's does
    for _ in range(args.accum):
        x, y = next_batch()
        loss = nn.functional.mse_loss(model(x), y) / args.accum
        time.sleep(args.step_sleep / args.accum)
        loss.backward()
    opt.step()
    spans.append((start, time.perf_counter()))
    if args.leak_mb:
        kept.append((loss, torch.ones(int(args.leak_mb * 2 ** 18))))     # the leak: float32, touched pages
        rss.append(resource_rss())
    if len(spans) == args.fail_at:
        raise RuntimeError(f"simulated failure after {len(spans)} steps")
    if args.checkpoint_every and len(spans) % args.checkpoint_every == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt)
        time.sleep(args.checkpoint_seconds)

starts = [s for s, _ in spans]
in_steps = sum(e - s for s, e in spans)
wall = spans[-1][1] - spans[0][0]
iters = [b - a for a, b in zip(starts, starts[1:])]
own = {"optimizer_steps": len(spans), "pid": os.getpid(), "in_steps_s": in_steps, "wall_s": wall,
       "ettr": in_steps / wall, "iter_median_s": statistics.median(iters), "iters_s": iters}
if rss:
    own["rss_growth_per_step"] = (rss[-1] - rss[len(rss) // 2]) / (len(rss) - 1 - len(rss) // 2)
print(json.dumps(own))
sys.stdout.flush()
