"""The probe's own cost, measured while it runs: the ``cost`` section of each ``sample`` record.

A monitor left inside a large job has to show what it costs on that job, not on a benchmark
machine. Four parts, each a running total so a viewer takes any two samples' difference:

* ``train``: seconds the training thread spent inside the probe's step calls (``step()``'s
  enter and exit, the zero-code ``begin_step``/``add_step``), the step hooks included and also
  listed by hook name. Counted from clock reads those calls make anyway plus one at each exit,
  so the count costs about 0.2 µs a step. What those clock reads cannot see, the code around
  them, is ``wrappers``: for ``step()`` its call and ``with`` protocol outside the reads, for
  ``loader()`` (per batch) and ``phase()`` (per use) all of it. Each is its calls, counted, times
  its cost per call, calibrated once at start-up (``calibrate``), so the hot path pays an
  increment a batch or a phase and no clock read. Not in either: the zero-code module hooks that
  find the step boundaries, and the training thread's waits for the GIL while a probe thread
  holds it (that time is in the thread's CPU, below).
* ``threads``: CPU seconds of each of the probe's threads (named ``perfmon-*``), read from the
  kernel's per-thread CPU clock (Linux: the thread's id names its clock; elsewhere unknown). A
  thread that has exited keeps the total of its last reading: CPU it used after that is lost.
* ``memory``: what the probe holds: items in the hot-path queue, bytes queued for viewers and
  kept for the backfill.
* ``io``: bytes sent to viewers and written to the recording.

Read on the sampler thread, once a sample (~30 µs, counted in the sampler thread's CPU).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

THREAD_PREFIX = "perfmon-"
MAX_THREADS = 64         # thread totals kept by name; a probe has about ten kinds of thread
WRAPPERS = ("step", "loader", "phase")
CALIBRATION_CALLS = 400  # calls of each wrapper a calibration round times ...
CALIBRATION_ROUNDS = 5   # ... and rounds, the fastest kept: ~5 ms at start-up


def calibrate(scratch: Callable[[], Any]) -> dict[str, float]:
    """Seconds per call of the probe's wrappers outside the clock reads that count them live, on
    this machine and interpreter: ``step`` (``with probe.step(): pass`` less the seconds its own
    reads counted), ``loader`` (a batch through ``loader()``) and ``phase`` (``with
    probe.phase(name): pass``), each less an empty loop of as many turns. ``scratch()`` is a probe
    with hot-path state only (nothing is sent). Each loop's fastest round is kept, the empty
    loop's too: a round the machine preempted, or spent waiting for the GIL, only runs slower,
    and those waits are not the wrappers' own cost."""
    pc = time.perf_counter
    best = dict.fromkeys(("empty", *WRAPPERS), math.inf)
    turns = range(CALIBRATION_CALLS)
    for _ in range(CALIBRATION_ROUNDS):
        p = scratch()
        t0 = pc()
        for _ in turns:
            pass
        empty = pc() - t0
        t0 = pc()
        for _ in turns:
            with p.step():
                pass
        step = pc() - t0 - p._own_s
        t0 = pc()
        for _ in p.loader(turns):
            pass
        loader = pc() - t0
        t0 = pc()
        for _ in turns:
            with p.phase("calibration"):
                pass
        phase = pc() - t0
        for name, spent in (("empty", empty), ("step", step), ("loader", loader), ("phase", phase)):
            best[name] = min(best[name], spent)
    return {name: max(0.0, (best[name] - best["empty"]) / CALIBRATION_CALLS) for name in WRAPPERS}


def thread_clock(native_id: int) -> int | None:
    """The CPU clock id of this process's thread ``native_id`` (Linux's per-thread CPU clock,
    ``MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)``); None where there is none. Reading it for a
    thread that has exited fails with an error instead of touching freed memory, unlike a
    ``pthread_getcpuclockid`` of a finished thread."""
    if not sys.platform.startswith("linux") or not hasattr(time, "clock_gettime"):
        return None
    return ((~native_id) << 3) | 6


def thread_cpu(native_id: int) -> float | None:
    """CPU seconds the thread has used, None when it cannot be read (exited, not Linux)."""
    clock = thread_clock(native_id)
    if clock is None:
        return None
    try:
        return time.clock_gettime(clock)
    except (OSError, OverflowError):
        return None


class ThreadTotals:
    """Running CPU totals of the probe's threads by name (``perfmon-sender`` -> ``sender``); a
    thread's last reading stays in its name's total after it exits (windows, FLOP counters)."""

    def __init__(self) -> None:
        self.done: dict[str, float] = {}                   # name -> CPU s of its exited threads
        self.live: dict[int, tuple[str, float]] = {}       # native id -> (name, last reading)

    def read(self) -> dict[str, float] | None:
        """Name -> CPU seconds so far; None where no thread's clock can be read (unknown)."""
        seen: dict[int, tuple[str, float]] = {}
        for thread in threading.enumerate():
            if not thread.name.startswith(THREAD_PREFIX) or thread.native_id is None:
                continue
            cpu = thread_cpu(thread.native_id)
            if cpu is not None:
                seen[thread.native_id] = (thread.name[len(THREAD_PREFIX):], cpu)
        for native_id, (name, cpu) in self.live.items():
            if native_id not in seen and (name in self.done or len(self.done) < MAX_THREADS):
                self.done[name] = self.done.get(name, 0.0) + cpu
        self.live = seen
        if not seen and not self.done:
            return None
        out = dict(self.done)
        for name, cpu in seen.values():
            out[name] = out.get(name, 0.0) + cpu
        return out


class CostSource:
    """Sampler source: ``{"cost": {...}}`` (wire 1.4 ``sample`` key, see probe/wire.py)."""

    name = "cost"

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.threads = ThreadTotals()
        self.why_threads = None if thread_clock(0) is not None else "no per-thread CPU clock on this platform"

    def read(self) -> dict[str, Any]:
        p = self.probe
        threads = self.threads.read() if self.why_threads is None else None
        cost: dict[str, Any] = {
            "train_s": p._own_s, "train_steps": p._own_steps, "hooks": dict(p._hook_s),
            "threads": threads, "process_cpu": time.process_time(),
            "queue_items": len(p._q),
        }
        why: dict[str, str] = {}
        if threads is None:
            why["threads"] = self.why_threads or "no perfmon thread's CPU clock could be read"
        per_call = p._wrapper_cost
        if per_call is None:
            why["wrappers"] = p._wrapper_cost_why or "not calibrated"
        else:
            calls = {"step": max(0, p._own_steps - p._auto_steps), "loader": p._batches,
                     "phase": sum(ctx.uses for ctx in list(p._phase_ctx.values()))}
            cost["wrappers"] = {name: [calls[name], per_call[name]] for name in WRAPPERS}
        sender = p.sender
        if sender is not None:
            cost["viewer_bytes"] = sum(v.out_bytes for v in list(sender.viewers.values()))
            cost["backfill_bytes"] = sum(len(chunk) for chunk, _ in list(sender.backfill_steps)) + \
                sum(len(frame) for frame in list(sender.backfill_events))
            cost["sent_bytes"] = sender.bytes_sent
            recorder = sender.recorder
            if recorder is not None:
                cost["recorded_bytes"] = recorder.bytes_written
        if p.record_path is None:
            why["recorded_bytes"] = "not recording"
        cost["why"] = why
        return {"cost": cost}


def hook_name(hook: Callable[..., Any]) -> str:
    """A step hook's name in the probe's cost: its module and qualified name (``probe.watch.Watcher.begin``)."""
    func = getattr(hook, "__func__", hook)
    module = getattr(func, "__module__", None) or ""
    name = getattr(func, "__qualname__", None) or type(hook).__qualname__
    return f"{module}.{name}" if module else name
