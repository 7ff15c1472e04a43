"""A CPU training job for ``perfmon profile``: four efficient blocks and one that
computes the same math as its neighbours (a Linear) as many tiny matmuls in a Python loop.

    python profile_job.py MODE OUT_DIR SECONDS [READY_STEPS]
MODE ``watch``: the model and optimizer are given to ``probe.watch``; ``bare``: they are not.
Writes ``OUT_DIR/ready`` after READY_STEPS steps (200: warm, with a baseline for the profile's
overhead), then on exit ``OUT_DIR/result.json``: the hooks on
every module before the first step and at the end, and ``torch.utils.flop_counter``'s count of
one forward+backward of the slow block on the batch it sees.
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import probe

D, BATCH, PIECES = 384, 512, 96


class LoopedLinear(nn.Module):
    """nn.Linear(D, D)'s math, one 4-column matmul at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D, D) / D ** 0.5)
        self.bias = nn.Parameter(torch.zeros(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        step = D // PIECES
        cols = [x @ self.weight[j:j + step].t() for j in range(0, D, step)]
        return torch.relu(torch.cat(cols, dim=-1) + self.bias)


def block() -> nn.Module:
    return nn.Sequential(nn.Linear(D, D), nn.ReLU())


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = block()
        self.mid = block()
        self.slow = LoopedLinear()
        self.late = block()
        self.head = nn.Linear(D, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.late(self.slow(self.mid(self.embed(x)))))


def hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(m._backward_pre_hooks) for m in model.modules())


def main() -> None:
    mode, out, seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    ready_steps = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    p = probe.start(record=out / "rec")
    if mode == "watch":
        p.watch(model, opt)
    before = hooks(model)
    x, y = torch.randn(BATCH, D), torch.randint(0, 16, (BATCH,))
    end = time.time() + seconds
    step = 0
    while time.time() < end and not (out / "stop").exists():
        with p.step(samples=BATCH):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        step += 1
        if step == ready_steps:
            (out / "ready").write_text("")
    hidden = model.mid(model.embed(x)).detach().requires_grad_()    # the block's input, as in training
    with FlopCounterMode(display=False) as counter:
        model.slow(hidden).sum().backward()
    result = {"hooks_before": before, "hooks_after": hooks(model), "slow_flops": counter.get_total_flops(),
              "steps": step}
    (out / "result.json").write_text(json.dumps(result))
    p.close()


if __name__ == "__main__":
    main()
