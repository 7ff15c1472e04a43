"""DataLoader workers (fork) calling probe.start() must get a silent, socket-less probe."""

import os

import torch
from torch.utils.data import DataLoader, Dataset

import probe


class Probing(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        mon = probe.start(job="inside-worker")
        return torch.tensor([i, os.getpid(), int(type(mon).__name__ == "_Disabled")])


mon = probe.start(job="workers-main")
print(mon.socket_path, flush=True)
loader = DataLoader(Probing(), batch_size=8, num_workers=2, multiprocessing_context="fork")
rows = []
for batch in mon.loader(loader):
    with mon.step(samples=len(batch)):
        rows.append(batch)
        socks = [p for p in os.listdir(os.environ["PERFMON_DIR"]) if p.endswith(".sock")]
        assert len(socks) == 1, socks
rows = torch.cat(rows)
worker_pids = set(rows[:, 1].tolist())
assert os.getpid() not in worker_pids and len(worker_pids) >= 1
assert rows[:, 2].all(), "a worker got a live probe"
mon.close()
print("ok", mon._step_no, flush=True)
