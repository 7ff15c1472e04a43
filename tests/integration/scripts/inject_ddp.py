"""DistributedDataParallel on gloo (CPU), started bare under torchrun, training until SIGTERM.

After its first optimizer step each rank creates ``--ready DIR/<rank>``, so a test knows the
job trains before ``perfmon inject`` enters it. At its end each rank writes ``DIR/end-<rank>.json``
(a file each: the ranks' stdout lines interleave in the launcher's): its rank, the names of its
threads, the attributes of its DDP module naming perfmon and the number of comm hooks (what a probe
could leave behind). Knows nothing of perfmon.
"""

import argparse
import json
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--ready", required=True, help="directory for the ready files")
parser.add_argument("--step-sleep", type=float, default=0.005)
args = parser.parse_args()

stop = False


def _stop(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, _stop)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(16, 32), torch.randn(16, 1)
steps = 0
while True:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    time.sleep(args.step_sleep)
    loss.backward()
    opt.step()
    steps += 1
    if steps == 1:
        open(os.path.join(args.ready, str(rank)), "w").close()
    flag = torch.tensor([1.0 if stop else 0.0])
    dist.all_reduce(flag)          # every rank leaves at the same step
    if flag.item() > 0:
        break
with open(os.path.join(args.ready, f"end-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "threads": sorted(t.name for t in threading.enumerate()),
               "ddp_attrs": sorted(k for k in vars(model) if "perfmon" in k),
               "comm_hooks": len(model._comm_hooks)}, f)
dist.destroy_process_group()
