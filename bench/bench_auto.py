"""Main-thread cost of zero-code mode (``perfmon run``) per training step.

Two measurements, both in one process with a live probe (as ``perfmon run`` leaves it
after the first step):

1. hooks alone: the calls zero-code mode adds to one step of a loop with one
   DataLoader fetch, one root-module forward, one backward and one optimizer step,
   made directly (the wrapped functions replaced by no-ops); minus the same calls
   with zero-code mode switched off. This is the number to hold against the budget.
2. a real tiny loop (Linear 32->64->1, batch 16, SGD, well under 1 ms a step) in
   child processes without perfmon, with zero-code mode, and written against the
   API with watch(); alternated so machine drift hits all three: what a user would
   see, probe threads included.

    python bench/bench_auto.py [--steps 20000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("PERFMON_DIR", tempfile.mkdtemp(prefix="perfmon-bench-"))
os.chmod(os.environ["PERFMON_DIR"], 0o700)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from probe import auto  # noqa: E402


def tiny_loop(steps: int, mon=None) -> float:
    """µs-scale training steps; with ``mon`` the same loop written against the explicit API."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(steps * 16, 32), torch.randn(steps * 16, 1)), batch_size=16)
    if mon is not None:
        mon.watch(model=model, optimizer=opt)
        t0 = time.perf_counter()
        for x, y in mon.loader(loader):
            with mon.step(samples=16):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        return (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


class _LoaderIter:
    """Stands in for a single-process DataLoader iterator."""

    _num_workers = 0


def hook_chain(steps: int, model: nn.Module, opt: torch.optim.Optimizer) -> float:
    """One step's worth of zero-code calls; the wrapped originals are no-ops."""
    fetch = auto._wrap_next(lambda it: None)
    backward = auto._wrap_backward(lambda *a, **k: None)
    it = _LoaderIter()
    t0 = time.perf_counter()
    for _ in range(steps):
        fetch(it)
        auto._fwd_pre(model, ())
        auto._fwd_post(model, (), None)
        backward()
        auto._opt_pre(opt, (), {})
        auto._opt_post(opt, (), {})
    return (time.perf_counter() - t0) / steps


def child(mode: str, steps: int) -> None:
    """One measurement in a fresh process: print µs/step of the tiny loop."""
    torch.set_num_threads(1)
    if mode == "api":
        import probe
        mon = probe.start(job="bench-api")
        tiny_loop(50, mon)
        print(tiny_loop(steps, mon) * 1e6)
        mon.close()
        return
    if mode == "on":
        auto.install()
        tiny_loop(50)                              # first step: the probe starts, hooks narrow to the roots
        assert auto._auto.probe is not None, "zero-code mode did not start"
    print(tiny_loop(steps) * 1e6)
    if mode == "on":
        auto._auto.probe.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--child", choices=["on", "off", "api"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    torch.set_num_threads(1)

    loop: dict[str, list[float]] = {"off": [], "on": [], "api": []}
    for _ in range(args.repeats):
        for mode in loop:
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", "3000"],
                                 capture_output=True, text=True, check=True)
            loop[mode].append(float(out.stdout.split()[-1]))

    auto.install()
    a = auto._auto
    tiny_loop(50)
    assert a.probe is not None, "zero-code mode did not start"
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    on, off = [], []
    for _ in range(args.repeats):
        a.off = False
        on.append(hook_chain(args.steps, model, opt))
        a.off = True
        off.append(hook_chain(args.steps, model, opt))
    a.off = False
    cost = [x - y for x, y in zip(on, off)]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, torch {torch.__version__}")
    print(f"hooks alone: {statistics.median(cost) * 1e6:.2f} µs/step (min {min(cost) * 1e6:.2f}, "
          f"max {max(cost) * 1e6:.2f}; {args.steps} steps x {args.repeats})")
    b, w, e = (statistics.median(loop[k]) for k in ("off", "on", "api"))
    print(f"tiny real loop ({args.repeats} alternated runs each, medians): {b:.1f} µs/step without perfmon, "
          f"{w:.1f} with zero-code mode ({w - b:+.1f}), {e:.1f} with the API + watch() ({e - b:+.1f})")
    a.probe.close()


if __name__ == "__main__":
    main()
