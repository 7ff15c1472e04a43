"""A real CPU training job whose loader waits on (simulated) storage: perfmon should say data_loading.

argv: JOB SECONDS. Each sample takes 4 ms to "read" (a sleep, like a network filesystem);
a batch of 8 is ~32 ms of waiting against ~1-2 ms of compute in a tiny MLP.
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import probe


class SlowStorage(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int):
        time.sleep(0.004)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), i % 10


def main() -> None:
    job, seconds = sys.argv[1], float(sys.argv[2])
    torch.set_num_threads(1)
    mon = probe.start(job=job)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    print(mon.socket_path, flush=True)
    deadline = time.monotonic() + seconds
    for x, y in mon.loader(DataLoader(SlowStorage(), batch_size=8, num_workers=0)):
        with mon.step(samples=len(y)):
            with mon.phase("forward"):
                loss = loss_fn(model(x), y)
            with mon.phase("backward"):
                opt.zero_grad()
                loss.backward()
            with mon.phase("optimizer"):
                opt.step()
        if time.monotonic() > deadline:
            break
    mon.close()


if __name__ == "__main__":
    main()
