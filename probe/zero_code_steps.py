"""The steps zero-code mode and the trainer callbacks find: hooks say where a step begins and
ends (``probe.auto``, ``probe.integrations``), and these methods of the probe queue it as the hot
path does for ``step()`` (a ``records.StepItem``). A mixin of ``probe.core.Probe``, whose state it
shares; kept apart because the API's own ``step()`` never goes through it."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from probe import records
from probe.host import other_threads_cpu
from probe.records import ITEM_STEP

# zero-code: a step settled later than this after its end (a pending optimizer step) has no CPU
# time: the clock ran on past the end (by at most 2% of the step when it is sent)
LATE_END_S = 0.002
LATE_SHARE = 0.02


class ZeroCodeSteps:
    """``begin_step``/``add_step`` of ``probe.core.Probe``; the attributes below are the probe's."""

    _q: collections.deque
    _step_no: int
    _prev_end: float | None
    _first_end: float | None
    _cpu0: float | None
    _proc0: float
    _in_step: bool
    _began: float | None
    _train_thread: int | None
    _phases: dict[str, float]
    _data: float
    _data_cpu: float | None
    _begin_hooks: list[Callable[..., Any]]
    _end_hooks: list[Callable[..., Any]]
    _own_s: float
    _own_steps: int
    _auto_steps: int

    report_error: Callable[[str, BaseException], None]
    _run_hooks: Callable[..., None]

    def begin_step(self, cpu0: float | None = None) -> None:
        """Zero-code mode (``probe.auto``): hooks found a step beginning; run the step-begin hooks.

        ``cpu0`` is ``time.thread_time()`` at the step's start when the caller read it there (the
        start lies before this call when the step opened with a batch fetch); else it is read now."""
        t = time.perf_counter()
        self._cpu0 = cpu0 if cpu0 is not None else time.thread_time()
        self._proc0 = time.process_time()
        self._in_step = True
        if self._began is None:
            self._began = time.perf_counter()
            self._train_thread = threading.get_ident()
        if self._begin_hooks:
            self._run_hooks(self._begin_hooks)
        self._own_s += time.perf_counter() - t

    def restart_step_clock(self, cpu0: float | None = None) -> None:
        """Zero-code mode: the step in course now starts later (evaluation cut off its start): its CPU
        clocks count from ``cpu0`` (the thread's CPU clock at the new start; else from now)."""
        now = time.thread_time()
        self._cpu0 = cpu0 if cpu0 is not None else now
        self._proc0 = time.process_time() - (now - self._cpu0)

    def add_step(self, start: float, end: float, phases: dict[str, float] | None = None,
                 samples: float | None = None, data_cpu: float | None = None, tokens: float | None = None,
                 gap_cpu: float | None = None) -> None:
        """Queue a step whose boundaries hooks found (``perf_counter`` seconds; zero-code mode).

        Unlike ``step()`` the step's own start is explicit: the time since the previous
        step's end becomes the record's ``gap`` (checkpoints, evaluation: lost time in
        ETTR). ``phases`` (``data`` included) add to those timed with ``phase()``;
        ``data_cpu`` is the training thread's CPU time inside the loader waits; ``tokens`` the
        step's tokens where a trainer counts them; ``gap_cpu`` its CPU time between the previous step's
        end and this one's start (the record's ``gap_cpu``: the loop's work there, busy or waiting).
        """
        t = time.perf_counter()
        if tokens is not None and type(tokens) is not int and type(tokens) is not float:
            tokens = records.host_number(tokens, self.report_error)
        cpu = None
        others = None
        if self._cpu0 is not None and time.perf_counter() - end <= max(LATE_END_S, LATE_SHARE * (end - start)):
            cpu = max(0.0, time.thread_time() - self._cpu0)
            others = other_threads_cpu(self._proc0, cpu)
        self._cpu0 = None
        extras: dict[str, Any] | None = others
        if gap_cpu is not None:
            extras = extras or {}
            extras["gap_cpu"] = gap_cpu
        if self._end_hooks:
            extras = extras or {}
            self._run_hooks(self._end_hooks, extras, self._phases)
        merged = self._phases
        self._phases = {}
        for name, seconds in (phases or {}).items():
            merged[name] = merged.get(name, 0.0) + seconds
        data = merged.pop("data", 0.0) + self._data
        self._data = 0.0
        if data_cpu is not None or self._data_cpu is not None:
            data_cpu = (data_cpu or 0.0) + (self._data_cpu or 0.0)
        self._data_cpu = None
        prev = self._prev_end if self._prev_end is not None and self._prev_end <= start else start
        self._q.append((ITEM_STEP, self._step_no, prev, end, data, merged, samples, tokens, None, extras, start - prev,
                        data_cpu, cpu, records.CPU_SPAN_ACTIVE))      # a records.StepItem
        self._step_no += 1
        self._prev_end = end
        self._in_step = False
        if self._train_thread is None:
            self._train_thread = threading.get_ident()
        if self._first_end is None:
            self._first_end = end
        self._own_s += time.perf_counter() - t
        self._own_steps += 1
        self._auto_steps += 1
