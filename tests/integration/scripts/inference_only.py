"""A process that uses torch but never trains: evaluation under no_grad, and a python helper subprocess.

Prints JSON: forwards, pid.
"""

import json
import os
import subprocess
import sys

import torch
from torch import nn

torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2)).eval()
with torch.no_grad():
    for _ in range(20):
        model(torch.randn(8, 16))
out = model(torch.randn(4, 16))            # grad enabled, eval mode, no backward: still not training
subprocess.run([sys.executable, "-c", "import torch; print(torch.ones(2).sum().item())"], check=True)
print(json.dumps({"forwards": 21, "pid": os.getpid()}), flush=True)
