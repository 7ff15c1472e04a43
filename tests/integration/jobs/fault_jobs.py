"""Training processes for the fault suite (tests/integration/faults.py). Usage:

    fault_jobs.py record DIR          steps forever with a recording (killed with SIGKILL)
    fault_jobs.py forks METHOD N      DataLoader epochs with 2 workers until N workers were started
    fault_jobs.py storm SECONDS       timed steps while the parent storms the socket (prints JSON)
    fault_jobs.py train [--probe] [--sim-cuda]   deterministic CPU training; prints the losses
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def record(directory: str) -> None:
    import probe

    mon = probe.start(job="killed", record=directory, serve=False, sample_hz=10)
    i = 0
    while True:
        for _batch in mon.loader(range(50)):
            with mon.step(samples=1):
                with mon.phase("forward"):
                    sum(range(200))
            i += 1
            if i == 1:
                print("stepping", flush=True)
            if i % 97 == 0:
                mon.event("checkpoint", seconds=0.001, note="x" * (i % 300))


PARENT = None   # the parent's probe: fork copies it into workers; spawn/forkserver workers start without it


class Probing:
    """A dataset whose items call the probe API from inside the DataLoader worker."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        import torch

        import probe
        worker_mon = probe.start(job="inside-worker")      # must be the disabled probe
        with worker_mon.step(64):                           # the API works there, silently
            pass
        if PARENT is not None:                              # fork: the parent's probe, copied; must stay silent
            PARENT.event("from-a-worker")
            with PARENT.step(1):
                pass
        return torch.tensor([os.getpid(), int(type(worker_mon).__name__ == "_Disabled")])


def forks(method: str, workers_total: int) -> None:
    global PARENT
    import torch
    from torch.utils.data import DataLoader

    import probe

    mon = PARENT = probe.start(job=f"forks-{method}")
    print(mon.socket_path, flush=True)

    input("")   # the parent attaches its viewers, then says go
    started = 0
    rows = []
    while started < workers_total:
        loader = DataLoader(Probing(), batch_size=2, num_workers=2, multiprocessing_context=method,
                            persistent_workers=False)
        for batch in mon.loader(loader):
            with mon.step(samples=len(batch)):
                rows.append(batch)
        started += 2
    rows_t = torch.cat(rows)
    assert os.getpid() not in set(rows_t[:, 0].tolist())
    assert bool(rows_t[:, 1].all()), "a worker got a live probe"
    steps = mon.steps
    mon.close()
    print(json.dumps({"steps": steps, "workers": started, "worker_pids": len(set(rows_t[:, 0].tolist()))}),
          flush=True)


def _fd_count() -> int:
    time.sleep(0.01)
    return len(os.listdir("/proc/self/fd")) - 1     # less the directory listdir opened


def storm(seconds: float) -> None:
    """Blocks of timed steps: the parent says which phase it is in through stdin lines."""
    import probe

    mon = probe.start(job="storm", sample_hz=2)
    print(mon.socket_path, flush=True)
    results = {}
    for line in sys.stdin:
        label = line.strip()
        if label == "end":
            break
        if label.startswith("measure-base"):
            deadline = time.monotonic() + 10
            while mon.sender is not None and mon.sender.viewers and time.monotonic() < deadline:
                time.sleep(0.01)
            rss = _rss_kib()
            try:   # what the allocator keeps cached vs what is still referenced
                import ctypes
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            except OSError:
                pass
            fds = min(_fd_count() for _ in range(5))   # the sampler thread may hold a /proc file open
            results[label] = {"fds": fds, "rss_kib": rss, "rss_trimmed_kib": _rss_kib(),
                              "viewers": len(mon.sender.viewers) if mon.sender else None}
            print("ok", flush=True)
            continue
        times = []
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            t0 = time.perf_counter()
            with mon.step(samples=1):
                with mon.phase("forward"):
                    sum(range(2000))
            times.append(time.perf_counter() - t0)
        times.sort()    # keep the figure, not the list: the job's RSS must show the probe's memory only
        results[label] = {"steps": len(times), "p99": times[min(len(times) - 1, int(0.99 * len(times)))]}
        del times
        print("ok", flush=True)
    results["viewers_left"] = len(mon.sender.viewers) if mon.sender else None
    mon.close()
    print(json.dumps(results), flush=True)


def train(use_probe: bool, sim_cuda: bool) -> None:
    import warnings

    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = [(torch.randn(8, 16), torch.randn(8, 1)) for _ in range(20)]
    mon = None
    cuda = None
    if use_probe:
        import probe
        if sim_cuda:   # SIMULATED CUDA (tests/sim): the model placed on its GPU, sync counting on
            from probe.gpu import cuda as gpu_cuda
            from tests.sim.simulated_cuda import SimulatedCuda
            cuda = SimulatedCuda()
            gpu_cuda.backend = cuda
            cuda.place(model)
        mon = probe.start(job="warnings-train", record=os.environ.get("FAULT_RECORD"), serve=True)
        mon.watch(model=model, optimizer=opt, syncs=True if sim_cuda else None)
    losses = []
    for epoch in range(3):
        batches = mon.loader(data) if mon is not None else iter(data)
        for x, y in batches:
            ctx = mon.step(samples=8) if mon is not None else None
            if ctx is not None:
                ctx.__enter__()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if cuda is not None:
                cuda.synchronizing_op()      # loss.item() on a GPU
            losses.append(loss.item())
            if ctx is not None:
                ctx.__exit__(None, None, None)
        with warnings.catch_warnings():      # the user's own nested filters, inside the loop
            warnings.simplefilter("error")
            if mon is not None:
                mon.event("epoch", n=epoch)
    if mon is not None:
        mon.close()
    print(json.dumps({"losses": [round(v, 10) for v in losses],
                      "syncs_set": None if cuda is None else cuda.sync_mode}), flush=True)


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    kind = sys.argv[1]
    if kind == "record":
        record(sys.argv[2])
    elif kind == "forks":
        forks(sys.argv[2], int(sys.argv[3]))
    elif kind == "storm":
        storm(float(sys.argv[2]))
    elif kind == "train":
        train("--probe" in sys.argv, "--sim-cuda" in sys.argv)
