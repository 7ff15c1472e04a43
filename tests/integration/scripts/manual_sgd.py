"""Plain PyTorch with no optimizer at all: parameters are updated by hand after each backward.

Prints JSON: iterations, iter_median_s (median time between iteration starts), iters_s (each of those
times), pid.
"""

import argparse
import json
import os
import statistics
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=30)
parser.add_argument("--step-sleep", type=float, default=0.02, help="seconds of 'compute' inside each step")
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
lr = 0.01
starts = []
for _ in range(args.iters):
    starts.append(time.perf_counter())
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    loss = ((model(x) - y) ** 2).mean()
    time.sleep(args.step_sleep)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
            p.grad = None

iters = [b - a for a, b in zip(starts, starts[1:])]
print(json.dumps({"iterations": len(starts), "pid": os.getpid(), "iter_median_s": statistics.median(iters),
                  "iters_s": iters}))
