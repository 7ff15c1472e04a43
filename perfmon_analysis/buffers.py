"""Bounded per-rank buffers of wire records and the window and buffer sizes.

``RankState`` holds one rank's recent records in deques (ingest is O(1)), each parsed once at
ingest into its typed reading (``perfmon_analysis.readings``), its steps by the rank's ``StepParser``.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from perfmon_analysis.pauses import Pauses
from perfmon_analysis.readings import (
    CommReading,
    DeviceReading,
    EventReading,
    LayoutReading,
    MemoryReading,
    SampleReading,
    StallReading,
    StepOps,
    StepReading,
    WhereInterval,
    hello_reading,
    step_reading,
)
from perfmon_analysis.sketch import DurationSketch

__all__ = [
    "BLOCKING_EVENTS", "EVENT_BUFFER", "MIN_STEPS", "RECENT_SECONDS", "RankState", "STEP_BUFFER", "StepParser",
    "TIMELINE_STEPS", "WINDOW_SAMPLES", "WINDOW_SECONDS", "WINDOW_STEPS", "recent_records",
]

if TYPE_CHECKING:
    from perfmon_analysis.capture import CaptureSummary
    from perfmon_analysis.profile import ModuleProfile


# -- window and buffer sizes -----------------------------------------------------------------
WINDOW_STEPS = 50          # the window: the last 50 steps ...
WINDOW_SECONDS = 30.0      # ... or 30 s, whichever is shorter
MIN_STEPS = 5              # fewer steps in the window -> warming_up
STEP_BUFFER = 2048         # the probe backfills ~2000 steps on attach (probe.server.BACKFILL_STEPS)
SAMPLE_BUFFER = 120        # ~2 min of 1 Hz samples
WINDOW_SAMPLES = 60        # samples averaged for loader CPU / NVML utilization
MEMORY_BUFFER = 32
COMM_BUFFER = 64
EVENT_BUFFER = 200
TIMELINE_STEPS = 120       # steps handed to the timeline/data panes per rank
WHERE_BUFFER = 320         # ``where`` intervals (one per 2 s at most): the longest window the TUI offers (600 s)
OPS_BUFFER = 64            # steps' operations (wire 1.5) kept per rank: the straggler what-if's window at most

# Events whose ``seconds`` is time the training loop was blocked between steps.
BLOCKING_EVENTS = frozenset({"checkpoint", "eval", "evaluation", "save", "pause"})


# Sampled states (loader worker CPU, host RSS) are judged on the window's last 5 s of samples (each
# sample already averages its own second): they describe the job now, and a state the job has left must
# stop deciding within the 15 s the verdict is given to follow a change (with 10 s the demo tour's
# memory -> healthy switch took 13-17 s, bench/bench_tour.py). Step quantities use the window.
RECENT_SECONDS = 5.0


def recent_records(records: list[Any]) -> list[Any]:
    """The records (samples, memory readings: each with its time ``t``) of the last ``RECENT_SECONDS``."""
    last = next((s.t for s in reversed(records) if s.t is not None), None)
    if last is None:
        return records
    return [s for s in records if (s.t or last) >= last - RECENT_SECONDS] or records[-1:]


# -- parsing ---------------------------------------------------------------------------------
class StepParser:
    """One rank's step records in order, parsed with the time lost between steps: a step without
    ``gap`` after a blocking event (a checkpoint, an evaluation) gets the event's seconds as its
    gap, and each gap is told apart into the loop's work and a pause (``perfmon_analysis.pauses``).
    The run model and the trace export both parse through it, so they agree on every gap and pause."""

    __slots__ = ("pending_gap", "pauses")

    def __init__(self) -> None:
        self.pending_gap = 0.0   # blocking-event seconds not yet charged to a step
        self.pauses = Pauses()

    def event(self, event: EventReading) -> None:
        if event.name in BLOCKING_EVENTS and event.seconds is not None and event.seconds > 0:
            self.pending_gap += event.seconds

    def step(self, rec: dict[str, Any]) -> StepReading | None:
        """The step ``rec`` says (None when it lacks its number or duration: no gap charged)."""
        reading = step_reading(rec, self.pending_gap, self.pauses.pause)
        if reading is not None:
            self.pending_gap = 0.0
        return reading


# -- buffers ---------------------------------------------------------------------------------
class RankState:
    """Ring buffers of one process (one generation of one rank), each record parsed once."""

    __slots__ = ("rank", "stream", "hello", "info", "generation", "steps", "samples", "cpu", "memory", "comm",
                 "events", "drops", "ended", "version", "first_start", "last_end", "inside", "gap_total", "loop_total",
                 "unseen",
                 "parser", "loader_seen", "last_t", "recv_clock", "stall", "profile", "capture",
                 "summary_steps", "totals_through", "device", "where", "unmeasured", "run_times", "summary_times",
                 "layout", "ops", "_cache", "_health")

    def __init__(self, rank: int, stream: str, hello: dict[str, Any], generation: int) -> None:
        self.rank = rank
        self.stream = stream
        self.hello = hello               # the record, as ``RunModel.retired`` hands it out
        self.info = hello_reading(hello)
        self.generation = generation
        self.steps: collections.deque[StepReading] = collections.deque(maxlen=STEP_BUFFER)
        self.samples: collections.deque[SampleReading] = collections.deque(maxlen=SAMPLE_BUFFER)
        # each sample's CPU, at ingest
        self.cpu: collections.deque[float | None] = collections.deque(maxlen=SAMPLE_BUFFER)
        self.memory: collections.deque[MemoryReading] = collections.deque(maxlen=MEMORY_BUFFER)
        self.comm: collections.deque[CommReading] = collections.deque(maxlen=COMM_BUFFER)
        self.events: collections.deque[EventReading] = collections.deque(maxlen=EVENT_BUFFER)
        self.drops = 0
        self.ended = False
        self.version = 0
        # running totals for ETTR over everything seen, not only the ring
        self.first_start: float | None = None
        self.last_end: float | None = None
        self.inside = 0.0        # Σ active step time
        self.gap_total = 0.0     # Σ time between steps
        self.loop_total = 0.0    # Σ of it that is the loop's own work (the rest: pauses)
        self.unseen = 0.0        # wall time of steps we never received (drops)
        self.parser = StepParser()
        self.loader_seen = False
        self.last_t: float | None = None        # probe clock of the newest record
        self.recv_clock: float | None = None    # viewer's monotonic clock when that record arrived (live)
        self.stall: StallReading | None = None  # the stall in course (latest ``stall`` record), else None
        self.profile: ModuleProfile | None = None   # the latest module profile (``profile`` record)
        self.capture: CaptureSummary | None = None  # the latest torch.profiler capture (``capture`` record)
        self.summary_steps: int | None = None   # steps done, while a relay summarises the rank (no step records)
        self.totals_through = -1     # steps up to this one are in the running totals already (a summary's)
        # the job's device now (probe.gpu.job): the hello's until a sample says otherwise
        self.device: DeviceReading = self.info.device
        self.where: collections.deque[WhereInterval] = collections.deque(maxlen=WHERE_BUFFER)   # in-step stack samples
        self.unmeasured: dict[str, str] = {}   # quantity -> why the probe cannot measure it (its warning)
        self.run_times = DurationSketch()       # every step's time but the first: the run's percentiles
        self.summary_times: Any = None          # (window, run) step times while a relay summarises the rank
        self.layout: LayoutReading | None = None   # the rank's place in the job's layout (wire 1.5)
        self.ops: collections.deque[StepOps] = collections.deque(maxlen=OPS_BUFFER)   # its steps' operations (wire 1.5)
        self._cache: tuple[int, Any] | None = None     # (version, its RankStats): stats imports this module
        self._health: dict[str, Any] = {}       # perfmon_analysis.health's parts, each by what it reads

    def set_hello(self, hello: dict[str, Any]) -> None:
        """A hello for this process (its first, or a repeat on re-attach)."""
        self.hello = hello
        self.info = hello_reading(hello)
        self.version += 1

    def add_step(self, step: StepReading) -> None:
        """Append a step (``parser.step(rec)``) and count it in the running totals."""
        prev = self.steps[-1] if self.steps else None
        new = step.step > self.totals_through     # not already counted by a summary
        if self.first_start is None and step.start is not None:
            self.first_start = step.start
        elif new and prev is not None and step.start is not None and self.last_end is not None:
            if step.step > prev.step + 1:
                self.unseen += max(0.0, step.start - self.last_end)
        if new:
            if step.step > 0:
                self.run_times.add(step.dur, step.step)
            if step.t is not None:
                self.last_end = step.t
            self.inside += step.dur - step.gap
            self.gap_total += step.gap
            self.loop_total += step.loop
        if step.has_data:
            self.loader_seen = True
        self.steps.append(step)
