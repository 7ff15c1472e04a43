"""Stall watch: notices, off the training thread, that this rank stopped making progress, and
says where it is.

A daemon thread wakes every ``TICK_S`` and reads what the hot path already keeps: the step
count and the end of the last step (``Probe.progress()``). Nothing else happens until no step
has ended for longer than the threshold; then, every ``REPEAT_S`` while it lasts, it sends a
``stall`` record (wire 1.1) with:

* the training thread's Python stack (``sys._current_frames``; source lines are not read; the
  probe's own frames, its wrappers around collectives and the loader, left out);
* the collectives this rank issued per process group and the ones not yet returned, each with
  its per-group sequence number (``probe.comm.tracker.Ledger``), so a viewer comparing ranks
  names the one that never reached the collective the others wait in;
* the DataLoader's state: whether the training thread waits in ``next()``, the worker whose
  batch it waits for, and each worker's pid, liveness and CPU share since the last look;
* on CUDA, whether the device still has queued work (a stream ``query()``, never a sync);
* torch's flight recorders (``probe.flight``: NCCL's for NCCL groups, the generic one for gloo):
  per collective not retired, enqueued, started or completed, tagged with its backend.

When steps end again, one ``resumed`` record says how long the stall lasted.

Threshold: ``PERFMON_STALL_S`` when set; else ``MULTIPLE`` times the median recent step with a
floor of ``FLOOR_S`` once ``STEPS_KNOWN`` steps were timed, and ``WARMUP_S`` before
that (first steps compile, load and warm up). A job that merely slows down (3x longer steps)
stays far below it. A rank whose process holds the GIL in C cannot run this thread either: the
viewer sees its records stop (heartbeat) instead.
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from probe.flight import fill_from_flight, flight_recorder

TICK_S = 0.5
REPEAT_S = 2.0
MULTIPLE = 10.0
FLOOR_S = 15.0
WARMUP_S = 60.0
STEPS_KNOWN = 3
PRIME_S = 1.0        # look at the loader workers' CPU this long before a stall would be reported
MAX_FRAMES = 40
MAX_WORKERS = 64

_PROBE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LOADER_FRAMES = frozenset({("dataloader.py", "__next__"), ("core.py", "loader"), ("auto.py", "__next__")})


class StallPolicy:
    """When no progress for this long is a stall: pure, fed with (steps, end of last step)."""

    def __init__(self, fixed: float | None = None) -> None:
        self.fixed = fixed
        self.per_step: collections.deque[float] = collections.deque(maxlen=32)
        self.timed_steps = 0          # steps the samples cover (one look may span thousands of fast steps)
        self.mean_since_first: float | None = None   # (latest end - first end) / steps between them
        self._last: tuple[int, float] | None = None

    def observe(self, steps: int, last_end: float | None, first_end: float | None = None) -> None:
        """One look at the counters; each advance adds its mean time per step. ``first_end`` (the
        end of step 0) gives a mean even when all the steps so far fell between two looks."""
        if last_end is None:
            return
        if first_end is not None and steps > 1 and last_end > first_end:
            self.mean_since_first = (last_end - first_end) / (steps - 1)
        last = self._last
        if last is not None and steps > last[0] and last_end > last[1]:
            self.per_step.append((last_end - last[1]) / (steps - last[0]))
            self.timed_steps += steps - last[0]
        if last is None or steps != last[0]:
            self._last = (steps, last_end)

    def threshold(self) -> float:
        if self.fixed is not None:
            return self.fixed
        if self.timed_steps < STEPS_KNOWN:
            if self.mean_since_first is None or self._last is None or self._last[0] <= STEPS_KNOWN:
                return WARMUP_S
            return max(FLOOR_S, MULTIPLE * self.mean_since_first)
        return max(FLOOR_S, MULTIPLE * statistics.median(self.per_step))


def fixed_threshold() -> float | None:
    """``PERFMON_STALL_S`` as seconds (> 0), else None."""
    try:
        value = float(os.environ.get("PERFMON_STALL_S", ""))
    except ValueError:
        return None
    return value if value > 0 else None


class StallWatch(threading.Thread):
    """The watch thread of one probe; ``tick`` is the whole logic (tests call it directly)."""

    def __init__(self, probe: Any, emit: Callable[[dict[str, Any]], None],
                 policy: StallPolicy | None = None) -> None:
        super().__init__(name="perfmon-stall", daemon=True)
        self.probe = probe
        self.emit = emit
        self.policy = policy or StallPolicy(fixed_threshold())
        self.stop_event = threading.Event()
        self.stalled_since: float | None = None   # last progress (perf_counter) of the stall in course
        self.reports = 0
        self.last_report = float("-inf")
        self._seen: tuple[int, float | None] = (-1, None)
        self._primed = False
        self._last_stack: list[str] | None = None   # the stack at the latest look
        self._moved = False                          # it changed between two looks since the last report
        self._looks = 0
        self._worker_cpu: dict[int, tuple[float, float]] = {}   # pid -> (wall, cpu s): bounded by MAX_WORKERS

    def run(self) -> None:
        while not self.stop_event.wait(TICK_S):
            try:
                self.tick(time.perf_counter())
            except Exception as exc:   # never let the thread die; the next tick tries again
                self.probe.report_error("stall watch", exc)

    def tick(self, now: float) -> dict[str, Any] | None:
        """Look once; return the record emitted, if any."""
        steps, last, in_step, thread_id, first_end = self.probe.progress()
        self.policy.observe(steps, last, first_end)
        if (steps, last) != self._seen:
            self._seen = (steps, last)
            self._primed, self._last_stack, self._moved, self._looks = False, None, False, 0
            if self.stalled_since is not None and last is not None:
                record = {"k": "resumed", "t": time.time(), "seconds": last - self.stalled_since, "step": steps - 1}
                self.stalled_since = None
                self.emit(record)
                return record
        if last is None or thread_id is None:
            return None
        threshold = self.policy.threshold()
        if now - last < threshold - PRIME_S:
            return None
        self._look(thread_id)             # every tick from PRIME_S before the threshold: does the stack move?
        if not self._primed:
            self._primed = True           # a first look at the loader workers' CPU, so the first stall
            _add({}, "loader", lambda: self._loader(False))   # record says how busy they are since
        if now - last < threshold:
            return None
        if self.stalled_since is None:
            self.stalled_since = last
            self.reports = 0
        elif now - self.last_report < REPEAT_S:
            return None
        self.reports += 1
        self.last_report = now
        record = self.describe(now, last, threshold, steps, in_step, thread_id)
        self.emit(record)
        return record

    def _look(self, thread_id: int) -> None:
        """One sample of the training thread's stack: a hang keeps one stack, an evaluation loop or
        slow preprocessing in the main process does not (sampled every tick: one look could land on
        the same line twice)."""
        stack = _job_frames(thread_stack(thread_id))
        if self._last_stack is not None and stack != self._last_stack:
            self._moved = True
        self._last_stack = stack
        self._looks += 1

    def describe(self, now: float, last: float, threshold: float, steps: int, in_step: bool,
                 thread_id: int) -> dict[str, Any]:
        full = thread_stack(thread_id)
        in_loader = any((os.path.basename(f), fn) in _LOADER_FRAMES for f, fn in _frame_places(full))
        stack = _job_frames(full)
        record: dict[str, Any] = {
            "k": "stall", "t": time.time(), "since": time.time() - (now - last), "seconds": now - last,
            "threshold": threshold, "step": steps - 1, "n": self.reports,
            "where": "loader" if in_loader else "step" if in_step else "between", "stack": stack,
        }
        if self._looks >= 2:               # the looks since the previous report (or the threshold's approach)
            record["moving"] = self._moved or stack != self._last_stack
        self._moved, self._last_stack, self._looks = False, stack, 1
        _add(record, "inflight", self._communication)
        _add(record, "loader", lambda: self._loader(in_loader))
        _add(record, "device", self._device)
        _add(record, "flight", flight_recorder)
        if "flight" in record:
            fill_from_flight(record)
        return record

    # -- what is attached -----------------------------------------------------------------------
    def _communication(self) -> dict[str, Any] | None:
        if "torch.distributed" not in sys.modules:
            return None
        from probe.comm import collectives
        state = collectives.current()
        if state is None or state.probe is not self.probe:
            return None
        inflight, issued = state.ledger.snapshot()
        return {"inflight": inflight, "seq": issued}

    def _loader(self, waiting: bool) -> dict[str, Any] | None:
        iterators = [ref() for ref in list(self.probe.loader_iterators)]
        iterators = [it for it in iterators if it is not None and not getattr(it, "_shutdown", False)]
        if not iterators:
            return None
        it = iterators[-1]
        info: dict[str, Any] = {"waiting": waiting}
        workers = list(getattr(it, "_workers", None) or [])[:MAX_WORKERS]
        if workers:
            now = time.monotonic()
            info["workers"] = [self._worker(w, now) for w in workers]
            awaited = _awaited_worker(it)
            if awaited is not None and awaited < len(workers):
                info["awaited_pid"] = getattr(workers[awaited], "pid", None)
        return {"loader": info}

    def _worker(self, worker: Any, now: float) -> dict[str, Any]:
        import psutil
        pid: Any = getattr(worker, "pid", None)     # a torch loader worker (untyped)
        entry: dict[str, Any] = {"pid": pid, "alive": False, "cpu": None}
        try:
            proc = psutil.Process(pid)
            entry["alive"] = proc.status() != psutil.STATUS_ZOMBIE
            times = proc.cpu_times()
        except (psutil.Error, TypeError, ValueError):
            self._worker_cpu.pop(pid, None)
            return entry
        cpu = times.user + times.system
        prev = self._worker_cpu.get(pid)
        if len(self._worker_cpu) >= MAX_WORKERS and pid not in self._worker_cpu:
            self._worker_cpu.pop(next(iter(self._worker_cpu)))
        self._worker_cpu[pid] = (now, cpu)
        if prev is not None and now > prev[0]:
            entry["cpu"] = max(0.0, (cpu - prev[1]) / (now - prev[0]))
        return entry

    def _device(self) -> dict[str, Any] | None:
        if "torch" not in sys.modules or self.probe.device.get("type") != "cuda":
            return None
        from probe.gpu import cuda
        backend = cuda.backend
        if not backend.ready():
            return None
        index = self.probe.local_rank if self.probe.local_rank < backend.device_count() else 0
        return {"device": {"pending": bool(backend.pending(index))}}


def _add(record: dict[str, Any], what: str, part: Callable[[], dict[str, Any] | None]) -> None:
    """Merge one optional part; a part that fails is left out (the record still goes)."""
    try:
        sections = part()
    except Exception:
        record.setdefault("missing", []).append(what)
        return
    if sections:
        record.update(sections)


def thread_stack(thread_id: int) -> list[str]:
    """The thread's innermost ``MAX_FRAMES`` frames, innermost last, as ``file:line in function``."""
    frame = sys._current_frames().get(thread_id)
    frames: list[str] = []
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        frames.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        frame = frame.f_back
    frames.reverse()
    return frames


def _job_frames(stack: list[str]) -> list[str]:
    """The job's frames: the probe's own wrappers (around collectives, the loader) left out."""
    return [f for f in stack if not f.startswith(_PROBE_DIR)]


def _frame_places(stack: list[str]) -> list[tuple[str, str]]:
    places = []
    for entry in stack:
        where, _, function = entry.rpartition(" in ")
        places.append((where.rsplit(":", 1)[0], function))
    return places


def _awaited_worker(it: Any) -> int | None:
    """The worker whose batch a multi-process DataLoader iterator waits for: the task of the
    next index to return (``_rcvd_idx``) is ``(worker_id,)`` until its data arrives."""
    try:
        task = it._task_info.get(it._rcvd_idx)
    except Exception:
        return None
    if isinstance(task, tuple) and len(task) == 1 and isinstance(task[0], int):
        return task[0]
    return None
