"""Steps as a trainer counts them, whatever the framework: the callbacks' shared core.

A step is one optimizer step of the trainer (its ``global_step``), from the first micro-batch
of a gradient-accumulation window to the optimizer step that ends it. The time since the
previous step's end is split into the trainer's own pauses (evaluation, checkpoints: ETTR's
lost time, ``pause``) and the rest, which is the wait for the next batch (``data``, with the
training thread's CPU in it, so a slow collate reads as preprocessing); so are the waits for
the further micro-batches of the step. Forward, backward and
optimizer phases come from ``watch(model, optimizer)``. Under ``perfmon run`` zero-code mode
already finds the same steps: the callback then only brings the numbers to the trainer's logs.
"""

from __future__ import annotations

import time
from typing import Any

import probe as probe_api
from probe.integrations.live import LiveNumbers


class TrainerSteps:
    def __init__(self, job: str | None = None) -> None:
        self.job = job
        self.probe: Any = None
        self.live: LiveNumbers | None = None
        self.begin: float | None = None        # perf_counter of the open step's first micro-batch
        self.begin_cpu = 0.0                   # thread_time then
        self.between: tuple[float, float] | None = None   # (perf_counter, thread_time) at a micro-batch's end
        self.inner_data = 0.0                  # waits for the next micro-batch inside the open step
        self.inner_cpu = 0.0
        self.prev_end: float | None = None
        self.prev_cpu: float | None = None     # thread_time at the previous step's end
        self.paused = 0.0                      # the trainer's own pauses since then
        self.samples = 0.0
        self.tokens_seen: float | None = None
        self.counted_step: int | None = None   # the trainer's global_step at our last step end
        self.marking = True                    # False under perfmon run: zero-code mode marks the steps

    def attach(self, model: Any, optimizers: Any, global_step: int) -> None:
        """Training starts: the probe and its watch, the live numbers. Under ``perfmon run`` the
        zero-code mode starts the probe at the first step and marks the steps itself."""
        from probe import auto

        self.counted_step = global_step
        if auto.active():
            self.marking = False
            return
        self.probe = probe_api.current() or probe_api.start(self.job)
        self.probe.watch(model=model, optimizer=optimizers)
        self._read_numbers()

    def _read_numbers(self) -> None:
        if self.live is None and self.probe is not None:
            try:
                self.live = LiveNumbers(self.probe)
            except Exception as exc:       # the numbers are a bonus; the steps are not
                self.probe.report_error("live numbers", exc)

    def batch_start(self) -> None:
        if self.probe is None or not self.marking:
            return
        if self.begin is not None:        # the next micro-batch of the open step: the wait for it is data too
            if self.between is not None:
                self.inner_data += time.perf_counter() - self.between[0]
                self.inner_cpu += time.thread_time() - self.between[1]
                self.between = None
            return
        self.begin, self.begin_cpu = time.perf_counter(), time.thread_time()
        # no pause since the previous step: it starts at that step's end, and so does its CPU time
        self.probe.begin_step(self.prev_cpu if self.paused == 0 else None)

    def batch_end(self, global_step: int, samples: float | None, tokens_seen: float | None = None) -> None:
        """After every micro-batch; a step ends when the trainer's global step moved."""
        if self.probe is None or self.begin is None:
            return
        self.samples += samples or 0.0
        if self.counted_step is not None and global_step <= self.counted_step:
            self.between = (time.perf_counter(), time.thread_time())
            return
        end, cpu = time.perf_counter(), time.thread_time()
        start = self.prev_end if self.prev_end is not None else self.begin
        pause = min(self.paused, max(0.0, self.begin - start))
        data = max(0.0, self.begin - start - pause)
        tokens = None
        if tokens_seen is not None and self.tokens_seen is not None and tokens_seen > self.tokens_seen:
            tokens = tokens_seen - self.tokens_seen
        data_cpu = None         # the thread's CPU while it waited; unknown when a pause shares the interval
        if self.prev_cpu is not None and data > 0 and pause == 0:
            data_cpu = min(data, max(0.0, self.begin_cpu - self.prev_cpu)) + self.inner_cpu
        self.probe.add_step(start + pause, end, phases={"data": data + self.inner_data}, samples=self.samples or None,
                            data_cpu=data_cpu, tokens=tokens)
        self.prev_end, self.prev_cpu = end, cpu
        self.tokens_seen = tokens_seen
        self.counted_step = global_step
        self.begin, self.paused, self.samples = None, 0.0, 0.0
        self.between, self.inner_data, self.inner_cpu = None, 0.0, 0.0

    def pause(self, seconds: float) -> None:
        """The trainer spent ``seconds`` outside training (evaluation, a checkpoint)."""
        self.paused += max(0.0, seconds)

    def metrics(self) -> dict[str, float]:
        if self.live is None and not self.marking:      # zero-code mode's probe, once it started
            self.probe = probe_api.current()
            self._read_numbers()
        return self.live.metrics() if self.live is not None else {}


def batch_size(batch: Any) -> int | None:
    """The leading dimension of the first tensor in a batch (tensor, sequence or mapping)."""
    for value in (batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]):
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return None
