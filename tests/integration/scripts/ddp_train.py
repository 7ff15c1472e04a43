"""Plain DistributedDataParallel training on gloo (CPU), launched by torchrun; knows nothing of perfmon.

Each rank prints JSON: rank, world_size, optimizer_steps, pid.
"""

import argparse
import atexit
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--step-sleep", type=float, default=0.005)
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
n = args.steps * 16 * dist.get_world_size()
data = TensorDataset(torch.randn(n, 32), torch.randn(n, 1))
loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
steps = 0
for x, y in loader:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    time.sleep(args.step_sleep)
    loss.backward()
    opt.step()
    steps += 1
line = json.dumps({"rank": rank, "world_size": dist.get_world_size(), "optimizer_steps": steps, "pid": os.getpid()})
os.write(1, (line + "\n").encode())   # one write: the ranks share stdout
dist.destroy_process_group()
# leave as tests/compat/job.py does: exit handlers, then no interpreter finalisation (torch gloo teardown abort)
sys.stdout.flush()
atexit._run_exitfuncs()
os._exit(0)
