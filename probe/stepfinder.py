"""Step boundaries from hook events, for zero-code mode: pure logic, times in, steps out.

``probe.auto`` feeds this the outermost training forwards, backwards, optimizer
steps and DataLoader fetches of a script that knows nothing of perfmon (all times
are ``perf_counter`` seconds); it calls ``emit(start, end, phases, samples, data_cpu)``
once per training step (``data_cpu``: CPU seconds the training thread itself spent
loading, for single-process loaders; None when unknown). The rules:

* a step starts at its first DataLoader fetch or training forward after the
  previous step ended (a backward or an optimizer step with neither before it
  starts one too), so the time between steps (checkpoints, evaluation, logging)
  stays outside every step: the loop's own work there, or pauses (ETTR's);
* its data wait is the time its batches took to fetch: the fetches since the
  previous step ended (an accumulation window fetched before its first forward
  included; an evaluation loader's fetches are not, ``fetches.before_step``) and
  those inside it;
* it ends when its optimizer step returns. Several backwards before one
  optimizer step (gradient accumulation) are therefore one step, and optimizers
  stepped back to back (e.g. Muon for matrices + AdamW for the rest) are one step
  too: an optimizer step ends a step at once only after that optimizer has been
  seen to be followed by the next step's work; until then the end is settled by
  the next fetch, forward or backward (or ``flush`` at exit);
* in a process that never built an optimizer (manual SGD updates) a step ends
  when its backward returns;
* an optimizer step inside a compiled region runs no hooks; the caller sees that
  the parameters changed (``optimizer_unseen``) at its next event, and the step
  ends there (its optimizer time lands in that step's unattributed time).
"""

from __future__ import annotations

from typing import Callable

from probe.fetches import Waits, before_step

EmitFn = Callable[[float, float, "dict[str, float]", "int | None", "float | None"], None]


class StepFinder:
    """State machine of one process's training loop; not thread-safe (the training thread feeds it)."""

    def __init__(self, emit: EmitFn, on_open: Callable[[], None] | None = None) -> None:
        self.emit = emit
        self.on_open = on_open
        self.optimizers = 0                      # optimizers built in this process; 0 = backward mode
        self.closers: set[int] = set()           # optimizers seen to be followed by the next step's work
        self.trained = False                     # a step end was seen (optimizer step, or backward without one)
        self.steps = 0
        self.is_open = False
        self.start = 0.0
        self.phases: dict[str, float] = {}
        self.samples = 0
        self.data_cpu: float | None = None
        self.prev_end: float | None = None
        self.start_cpu: float | None = None      # the fetching thread's CPU clock at the open step's first fetch
        self.opened_by: int | None = None        # the iterator whose fetch opened the last step (None: a forward)
        self._waiting: Waits | None = None       # fetches while closed: the next step's batches
        self._pending: tuple[float, int] | None = None          # (end, optimizer) of a step not yet settled
        self._fwd_t0: float | None = None
        self._bwd_t0: float | None = None
        self._opt_t0: float | None = None

    # -- events (outermost calls only; the caller filters nesting) --------------------------
    def fetch(self, t0: float, t1: float, samples: int = 0, cpu: float | None = None, source: int | None = None,
              cpu0: float | None = None) -> None:
        """A batch fetch took t0..t1 from iterator ``source``; ``cpu``: this thread's CPU seconds in it
        (single-process loader), ``cpu0``: its CPU clock at t0 (None: not read)."""
        self._settle()
        if self.is_open:
            ph = self.phases
            ph["data"] = ph.get("data", 0.0) + (t1 - t0)
            self.samples += samples
            if cpu is not None:
                self.data_cpu = (self.data_cpu or 0.0) + cpu
        else:
            self._waiting = before_step(self._waiting, source, t0, cpu0)
            self._waiting.add(t1 - t0, samples, cpu)

    def forward_begin(self, t: float) -> None:
        self._settle()
        if not self.is_open:
            self._open(t)
        self._fwd_t0 = t

    def forward_end(self, t: float) -> None:
        if self._fwd_t0 is not None:
            ph = self.phases
            ph["forward"] = ph.get("forward", 0.0) + (t - self._fwd_t0)
            self._fwd_t0 = None

    def backward_begin(self, t: float) -> None:
        self._settle()
        if not self.is_open:
            # no fetch and no module forward seen (raw-tensor script): the forward math ran since the last step
            self._open(t if self.prev_end is None else self.prev_end)
        self._bwd_t0 = t

    def backward_end(self, t: float) -> None:
        if self._bwd_t0 is None:
            return
        ph = self.phases
        ph["backward"] = ph.get("backward", 0.0) + (t - self._bwd_t0)
        self._bwd_t0 = None
        if self.optimizers == 0 and self.is_open:
            self.trained = True
            self._close(t)

    def optimizer_begin(self, t: float) -> None:
        if not self.is_open:
            self._open(t)
        self._opt_t0 = t

    def optimizer_end(self, t: float, optimizer: int) -> None:
        if self._opt_t0 is None:
            return
        ph = self.phases
        ph["optimizer"] = ph.get("optimizer", 0.0) + (t - self._opt_t0)
        self._opt_t0 = None
        self.trained = True
        if optimizer in self.closers:
            self._close(t)
        else:
            self._pending = (t, optimizer)

    def optimizer_unseen(self, t: float) -> None:
        """The parameters were updated by an optimizer step no hook saw; ``t`` is when that was noticed."""
        self._settle()
        if self.is_open:
            self.trained = True
            self._close(t)

    def flush(self) -> None:
        """Settle a step whose end is still pending (at exit)."""
        self._settle()

    def opening(self) -> bool:
        """Has a fetch from the training loader (the iterator that opened the last step) come since the
        last step ended? The next step then runs from that fetch: the time after it is the step's, not
        the loop's between steps. Read from another thread (probe.where): a stale answer costs one sample."""
        waiting = self._waiting
        return not self.is_open and waiting is not None and waiting.source == self.opened_by

    # -- internals ----------------------------------------------------------------------------
    def _open(self, t: float) -> None:
        waits, self._waiting = self._waiting, None
        self.start_cpu = None
        self.opened_by = waits.source if waits is not None else None
        if waits is not None:
            t, self.start_cpu = waits.start, waits.cpu0
            if waits.seconds > 0:
                self.phases["data"] = self.phases.get("data", 0.0) + waits.seconds
            self.samples += waits.samples
            if waits.cpu is not None:
                self.data_cpu = (self.data_cpu or 0.0) + waits.cpu
        self.is_open = True
        self.start = t
        if self.on_open is not None:
            self.on_open()

    def _settle(self) -> None:
        pending = self._pending
        if pending is not None:
            self._pending = None
            self.closers.add(pending[1])
            self._close(pending[0])

    def _close(self, end: float) -> None:
        phases = self.phases
        samples = self.samples
        data_cpu = self.data_cpu
        self.phases = {}
        self.samples = 0
        self.data_cpu = None
        self.is_open = False
        self.prev_end = end
        self.steps += 1
        self._pending = None
        self._fwd_t0 = self._bwd_t0 = self._opt_t0 = None
        self.emit(self.start, end, phases, samples or None, data_cpu)
