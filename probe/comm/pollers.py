"""Collectives whose end the host never sees (CUDA): polled off the training thread by the
probe's GPU poller (``probe.gpu.cuda.Poller``) and charged to the tracker when they finish."""

from __future__ import annotations

import collections
from typing import Any

from probe.comm.tracker import CollectiveCall, CommTracker

MAX_ASYNC = 4096       # async works remembered for Work.wait() timing


class WorkPoller:
    """Poller client: reads ``Work._get_duration()`` once ``is_completed()`` (NCCL timing on)."""

    def __init__(self, tracker: CommTracker) -> None:
        self.tracker = tracker
        self.pending: collections.deque = collections.deque(maxlen=MAX_ASYNC)   # oldest untimed beyond it
        self.broken = False
        self.closed = False     # the probe closed: nothing more is queued (CommState.close)

    def add(self, work: Any, item: CollectiveCall) -> None:
        if self.broken or self.closed:
            self.tracker.add(item)
        else:
            self.pending.append((work, item))

    def __call__(self) -> bool:
        n = len(self.pending)
        for _ in range(n):
            work, item = self.pending.popleft()
            try:
                finished = work.is_completed()
            except Exception:
                finished = True
            if not finished:
                self.pending.append((work, item))
                continue
            if not self.broken:
                try:
                    item.seconds = float(work._get_duration()) / 1e3
                except Exception:      # timing not enabled after all, or not supported
                    self.broken = True
                    self.tracker.error()
            self.tracker.add(item)         # exposed stays unknown: async on the device
        return bool(self.pending)


class EventPairPoller:
    """Poller client for synchronous CUDA collectives bracketed by two events.

    Event pairs are reused (``free``): creating CUDA events is costly (ATen pools them too).
    """

    MAX_PAIRS = 256     # in flight at most; beyond that a collective is counted but not timed

    def __init__(self, tracker: CommTracker) -> None:
        self.tracker = tracker
        self.pending: collections.deque = collections.deque()
        self.free: collections.deque = collections.deque()
        self.created = 0

    def pair(self, cuda: Any) -> tuple[Any, Any] | None:
        if self.free:
            return self.free.popleft()
        if self.created >= self.MAX_PAIRS:
            return None
        self.created += 1
        return cuda.new_event(), cuda.new_event()

    def add(self, start: Any, end: Any, item: CollectiveCall) -> None:
        self.pending.append((start, end, item))

    def __call__(self) -> bool:
        while self.pending:
            start, end, item = self.pending[0]
            if not end.query():
                return True
            self.pending.popleft()
            try:
                item.seconds = start.elapsed_time(end) / 1e3
                item.exposed = item.seconds
            except Exception:
                self.tracker.error()
            self.free.append((start, end))
            self.tracker.add(item)
        return False


def gpu_poller(probe: Any) -> Any:
    """The probe's GPU poller thread (``probe.gpu.cuda.poller_for``), or None without CUDA."""
    try:
        from probe.gpu.cuda import poller_for
        return poller_for(probe)
    except Exception:
        return None
