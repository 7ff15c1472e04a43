"""The batch-fetch clock (probe.fetches) on a real DataLoader: each listener gets every fetch with
its times, a failing listener costs the loop nothing, and an unlistened one hears no more."""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, Dataset

from probe import fetches


class Sleepy(Dataset):
    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.01)
        return torch.full((2,), float(i))


def test_every_listener_gets_each_fetch_with_its_wait_and_the_loading_threads_cpu():
    heard: list[tuple] = []

    def listener(it, batch, t0, t1, c0, c1) -> None:
        heard.append((it, batch, t0, t1, c0, c1))

    def broken(*args) -> None:
        raise RuntimeError("a listener's own bug")

    fetches.listen(broken)
    fetches.listen(listener)
    try:
        it = iter(DataLoader(Sleepy(), batch_size=2))
        batches = [next(it) for _ in range(3)]
    finally:
        fetches.unlisten(broken)
        fetches.unlisten(listener)
    assert [b[0].tolist() for b in batches] == [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0]]   # the loop got its batches
    assert len(heard) == 3 and all(h[0] is it for h in heard)
    for _, _batch, t0, t1, c0, c1 in heard:
        assert t1 - t0 >= 0.02                              # two items sleeping 10 ms each
        assert c0 is not None and 0 <= c1 - c0 < 0.01       # num_workers=0: this thread loads, sleeping
    next(it)
    assert len(heard) == 3                                   # unlistened: nothing more
