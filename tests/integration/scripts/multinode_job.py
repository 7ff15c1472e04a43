"""One rank of a DDP job launched as several "nodes" on this machine.

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT \
        multinode_job.py --steps N --slow-rank R

Every rank trains a tiny model with DDP over gloo; rank R's step holds 3x the "compute" (Python
on the CPU until a wall-clock deadline, standing in for device work, so timings hold on a busy
CPU; a sleep would be a wait, which perfmon tells apart) and the others wait for it in the
all-reduce. Uses the probe's API (each launcher's PERFMON_DIR is that node's socket directory).
"""

import argparse
import atexit
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

import probe

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--work", type=float, default=0.03, help="seconds of 'compute' per step")
parser.add_argument("--stick-file", default=None,
                    help="once this file exists, --stick-rank sleeps in its step for good")
parser.add_argument("--stick-rank", type=int, default=-1)
parser.add_argument("--data-ms", type=float, default=0.0, help="each batch takes this long to come (a sleep)")
args = parser.parse_args()

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = probe.start()
mon.watch(model=model, optimizer=opt)
x = torch.randn(16, 64)


def compute(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))


def batches():
    for i in range(args.steps):
        time.sleep(args.data_ms / 1000)
        yield i


for _ in mon.loader(batches()):
    with mon.step(samples=16, tokens=16 * 64):
        with mon.phase("forward"):
            loss = model(x).square().mean()
            compute(args.work * (3 if rank == args.slow_rank else 1))
            if rank == args.stick_rank and os.path.exists(args.stick_file):
                time.sleep(3600)    # STUCK: never reaches this step's all-reduce; the others wait in it
        with mon.phase("backward"):
            loss.backward()
        opt.step()
        opt.zero_grad()
mon.close()
dist.destroy_process_group()
# leave as tests/compat/job.py does: exit handlers, then no interpreter finalisation (torch gloo teardown abort)
sys.stdout.flush()
atexit._run_exitfuncs()
os._exit(0)
