"""The batch-fetch clock: data wait, the time the training loop was blocked waiting for its next
batch, timed in one place for zero-code mode (``probe.auto``) and the trainer callbacks
(``probe.integrations.steps``), so that both mean the same by it (``Probe.loader`` times the
iterable the script gives it the same way).

One wrapper on the DataLoader iterator's ``__next__`` (``_BaseDataLoaderIter``, every
``DataLoader``'s, Lightning's and Hugging Face's included) is put in place by the first
listener and times each fetch on the thread that asked for it. When that thread does the
loading itself (``num_workers=0``) its CPU clock is read around the fetch too, as
``probe.loader_policy`` says, which tells preprocessing from I/O. Listeners are called as
``listener(iterator, batch, t0, t1, cpu0, cpu1)`` (``perf_counter`` and ``thread_time``
readings; the CPU ones None when not read) and decide for themselves which thread's waits
count. With no listener the wrapper only calls through; nothing here raises into the loop.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from probe import forks
from probe.loader_policy import CpuTimingPolicy
from probe.tracing import compiling_check, run_eagerly

Listener = Callable[[Any, Any, float, float, "float | None", "float | None"], None]

_pc = time.perf_counter
_tt = time.thread_time
_listeners: tuple[Listener, ...] = ()
_cpu_timing = CpuTimingPolicy()
_installed = False
_is_compiling = compiling_check()


class Waits:
    """Fetches summed: the wait (``seconds``), the fetching thread's CPU seconds in it (``cpu``,
    None when never read), ``samples``; ``start``/``cpu0``: the first fetch's ``perf_counter``
    and CPU clock (None: not read); ``source``: the iterator they came from."""

    __slots__ = ("source", "start", "cpu0", "seconds", "cpu", "samples")

    def __init__(self, source: int | None, start: float, cpu0: float | None = None) -> None:
        self.source = source
        self.start = start
        self.cpu0 = cpu0
        self.seconds = 0.0
        self.cpu: float | None = None
        self.samples = 0

    def add(self, seconds: float, samples: int = 0, cpu: float | None = None) -> None:
        self.seconds += seconds
        self.samples += samples
        if cpu is not None:
            self.cpu = (self.cpu or 0.0) + cpu


def before_step(waits: Waits | None, source: int | None, t0: float, cpu0: float | None = None) -> Waits:
    """The waits a fetch made between two steps adds to: the next step's batches are the fetches
    since the previous step ended (a trainer fetches a whole accumulation window before its first
    forward), unless they come from another iterator than the fetch before: an evaluation loader's
    batches fed the evaluation, not the step, so the count starts again."""
    if waits is not None and waits.source == source:
        return waits
    return Waits(source, t0, cpu0)


def listen(listener: Listener) -> None:
    """Have ``listener`` called after every DataLoader fetch in this process (installs the clock)."""
    global _listeners
    _install()
    if listener not in _listeners:
        _listeners = _listeners + (listener,)


def unlisten(listener: Listener) -> None:
    global _listeners
    _listeners = tuple(x for x in _listeners if x != listener)


def _wrap_next(orig: Any) -> Any:
    @functools.wraps(orig)
    def __next__(self: Any) -> Any:
        listeners = _listeners
        if not listeners or _is_compiling():
            return orig(self)
        single = _cpu_timing.left > 0 and getattr(self, "_num_workers", 1) == 0   # this thread loads
        t0 = _pc()                          # the wall clock brackets the CPU clock: CPU in a wait never exceeds it
        c0 = _tt() if single else None
        batch = orig(self)
        c1 = _tt() if single else None
        t1 = _pc()
        _cpu_timing.fetched(t1 - t0, single)
        for listener in listeners:
            try:
                listener(self, batch, t0, t1, c0, c1)
            except Exception:       # a listener keeps its own failures; the batch still goes to the loop
                pass
        return batch
    return __next__


def _install() -> None:
    """Wrap the DataLoader iterator's ``__next__`` once per process."""
    global _installed, _is_compiling
    if _installed:
        return
    import torch.utils.data.dataloader as dataloader

    _is_compiling = compiling_check()
    cls = dataloader._BaseDataLoaderIter
    cls.__next__ = _wrap_next(cls.__next__)  # type: ignore[method-assign]  # the hook is the patch
    run_eagerly(cls.__next__, recursive=False)   # never a compiled frame; what it calls is the user's
    _installed = True
    forks.after_in_child(_forget)


def uninstall() -> None:
    """Put the iterator's own ``__next__`` back (``perfmon detach``); listeners are dropped."""
    global _installed, _listeners
    _listeners = ()
    if not _installed:
        return
    import torch.utils.data.dataloader as dataloader

    cls = dataloader._BaseDataLoaderIter
    wrapped = getattr(cls.__next__, "__wrapped__", None)
    if wrapped is not None and cls.__next__.__code__ is _wrap_next(None).__code__:
        cls.__next__ = wrapped  # type: ignore[method-assign]  # the patch undone
        _installed = False


def _forget() -> None:
    """A forked child (a DataLoader worker) is not the training loop: its fetches are nobody's wait."""
    global _listeners
    _listeners = ()
