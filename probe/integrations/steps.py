"""Steps as a trainer counts them, whatever the framework: the callbacks' shared core.

A step is one optimizer step of the trainer (its ``global_step``), from its first batch fetch
(the first micro-batch of a gradient-accumulation window) to the optimizer step that ends it.
Its data wait is what it is everywhere in perfmon: the time the training thread was blocked
fetching the step's batches, timed by the same batch-fetch clock as zero-code mode
(``probe.fetches``), with the thread's CPU in it on a single-process loader, so a slow collate
reads as preprocessing. The rest of the time since the previous step's end (the trainer's
logging callbacks, evaluation, checkpoints) is the step's gap: time between steps, ETTR's lost
time, never data wait. Forward, backward and optimizer phases come from ``watch(model,
optimizer)``. Under ``perfmon run`` zero-code mode already finds the same steps: the callback
then only brings the numbers to the trainer's logs.
"""

from __future__ import annotations

import time
from threading import get_ident
from typing import Any

import probe as probe_api
from probe import fetches
from probe.fetches import Waits, before_step
from probe.integrations.live import LiveNumbers


class TrainerSteps:
    def __init__(self, job: str | None = None) -> None:
        self.job = job
        self.probe: Any = None
        self.live: LiveNumbers | None = None
        self.thread: int | None = None         # the training thread: fetches on others are no wait of its
        self.fetch_seen = False                # a DataLoader fetch was timed: data wait is measured, else unknown
        self.waiting: Waits | None = None      # fetches since the previous step's end: the next step's batches
        self.open: Waits | None = None         # the open step's fetches; its start is the first one's
        self.samples = 0.0
        self.tokens_seen: float | None = None
        self.counted_step: int | None = None   # the trainer's global_step at our last step end
        self.marking = True                    # False under perfmon run: zero-code mode marks the steps

    def attach(self, model: Any, optimizers: Any, global_step: int) -> None:
        """Training starts: the probe and its watch, the batch-fetch clock, the live numbers. Under
        ``perfmon run`` the zero-code mode starts the probe at the first step and marks the steps itself."""
        from probe import auto

        self.counted_step = global_step
        if auto.active():
            self.marking = False
            return
        self.probe = probe_api.current() or probe_api.start(self.job)
        self.probe.watch(model=model, optimizer=optimizers)
        self.listen()
        self._read_numbers()

    def listen(self) -> None:
        """Time this thread's DataLoader fetches (``probe.fetches``) from now on."""
        self.thread = get_ident()
        fetches.listen(self.fetched)

    def detach(self) -> None:
        """Training ended: this trainer's fetches are no longer timed."""
        fetches.unlisten(self.fetched)

    def _read_numbers(self) -> None:
        if self.live is None and self.probe is not None:
            try:
                self.live = LiveNumbers(self.probe)
            except Exception as exc:       # the numbers are a bonus; the steps are not
                self.probe.report_error("live numbers", exc)

    def fetched(self, it: Any, batch: Any, t0: float, t1: float, c0: float | None, c1: float | None) -> None:
        """A DataLoader fetch (``probe.fetches``), on whichever thread made it."""
        if self.probe is None or get_ident() != self.thread:
            return
        try:
            cpu = c1 - c0 if c0 is not None and c1 is not None else None
            if not self.fetch_seen:         # worker start-up: reported apart, as probe.loader() does
                self.fetch_seen = True
                self.probe.first_batch_wait = t1 - t0
                self.probe.event("first_batch", seconds=t1 - t0)
                t0, c0, cpu = t1, c1, None
            if self.open is not None:       # a later micro-batch of the open step
                self.open.add(t1 - t0, cpu=cpu)
                return
            waits = self.waiting = before_step(self.waiting, id(it), t0, c0)
            if waits.cpu0 is None:          # the clock the step's CPU time counts from
                waits.cpu0 = time.thread_time()
            waits.add(t1 - t0, cpu=cpu)
        except Exception as exc:
            self.probe.report_error("batch fetch", exc)

    def batch_start(self) -> None:
        if self.probe is None or not self.marking or self.open is not None:
            return
        waits, self.waiting = self.waiting, None
        if waits is None:                   # no fetch timed since the previous step: it starts here
            waits = Waits(None, time.perf_counter())
        self.open = waits
        self.probe.begin_step(waits.cpu0)

    def batch_end(self, global_step: int, samples: float | None, tokens_seen: float | None = None) -> None:
        """After every micro-batch; a step ends when the trainer's global step moved."""
        waits = self.open
        if self.probe is None or waits is None:
            return
        self.samples += samples or 0.0
        if self.counted_step is not None and global_step <= self.counted_step:
            return
        end = time.perf_counter()
        tokens = None
        if tokens_seen is not None and self.tokens_seen is not None and tokens_seen > self.tokens_seen:
            tokens = tokens_seen - self.tokens_seen
        self.probe.add_step(waits.start, end, phases={"data": waits.seconds} if self.fetch_seen else None,
                            samples=self.samples or None, data_cpu=waits.cpu, tokens=tokens)
        self.tokens_seen = tokens_seen
        self.counted_step = global_step
        self.open, self.samples = None, 0.0

    def metrics(self) -> dict[str, float]:
        if self.live is None and not self.marking:      # zero-code mode's probe, once it started
            self.probe = probe_api.current()
            self._read_numbers()
        return self.live.metrics() if self.live is not None else {}


def batch_size(batch: Any) -> int | None:
    """The leading dimension of the first tensor in a batch (tensor, sequence or mapping)."""
    for value in (batch.values() if isinstance(batch, dict)
                  else batch if isinstance(batch, (list, tuple)) else [batch]):
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return None
