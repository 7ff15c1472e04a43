"""A plain PyTorch CPU training loop that knows nothing of perfmon, doing extra work inside each step.

``--mode wait``: between forward and backward the training thread calls a slow service (a sleep
stands for its round trip) lasting 2/3 of the step's compute, so ~40% of each step is waiting.
``--mode tokenize``: the same time goes to pure-Python tokenizing of strings (on CPU, busy).
``--mode compute``: nothing extra. The last stdout line is JSON: steps, extra_share (the extra
part's share of the step time by this script's own clock; a step spans from its batch fetch to
the end of ``optimizer.step()``), step_median_s.
"""

import argparse
import json
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["wait", "tokenize", "compute"], required=True)
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.001)
loader = DataLoader(TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1)), batch_size=256, shuffle=True)
TEXT = " ".join(f"word{i % 977} token{i % 131}" for i in range(2000))
RATIO = 2 / 3          # extra time per unit of compute: 0.4 of the step


def fetch_from_service(latency: float) -> None:
    """A remote call's round trip, which the sleep stands for."""
    time.sleep(latency)


def tokenize(budget: float) -> None:
    vocab: dict[str, int] = {}
    deadline = time.perf_counter() + budget
    while time.perf_counter() < deadline:
        ids = [vocab.setdefault(w, len(vocab)) for w in TEXT.split()]
        del ids


spans, extras, rest = [], [], 0.0
batches = iter(loader)
while len(spans) < args.steps:
    start = time.perf_counter()
    try:
        x, y = next(batches)
    except StopIteration:
        batches = iter(loader)
        x, y = next(batches)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    extra_start = time.perf_counter()
    budget = RATIO * (extra_start - start + rest)   # this step's forward and the last one's backward
    if args.mode == "wait":
        fetch_from_service(budget)
    elif args.mode == "tokenize":
        tokenize(budget)
    extra_end = time.perf_counter()
    loss.backward()
    opt.step()
    end = time.perf_counter()
    rest = end - extra_end
    spans.append(end - start)
    extras.append(extra_end - extra_start if args.mode != "compute" else 0.0)

print(json.dumps({"steps": len(spans), "extra_share": sum(extras[1:]) / sum(spans[1:]),
                  "step_median_s": statistics.median(spans)}))
