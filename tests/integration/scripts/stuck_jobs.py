"""Jobs that stop making progress, for the stuck diagnosis.

    stuck_jobs.py collective MARK   # under torchrun, 2 ranks: rank 1 sleeps before its 20th all-reduce
    stuck_jobs.py gil MARK          # under torchrun, 2 ranks: rank 1 holds the GIL in C before it
    stuck_jobs.py loader MARK       # one process: a DataLoader worker hangs forever on one sample
    stuck_jobs.py flight MARK       # under torchrun, 2 ranks: each writes what torch's flight recorders
                                    # hold (probe.flight), rank 1 before a 4th all-reduce it never
                                    # enqueues, rank 0 while it waits in that one

MARK is a file each job writes when its stall begins (time, and the hung worker's pid), so a
test knows when to start the clock. The jobs never end by themselves once stalled: the test
kills them.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import probe
from probe.flight import flight_recorder


def collective(mark: Path, hold_gil: bool) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=150))   # ends by itself if not killed
    rank = dist.get_rank()
    mon = probe.start()
    mon.watch()                      # the collective ledger: sequence numbers per group
    x = torch.ones(1000)
    for i in range(60):
        with mon.step():
            if rank == 1 and i == 19:
                mark.write_text(f"{time.time()}\n")
                if hold_gil:
                    ctypes.PyDLL(None).sleep(120)   # libc sleep holding the GIL: no Python thread runs
                time.sleep(120)   # STALL LINE: rank 1 never reaches its 20th all-reduce
            dist.all_reduce(x)
            time.sleep(0.1)


def flight(mark: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=150))
    rank = dist.get_rank()
    x = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(x)
    out = mark.with_name(f"{mark.name}.{rank}")
    if rank == 1:
        _write(out, flight_recorder())
        time.sleep(120)   # never enqueues the 4th all-reduce: the test kills the job
    threading.Thread(target=_look_while_waiting, args=(out,), daemon=True).start()
    dist.all_reduce(x)


def _look_while_waiting(out: Path) -> None:
    """Rank 0's recorder, read from a thread while the training thread waits in all-reduce #4
    (until the recorder holds it, or 60 s)."""
    deadline = time.monotonic() + 60
    found = flight_recorder()
    while not any(e["seq"] == 4 for e in (found or {}).get("flight", {}).get("entries", [])) and \
            time.monotonic() < deadline:
        found = flight_recorder()
    _write(out, found)


def _write(path: Path, value: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value) + "\n")
    os.replace(tmp, path)


class HangingDataset(torch.utils.data.Dataset):
    """Sample 40 never loads: its worker waits forever (a dead NFS read, a lock never released)."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, idx: int) -> torch.Tensor:
        if idx == 40:
            self.mark.write_text(f"{time.time()} {os.getpid()}\n")
            threading.Event().wait()
        time.sleep(0.005)
        return torch.ones(8)


def loader(mark: Path) -> None:
    mon = probe.start()
    data = torch.utils.data.DataLoader(HangingDataset(mark), batch_size=1, num_workers=2)
    model = torch.nn.Linear(8, 1)
    for batch in mon.loader(data):   # ends when the test kills it: the hung worker never returns
        with mon.step():
            model(batch).sum().backward()
            time.sleep(0.02)


if __name__ == "__main__":
    mode, mark_path = sys.argv[1], Path(sys.argv[2])
    if mode == "loader":
        loader(mark_path)
    elif mode == "flight":
        flight(mark_path)
    else:
        collective(mark_path, hold_gil=mode == "gil")
