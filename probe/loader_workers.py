"""CPU use of DataLoader worker processes, so a data stall can be told apart:
workers near 100% of a core each = preprocessing-bound; mostly idle = I/O-bound.

Workers are found from the iterators ``Probe.loader()`` wrapped: a multi-process
``_MultiProcessingDataLoaderIter`` keeps them in the private ``_workers`` list
(``multiprocessing.Process`` objects with ``.pid``); when that attribute is
missing (another torch version) the process's children are listed with psutil
instead (about 1 ms, so at most every ``RESCAN_SECONDS``). Single-process loading
(``num_workers=0``) is measured on the training thread instead: the step record's
``data_cpu`` (probe.core).
"""

from __future__ import annotations

import time
from typing import Any

import psutil

RESCAN_SECONDS = 10.0
MULTI_ITER = "_MultiProcessingDataLoaderIter"


def worker_pids(iterators: list[Any]) -> tuple[bool, set[int] | None]:
    """(a multi-process loader exists, its worker pids or None when they cannot be read)."""
    multi = False
    pids: set[int] = set()
    unreadable = False
    for ref in list(iterators):
        it = ref()
        if it is None:
            continue
        workers = getattr(it, "_workers", None)
        if workers is None:
            if type(it).__name__ == MULTI_ITER:
                multi = True
                unreadable = True
            continue
        multi = True
        if getattr(it, "_shutdown", False):
            continue
        for worker in workers:
            pid = getattr(worker, "pid", None)
            if pid:
                pids.add(pid)
    return multi, (None if unreadable and not pids else pids)


class LoaderWorkersSource:
    """``host.loader_workers``, ``host.loader_cpu`` (mean share of one core per worker),
    ``host.loader_cpu_max``."""

    name = "loader_workers"

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.procs: dict[int, psutil.Process] = {}
        self.prev: dict[int, tuple[float, float]] = {}   # pid -> (wall, cpu seconds)
        self.children: set[int] = set()
        self.scanned_at = float("-inf")

    def _fallback_pids(self) -> set[int]:
        now = time.monotonic()
        if now - self.scanned_at >= RESCAN_SECONDS:
            self.scanned_at = now
            try:
                me = psutil.Process()
                cmdline = me.cmdline()
                self.children = {c.pid for c in me.children(recursive=False) if _same_cmdline(c, cmdline)}
            except psutil.Error:
                self.children = set()
        return self.children

    def read(self) -> dict[str, Any]:
        multi, pids = worker_pids(self.probe.loader_iterators)
        if not multi:
            return {}
        if pids is None:
            pids = self._fallback_pids()
        shares: list[float] = []
        now = time.monotonic()
        for pid in pids:
            share = self._share(pid, now)
            if share is not None:
                shares.append(share)
        for pid in list(self.prev):
            if pid not in pids:
                self.prev.pop(pid, None)
                self.procs.pop(pid, None)
        host: dict[str, Any] = {"loader_workers": len(pids), "loader_cpu": None, "loader_cpu_max": None}
        if shares:
            host["loader_cpu"] = sum(shares) / len(shares)
            host["loader_cpu_max"] = max(shares)
        return {"host": host}

    def _share(self, pid: int, now: float) -> float | None:
        """Share of one core this worker used since the previous read (None the first time)."""
        try:
            proc = self.procs.get(pid)
            if proc is None:
                proc = self.procs[pid] = psutil.Process(pid)
            times = proc.cpu_times()
        except psutil.Error:
            self.procs.pop(pid, None)
            self.prev.pop(pid, None)
            return None
        cpu = times.user + times.system
        prev = self.prev.get(pid)
        self.prev[pid] = (now, cpu)
        if prev is None or now <= prev[0]:
            return None
        return max(0.0, (cpu - prev[1]) / (now - prev[0]))


def _same_cmdline(child: psutil.Process, cmdline: list[str]) -> bool:
    """Forked DataLoader workers keep the parent's command line; compile workers and
    subprocesses do not."""
    try:
        return child.cmdline() == cmdline
    except psutil.Error:
        return False
