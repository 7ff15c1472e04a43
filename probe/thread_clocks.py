"""Other threads' CPU clocks, read from the where sampler's thread (``probe.where``): the training
thread's, to tell a sample busy from waiting, and the process's other Python threads', to name the one
on CPU while the training thread waits (the GIL's holder).

Where Linux's schedstat is readable (``/proc/self/task/TID/schedstat``), a thread's time runnable on a
run queue is read with its CPU time: a thread that wants a core but waits for one (more runnable threads
than cores) is working, not waiting, so a loaded machine does not turn compute into "waiting". Without
schedstat, the thread's CPU clock (``pthread_getcpuclockid``) alone.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

BUSY_SHARE = 0.5        # CPU time over wall time at or above which a thread is "busy"
MAX_THREADS = 8         # other Python threads whose CPU clocks are read (GIL holders)
THREADS_EVERY_S = 1.0   # how often the list of other threads is refreshed

BUSY = "busy"
WAITING = "waiting"

Reader = Callable[[], "tuple[float, float | None]"]


class ThreadClock:
    """Another thread's time on CPU and, where Linux's schedstat is readable, waiting on a run
    queue (runnable, no core free), read from this thread.

    A thread that wants a core but waits for one (more runnable threads than cores) is busy,
    not waiting: counting its run-queue delay keeps a loaded machine from turning compute into
    "waiting". Without schedstat, the thread's CPU clock (``pthread_getcpuclockid``) alone."""

    def __init__(self) -> None:
        self.thread_id: int | None = None
        self.read: Reader | None = None   # -> (cpu s, run-queue s | None)
        self.last: tuple[float, float, float | None] | None = None        # (wall, cpu, runq) at the previous look
        self.queued: dict[str, list[float]] = {}   # count key -> [run-queue s, wall s] of the looks counted

    def state(self, thread_id: int, alive: bool, count: str | None = None) -> str | None:
        """"busy" or "waiting" over the time since the previous look (the first: None); None when not known.
        ``count``: add this look's run-queue and wall time to ``queued[count]`` (schedstat only)."""
        if thread_id != self.thread_id:
            self.thread_id, self.read, self.last = thread_id, None, None
        if self.read is None:
            if not alive:     # only for a live thread: its id names a thread that exists
                return None
            self.read = _reader(thread_id)
            if self.read is None:
                return None
        wall = time.perf_counter()
        try:
            cpu, runq = self.read()
        except (OSError, ValueError, IndexError):   # the thread ended
            self.read, self.last = None, None
            return None
        last, self.last = self.last, (wall, cpu, runq)
        if last is None or wall <= last[0]:
            return None
        span = wall - last[0]
        wanted = cpu - last[1]
        if runq is not None and last[2] is not None:
            wanted += runq - last[2]
            if count is not None:
                summed = self.queued.setdefault(count, [0.0, 0.0])
                summed[0] += runq - last[2]
                summed[1] += span
        return BUSY if wanted >= BUSY_SHARE * span else WAITING

    @property
    def known(self) -> bool:
        return self.read is not None

    def runq_share(self, key: str) -> float | None:
        """The counted looks' run-queue share of their wall time (None: none counted), then forget them."""
        runq, wall = self.queued.pop(key, (0.0, 0.0))
        return min(1.0, max(0.0, runq / wall)) if wall > 0 else None


def _reader(thread_id: int) -> Reader | None:
    native = next((t.native_id for t in threading.enumerate() if t.ident == thread_id), None)
    path = f"/proc/self/task/{native}/schedstat" if native is not None else None
    if path is not None and os.path.exists(path):
        def schedstat() -> tuple[float, float | None]:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fields = os.read(fd, 128).split()
            finally:
                os.close(fd)
            return int(fields[0]) * 1e-9, int(fields[1]) * 1e-9   # ns on CPU, ns runnable on a run queue
        return schedstat
    if not hasattr(time, "pthread_getcpuclockid"):
        return None
    try:
        clock = time.pthread_getcpuclockid(thread_id)
    except (OSError, OverflowError):
        return None
    return lambda: (time.clock_gettime(clock), None)


class OtherThreads:
    """The CPU clocks of the process's other Python threads (not the training thread, not perfmon's),
    read around a sample: one on CPU while the training thread waited may hold the GIL it waits for."""

    def __init__(self) -> None:
        self.readers: dict[int, tuple[str, Reader]] = {}
        self.listed_at = -THREADS_EVERY_S

    def refresh(self, train_id: int) -> None:
        """Re-list the threads at most every ``THREADS_EVERY_S`` (threads come and go)."""
        now = time.monotonic()
        if now - self.listed_at < THREADS_EVERY_S:
            return
        self.listed_at = now
        me = threading.get_ident()
        keep: dict[int, tuple[str, Reader]] = {}
        for thread in threading.enumerate():
            ident = thread.ident
            if ident is None or ident in (train_id, me) or thread.name.startswith("perfmon") or \
                    len(keep) >= MAX_THREADS:
                continue
            known = self.readers.get(ident)
            reader = known[1] if known is not None else _reader(ident)
            if reader is not None:
                keep[ident] = (thread.name, reader)
        self.readers = keep

    def cpu(self) -> dict[int, float]:
        """Each watched thread's seconds on CPU or runnable on a run queue (schedstat, where readable:
        on a loaded machine a thread that wants a core is working) now; a thread that ended is left out."""
        out = {}
        for ident, (_, read) in self.readers.items():
            try:
                cpu, runq = read()
            except (OSError, ValueError, IndexError):
                continue
            out[ident] = cpu + (runq or 0.0)
        return out

    def busiest(self, before: dict[int, float], span: float) -> tuple[int, str] | None:
        """The thread that wanted CPU the most since ``before`` (``cpu()``), if for at least ``BUSY_SHARE``
        of ``span``."""
        after = self.cpu()
        best = max(((after[i] - c, i) for i, c in before.items() if i in after), default=None)
        if best is None or span <= 0 or best[0] < BUSY_SHARE * span:
            return None
        return best[1], self.readers[best[1]][0]
