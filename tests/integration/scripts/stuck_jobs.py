"""Jobs that stop making progress, for the stuck diagnosis (issue 14).

    stuck_jobs.py collective MARK   # under torchrun, 2 ranks: rank 1 sleeps before its 20th all-reduce
    stuck_jobs.py gil MARK          # under torchrun, 2 ranks: rank 1 holds the GIL in C before it
    stuck_jobs.py loader MARK       # one process: a DataLoader worker hangs forever on one sample

MARK is a file each job writes when its stall begins (time, and the hung worker's pid), so a
test knows when to start the clock. The jobs never end by themselves once stalled: the test
kills them.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import probe


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
    else:
        collective(mark_path, hold_gil=mode == "gil")
