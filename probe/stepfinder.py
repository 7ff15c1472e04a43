"""Step boundaries from hook events, for zero-code mode: pure logic, times in, steps out.

``probe.auto`` feeds this the outermost training forwards, backwards, optimizer
steps and DataLoader fetches of a script that knows nothing of perfmon (all times
are ``perf_counter`` seconds); it calls ``emit(start, end, phases, samples, data_cpu)``
once per training step (``data_cpu``: CPU seconds the training thread itself spent
loading, for single-process loaders; None when unknown). The rules
(docs/zero-code.md):

* a step starts at its first DataLoader fetch or training forward after the
  previous step ended (a backward or an optimizer step with neither before it
  starts one too), so the time between steps (checkpoints, evaluation, logging)
  stays outside every step: the loop's own work there, or pauses (ETTR's);
* its data wait is the time its batches took to fetch: the fetches since the
  previous step ended (an accumulation window fetched before its first forward
  included; an evaluation loader's fetches are not, ``fetches.before_step``) and
  those inside it;
* a *segment* ends when its optimizer step returns. Several backwards before one
  optimizer step (gradient accumulation) are one segment, and optimizers stepped
  back to back (e.g. Muon for matrices + AdamW for the rest) are one segment too:
  an optimizer step ends a segment at once only after that optimizer has been
  seen to be followed by the next segment's work; until then the end is settled
  by the next fetch, forward or backward (or ``flush`` at exit);
* a step is one *iteration*: segments with forward/backward work between their
  optimizer steps (a GAN's discriminator then generator step, a WGAN's critic steps
  then its generator step, one optimizer per task) are one step, ended by the
  segment of the optimizer that steps least often (of equals, the one that first
  stepped last: the loop body's last). While an optimizer built in the process has
  not stepped yet, the first ``WAIT_SEGMENTS`` segments wait for it. Each segment's
  time (its data wait apart) is then a phase named after its optimizer (``labels``);
* in a process that never built an optimizer (manual SGD updates) a step ends
  when its backward returns;
* an optimizer step inside a compiled region runs no hooks; the caller sees that
  the parameters changed (``optimizer_unseen``) at its next event, and the step
  ends there (its optimizer time lands in that step's unattributed time);
* *eval-shaped work*: training forwards (train mode, grad enabled) that no backward
  follows, e.g. an evaluation pass run without ``no_grad()``/``model.eval()``. The
  forwards before a step's first backward are counted; where there are at least
  ``2 * usual + 2`` of them (``usual``: the fewest seen before a first backward in
  earlier steps), all but the usual last ones are evaluation: the step starts after
  them (at the fetch of the training batch, else its first forward) and
  ``on_eval(start, end, forwards, cpu0)`` reports the cut-off time, which stays
  between steps. A trailing evaluation still open at ``flush`` is reported too.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import NamedTuple

from probe.fetches import Waits, before_step

EmitFn = Callable[[float, float, "dict[str, float]", "int | None", "float | None"], None]
EvalFn = Callable[[float, float, int, "float | None"], None]
WAIT_SEGMENTS = 8         # segments the first step waits for a built optimizer that has not stepped (WGAN: 5 critic)
PRE_EVENTS = 256          # fetches and forwards kept before a step's first backward (an eval pass's tail)


class _Pre(NamedTuple):
    """A fetch (``fwd`` False) or a forward before the step's first backward."""

    t0: float
    seconds: float
    fwd: bool
    samples: int = 0
    cpu: float | None = None
    cpu0: float | None = None


class StepFinder:
    """State machine of one process's training loop; not thread-safe (the training thread feeds it)."""

    def __init__(self, emit: EmitFn, on_open: Callable[[], None] | None = None,
                 on_eval: EvalFn | None = None) -> None:
        self.emit = emit
        self.on_open = on_open
        self.on_eval = on_eval
        self.optimizers = 0                      # optimizers built in this process; 0 = backward mode
        self.inner: set[int] = set()             # optimizers seen stepping inside another (ZeRO's): not the loop's
        self.closers: set[int] = set()           # optimizers seen to be followed by the next segment's work
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
        self.labels: dict[int, str] = {}         # optimizer -> the phase name of its part of a step
        self.last_parts = 0                      # segments in the last emitted step
        self._waiting: Waits | None = None       # fetches while closed: the next step's batches
        self._pending: tuple[float, int] | None = None          # (end, optimizer) of a segment not yet settled
        self._fwd_t0: float | None = None
        self._bwd_t0: float | None = None
        self._opt_t0: float | None = None
        # iterations: optimizer -> segments it stepped in, and the order of its first step
        self._counts: dict[int, int] = {}
        self._order: dict[int, int] = {}
        self._segments = 0
        self._seg_opts: list[int] = []
        self._seg_start = 0.0
        self._seg_data = 0.0
        self._parts: list[tuple[int, float]] = []   # (optimizer, seconds) of the open step's finished segments
        # eval-shaped work: the open step's fetches and forwards before its first backward
        self._pre: collections.deque[_Pre] = collections.deque(maxlen=PRE_EVENTS)
        self._pre_fwds = 0
        self._backward_in = False
        self.usual: int | None = None            # fewest forwards before a step's first backward so far

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
            if self._watching():
                self._pre.append(_Pre(t0, t1 - t0, False, samples, cpu, cpu0))
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
            if self._watching():
                self._pre.append(_Pre(self._fwd_t0, t - self._fwd_t0, True))
                self._pre_fwds += 1
            self._fwd_t0 = None

    def backward_begin(self, t: float) -> None:
        self._settle()
        if not self.is_open:
            # no fetch and no module forward seen (raw-tensor script): the forward math ran since the last step
            self._open(t if self.prev_end is None else self.prev_end)
        elif self._watching():
            self._first_backward()
        self._backward_in = True
        self._bwd_t0 = t

    def backward_end(self, t: float) -> None:
        if self._bwd_t0 is None:
            return
        ph = self.phases
        ph["backward"] = ph.get("backward", 0.0) + (t - self._bwd_t0)
        self._bwd_t0 = None
        if self.optimizers == 0 and self.is_open:
            self.trained = True
            self._segment_end(t)

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
        self._seg_opts.append(optimizer)
        if optimizer in self.closers:
            self._segment_end(t)
        else:
            self._pending = (t, optimizer)

    def optimizer_unseen(self, t: float) -> None:
        """The parameters were updated by an optimizer step no hook saw; ``t`` is when that was noticed."""
        self._settle()
        if self.is_open:
            self.trained = True
            self._segment_end(t)

    def flush(self) -> None:
        """Settle a step whose end is still pending, and report an evaluation still open (at exit)."""
        self._settle()
        if self._watching() and self._eval_shaped(self._pre_fwds) and self.on_eval is not None:
            last = self._pre[-1]
            self.on_eval(self.start, last.t0 + last.seconds, self._pre_fwds, None)
            self._pre_fwds = 0

    def opening(self) -> bool:
        """Has a fetch from the training loader (the iterator that opened the last step) come since the
        last step ended? The next step then runs from that fetch: the time after it is the step's, not
        the loop's between steps. Read from another thread (probe.where): a stale answer costs one sample."""
        waiting = self._waiting
        return not self.is_open and waiting is not None and waiting.source == self.opened_by

    # -- internals ----------------------------------------------------------------------------
    def _watching(self) -> bool:
        """Before the open step's first backward, with no segment of it finished: where evaluation shows."""
        return self.is_open and not self._backward_in and not self._parts

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
            self._pre.append(_Pre(waits.start, waits.seconds, False, waits.samples, waits.cpu, waits.cpu0))
        self.is_open = True
        self.start = self._seg_start = t
        self._seg_data = 0.0
        if self.on_open is not None:
            self.on_open()

    def _eval_shaped(self, forwards: int) -> bool:
        """Are ``forwards`` before a first backward more than training does (``usual``, learned)?"""
        return self.usual is not None and forwards >= 2 * self.usual + 2

    def _first_backward(self) -> None:
        """The open step's first backward: cut off the evaluation before it, if any; learn ``usual``."""
        fwds = train = self._pre_fwds
        pre = [p for p in self._pre if p.fwd]
        if self.usual is not None and self._eval_shaped(fwds) and len(pre) > self.usual:
            train = self.usual
            last_eval = pre[-train - 1]
            eval_end = last_eval.t0 + last_eval.seconds
            after = [p for p in self._pre if p.t0 >= eval_end]
            self._cut(after[0].t0 if after else eval_end, after, fwds - train)
        self.usual = train if self.usual is None else min(self.usual, train)
        self._pre.clear()
        self._pre_fwds = 0

    def _cut(self, cut: float, after: list[_Pre], forwards: int) -> None:
        """The step starts at ``cut``: what came before it was evaluation."""
        start, self.start, self._seg_start = self.start, cut, cut
        fetched = [p for p in after if not p.fwd]
        ph = self.phases
        ph.pop("data", None)
        ph.pop("forward", None)
        if fetched:
            ph["data"] = sum(p.seconds for p in fetched)
        if any(p.fwd for p in after):
            ph["forward"] = sum(p.seconds for p in after if p.fwd)
        self.samples = sum(p.samples for p in fetched)
        cpus = [p.cpu for p in fetched if p.cpu is not None]
        self.data_cpu = sum(cpus) if cpus else None
        cpu0 = after[0].cpu0 if after and not after[0].fwd else None
        self.start_cpu = cpu0
        if self.on_eval is not None:
            self.on_eval(start, cut, forwards, cpu0)

    def _settle(self) -> None:
        pending = self._pending
        if pending is not None:
            self._pending = None
            self.closers.add(pending[1])
            self._segment_end(pending[0])

    def _segment_end(self, end: float) -> None:
        opts, self._seg_opts = self._seg_opts, []
        self._pending = None
        self._fwd_t0 = self._bwd_t0 = self._opt_t0 = None
        self._segments += 1
        for o in dict.fromkeys(opts):
            self._counts[o] = self._counts.get(o, 0) + 1
            self._order.setdefault(o, len(self._order))
        data = self.phases.get("data", 0.0)
        self._parts.append((opts[-1] if opts else -1, max(0.0, end - self._seg_start - (data - self._seg_data))))
        if self._ends_iteration(opts):
            self._close(end)
        else:
            self._seg_start, self._seg_data = end, data

    def _ends_iteration(self, opts: list[int]) -> bool:
        """Does the segment that stepped ``opts`` end the step (see the module's rules)?"""
        counts = self._counts
        if not opts or len(counts) <= 1 and self.optimizers - len(self.inner) <= 1:
            return True
        if self.optimizers - len(self.inner) > len(counts) and self._segments < WAIT_SEGMENTS:
            return False
        order = self._order
        closer = min(counts, key=lambda o: (counts[o], -order[o]))
        return closer in opts

    def _close(self, end: float) -> None:
        phases = self.phases
        parts, self._parts = self._parts, []
        if len(parts) > 1:
            phases = {"data": phases["data"]} if "data" in phases else {}
            for optimizer, seconds in parts:
                name = self.labels.get(optimizer) or f"optimizer {self._order.get(optimizer, 0) + 1}"
                phases[name] = phases.get(name, 0.0) + seconds
        self.last_parts = len(parts)
        samples = self.samples
        data_cpu = self.data_cpu
        self.phases = {}
        self.samples = 0
        self.data_cpu = None
        self.is_open = False
        self._backward_in = False
        self._pre.clear()
        self._pre_fwds = 0
        self.prev_end = end
        self.steps += 1
        self.emit(self.start, end, phases, samples or None, data_cpu)
