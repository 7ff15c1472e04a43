"""A plain training script, started without perfmon, that ``perfmon inject`` enters while it runs.

At each ``--pause-at`` step it prints ``{"pause": N, "pid": ...}`` and waits for a line on stdin,
so a test can inject, report and detach at known steps (at the step's end, or with
``--pause-after-backward`` inside it, after its forward and backward; with ``--pause-in-python`` its
main thread keeps running Python meanwhile, as a training loop's does, so that it reaches the safe
points where ``sys.remote_exec`` enters; else it blocks in ``read``). With ``--until-told`` it trains instead
until a line arrives on stdin (read by a thread of its own, which is parked in the kernel meanwhile,
as a training process's helper threads are), after printing ``{"ready": pid, "importable": [...]}``
(which of perfmon's packages and its dependencies its environment has) at its first step.
At the first pause (or that first step) it notes what a probe could leave behind (threads, file descriptors,
torch's global hooks, the functions perfmon wraps, sys.path, sys.meta_path, warning filters, sys.modules, live
objects of perfmon's classes); the last stdout line is JSON with the final loss (``repr``: bit-identical or
not), ``residue``: what differs at the end from that baseline (empty when nothing of perfmon is left),
``nvml`` (with ``--simulated-nvml``: NVML's init count and the device calls made), and ``rss_kb``: resident
memory at the first pause and at the end.
"""

import argparse
import gc
import importlib.util
import json
import os
import select
import sys
import threading
import time
import types
import warnings

import torch
import torch._dynamo  # noqa: F401  (loaded by most training stacks; torch modules the probe loads stay loaded)
import torch.distributed as dist
from torch import nn
from torch.optim import optimizer as optim
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--pause-at", default="", help="comma-separated steps to pause at")
parser.add_argument("--pause-in-python", action="store_true", help="at a pause, run Python every 50 ms")
parser.add_argument("--until-told", action="store_true", help="train until a line arrives on stdin")
parser.add_argument("--pause-after-backward", action="store_true",
                    help="pause inside the step, between backward and the optimizer's step")
parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep in each step")
parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (persistent)")
parser.add_argument("--simulated-nvml", action="store_true",
                    help="a SIMULATED pynvml (tests/sim, on PYTHONPATH) as the job's own, initialised once by the job")
args = parser.parse_args()
pauses = {int(x) for x in args.pause_at.split(",") if x}

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(64 * 16, 32), torch.randn(64 * 16, 1))
# workers forked (Python 3.14's default is forkserver): copies of this process, its command line included
loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=args.workers, persistent_workers=args.workers > 0,
                    multiprocessing_context="fork" if args.workers else None)
told = threading.Event()
nvml = None
if args.simulated_nvml:
    from tests.sim import simulated_pynvml
    nvml = simulated_pynvml.build([simulated_pynvml.SimulatedGpu()])
    sys.modules["pynvml"] = nvml
    nvml.nvmlInit()


def listen() -> None:
    sys.stdin.readline()
    told.set()


def state() -> dict:
    """What perfmon could leave behind, as comparable values (an atexit entry would keep its object alive)."""
    gc.collect()
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not link.startswith("/dev/shm/"):     # DataLoader workers' batches in flight
            fds[fd] = link
    mod = torch.nn.modules.module
    return {
        "threads": sorted(t.name for t in threading.enumerate() if t.name != "told"),
        "fds": fds,
        "global_hooks": [len(getattr(mod, n)) for n in dir(mod) if n.startswith("_global_") and n.endswith("hooks")]
        + [len(optim._global_optimizer_pre_hooks), len(optim._global_optimizer_post_hooks)],
        "module_hooks": [len(h) for m in model.modules() for h in (m._forward_pre_hooks, m._forward_hooks,
                                                                   m._backward_hooks, m._backward_pre_hooks)],
        "functions": [id(f) for f in (torch.autograd.backward, torch.optim.Optimizer.__init__,
                                      _BaseDataLoaderIter.__next__, nn.Module.__getstate__, sys.excepthook,
                                      dist.all_reduce, dist.broadcast, dist.barrier, torch.Tensor.backward)],
        "sys_path": list(sys.path),
        "meta_path": [type(f).__name__ for f in sys.meta_path],
        "warning_filters": [str(f) for f in warnings.filters],
        "modules": sorted(n for n in sys.modules if not n.startswith("torch")),
        "perfmon_objects": sorted(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects()
                                  if str(type(o).__module__).split(".")[0] == "probe"),
        "perfmon_code": sorted(_code_name(o) for o in gc.get_objects() if _is_perfmon_code(o)),
    }


PERFMON_PACKAGES = ("probe", "msgpack", "psutil", "pynvml", "tui", "perfmon_analysis")


def _is_perfmon_code(obj: object) -> bool:
    """A module, function or class of perfmon or of the packages its probe loads: kept alive, it
    keeps a whole module's code and globals. (Exact type tests: no ``__class__`` lookups, which some
    torch objects answer with a warning.)"""
    kind = type(obj)
    if kind is types.ModuleType:
        name = obj.__name__
    elif kind is types.FunctionType:
        name = obj.__module__
    elif issubclass(kind, type):
        name = obj.__dict__.get("__module__")
    else:
        return False
    return str(name).split(".")[0] in PERFMON_PACKAGES


def _code_name(obj: object) -> str:
    return f"{type(obj).__name__} {getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', obj.__name__)}"


def pause(step: int) -> None:
    print(json.dumps({"pause": step, "pid": os.getpid()}), flush=True)
    if args.pause_in_python:
        while not select.select([sys.stdin], [], [], 0.05)[0]:
            pass
    sys.stdin.readline()


def rss_kb() -> int:
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS:")).split()[1])


baseline = None
rss = None


def at_pause(step: int) -> None:
    global baseline, rss
    if baseline is None:
        baseline = state()
        rss = rss_kb()
    pause(step)


batches = iter(loader)
step = 0
while (not told.is_set()) if args.until_told else step < args.steps:
    try:
        x, y = next(batches)
    except StopIteration:
        batches = iter(loader)
        continue
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    if args.pause_after_backward and step + 1 in pauses:
        at_pause(step + 1)
    opt.step()
    step += 1
    if args.step_sleep:
        time.sleep(args.step_sleep)
    if args.until_told and step == 1:
        baseline = state()
        rss = rss_kb()
        threading.Thread(target=listen, name="told", daemon=True).start()
        print(json.dumps({"ready": os.getpid(), "importable": sorted(
            name for name in PERFMON_PACKAGES if name in sys.modules or importlib.util.find_spec(name))}), flush=True)
    if step in pauses and not args.pause_after_backward:
        at_pause(step)

end = state()
residue = {k: {"before": baseline[k], "after": end[k]} for k in (baseline or {}) if baseline[k] != end[k]}
print(json.dumps({"loss": repr(loss.item()), "steps": step, "residue": residue, "rss_kb": [rss, rss_kb()],
                  **({"nvml": {"initialized": nvml.initialized(),
                               "calls": sum(sum(d.calls.values()) for d in nvml.devices)}}
                     if nvml is not None else {})}), flush=True)
