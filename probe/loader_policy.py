"""When the training thread's CPU time inside a loader fetch is read (one policy, two users).

``Probe.loader()`` and zero-code mode's ``DataLoader`` iterator wrapper (``probe.auto``)
both time each ``next()`` on the training thread. When that thread does the loading
itself (``num_workers=0``, plain iterables), its CPU time inside ``next()`` tells
CPU-bound preprocessing from waiting on I/O. Reading it costs two syscalls, so it is
read only for the ``CPU_TIMED_BATCHES`` fetches after any fetch that waited longer than
``CPU_TIMED_WAIT``: a loader that never makes the step wait costs nothing extra.
"""

from __future__ import annotations

CPU_TIMED_WAIT = 50e-6   # a loader wait above this (s) switches on CPU timing ...
CPU_TIMED_BATCHES = 64   # ... for this many fetches


class CpuTimingPolicy:
    """``left``: fetches whose CPU time is still to be read. Hot path: attribute reads only."""

    __slots__ = ("left",)

    def __init__(self, left: int = CPU_TIMED_BATCHES) -> None:
        self.left = left

    def fetched(self, wait: float, timed: bool) -> None:
        """After one fetch that waited ``wait`` seconds (``timed``: its CPU time was read)."""
        if timed:
            self.left -= 1
        if wait > CPU_TIMED_WAIT:
            self.left = CPU_TIMED_BATCHES
