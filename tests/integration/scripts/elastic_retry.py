"""Plain training under torchrun that fails on its first attempt; torchrun restarts it (--max-restarts).

Uses only what torchrun provides (TORCHELASTIC_RESTART_COUNT); prints JSON: restart, optimizer_steps, pid.
"""

import json
import os

import torch
from torch import nn

torch.set_num_threads(1)
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = 0
for _ in range(6):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    steps += 1
    if restart == 0 and steps == 3:
        raise SystemExit(f"simulated crash on attempt {restart}")
print(json.dumps({"restart": restart, "optimizer_steps": steps, "pid": os.getpid()}), flush=True)
