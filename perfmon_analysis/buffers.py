"""Bounded per-rank buffers of wire records and the window and buffer sizes.

``RankState`` holds one rank's recent records in deques (ingest is O(1));
``StepNums`` is the handful of numbers of one step the statistics need, parsed once
at ingest. Wire keys are read here and in ``perfmon_analysis.stats``, nowhere past the model.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Deque, NamedTuple

from perfmon_analysis.stuck import StallReading

if TYPE_CHECKING:
    from perfmon_analysis.capture import CaptureSummary
    from perfmon_analysis.profile import ModuleProfile


# -- window and buffer sizes -----------------------------------------------------------------
WINDOW_STEPS = 50          # DESIGN §6: last 50 steps ...
WINDOW_SECONDS = 30.0      # ... or 30 s, whichever is shorter
MIN_STEPS = 5              # DESIGN §6: fewer steps -> warming_up
STEP_BUFFER = 2048         # the probe backfills ~2000 steps on attach (probe.server.BACKFILL_STEPS)
SAMPLE_BUFFER = 120        # ~2 min of 1 Hz samples
WINDOW_SAMPLES = 60        # samples averaged for loader CPU / NVML utilization
MEMORY_BUFFER = 32
COMM_BUFFER = 64
EVENT_BUFFER = 200
TIMELINE_STEPS = 120       # steps handed to the timeline/data panes per rank
WHERE_BUFFER = 320         # ``where`` intervals (one per 2 s at most): the longest window the TUI offers (600 s)

# Events whose ``seconds`` is time the training loop was blocked between steps.
BLOCKING_EVENTS = frozenset({"checkpoint", "eval", "evaluation", "save", "pause"})


# -- buffers ---------------------------------------------------------------------------------
class RankState:
    """Ring buffers of one process (one generation of one rank)."""

    __slots__ = ("rank", "stream", "hello", "generation", "steps", "nums", "samples", "cpu", "memory", "comm", "events",
                 "drops", "ended", "version", "first_start", "last_end", "inside", "gap_total", "unseen",
                 "pending_gap", "loader_seen", "last_t", "recv_clock", "stall", "profile", "capture",
                 "summary_steps", "totals_through", "device", "where", "_cache")

    def __init__(self, rank: int, stream: str, hello: dict[str, Any], generation: int) -> None:
        self.rank = rank
        self.stream = stream
        self.hello = hello
        self.generation = generation
        self.steps: Deque[dict[str, Any]] = collections.deque(maxlen=STEP_BUFFER)
        self.nums: Deque[StepNums] = collections.deque(maxlen=STEP_BUFFER)   # parallel to steps
        self.samples: Deque[dict[str, Any]] = collections.deque(maxlen=SAMPLE_BUFFER)
        self.cpu: Deque[float | None] = collections.deque(maxlen=SAMPLE_BUFFER)   # each sample's CPU, at ingest
        self.memory: Deque[dict[str, Any]] = collections.deque(maxlen=MEMORY_BUFFER)
        self.comm: Deque[dict[str, Any]] = collections.deque(maxlen=COMM_BUFFER)
        self.events: Deque[dict[str, Any]] = collections.deque(maxlen=EVENT_BUFFER)
        self.drops = 0
        self.ended = False
        self.version = 0
        # running totals for ETTR over everything seen, not only the ring
        self.first_start: float | None = None
        self.last_end: float | None = None
        self.inside = 0.0        # Σ active step time
        self.gap_total = 0.0     # Σ time lost between steps
        self.unseen = 0.0        # wall time of steps we never received (drops)
        self.pending_gap = 0.0   # blocking-event seconds not yet charged to a step
        self.loader_seen = False
        self.last_t: float | None = None        # probe clock of the newest record
        self.recv_clock: float | None = None    # viewer's monotonic clock when that record arrived (live)
        self.stall: StallReading | None = None  # the stall in course (latest ``stall`` record), else None
        self.profile: ModuleProfile | None = None   # the latest module profile (``profile`` record)
        self.capture: CaptureSummary | None = None  # the latest torch.profiler capture (``capture`` record)
        self.summary_steps: int | None = None   # steps done, while a relay summarises the rank (no step records)
        self.totals_through = -1     # steps up to this one are in the running totals already (a summary's)
        # the job's device now (probe.gpu.job): the hello's until a sample says otherwise
        self.device: dict[str, Any] = hello["device"] if isinstance(hello.get("device"), dict) else {}
        # in-step stack samples, ``perfmon_analysis.readings.WhereInterval`` (readings imports this module)
        self.where: Deque[Any] = collections.deque(maxlen=WHERE_BUFFER)
        self._cache: tuple[int, Any] | None = None

    def add_step(self, rec: dict[str, Any], cpu: float | None = None, cpu_active: bool = False) -> None:
        """Append a step; ``cpu``/``cpu_active``: its body's thread CPU time (``readings.step_cpu``)."""
        dur = num(rec.get("dur")) or 0.0
        end = num(rec.get("t"))
        start = num(rec.get("start"))
        if start is None and end is not None:
            start = end - dur
        gap = num(rec.get("gap"))
        if gap is None:
            gap = min(self.pending_gap, dur)
            if gap:
                rec = dict(rec, gap=gap)
        self.pending_gap = 0.0
        gap = max(0.0, min(gap, dur))
        prev = self.steps[-1] if self.steps else None
        new = rec["step"] > self.totals_through     # not already counted by a summary
        if self.first_start is None and start is not None:
            self.first_start = start
        elif new and prev is not None and start is not None and self.last_end is not None:
            if isinstance(prev.get("step"), int) and rec["step"] > prev["step"] + 1:
                self.unseen += max(0.0, start - self.last_end)
        if new:
            if end is not None:
                self.last_end = end
            self.inside += dur - gap
            self.gap_total += gap
        nums = step_nums(rec, dur, gap, end, start, cpu, cpu_active)
        if nums.has_data:
            self.loader_seen = True
        self.steps.append(rec)
        self.nums.append(nums)


class StepNums(NamedTuple):
    """The numbers of one step record, extracted once at ingest so windows are cheap."""

    step: int
    t: float | None
    start: float | None
    dur: float
    gap: float
    active: float
    data: float
    has_data: bool
    secs: float | None
    exposed: float | None
    estimated: bool
    samples: float | None
    tokens: float | None
    flops: float | None
    syncs: float | None
    data_cpu: float | None
    lead: float | None          # seconds the host finished ahead of the device (CUDA events)
    data_share: float
    cpu: float | None = None    # training thread CPU s in the step body (active - data), loader wait excluded
    cpu_active: bool = False    # the probe's in-step span (CPU time, stack samples) was the whole active step


def step_nums(rec: dict[str, Any], dur: float, gap: float, end: float | None, start: float | None,
              cpu: float | None = None, cpu_active: bool = False) -> StepNums:
    phases = rec.get("phases") if isinstance(rec.get("phases"), dict) else {}
    comm = rec.get("comm") if isinstance(rec.get("comm"), dict) else None
    data = num(phases.get("data")) or 0.0
    active = max(dur - gap, 1e-9)
    return StepNums(
        step=rec["step"], t=end, start=start, dur=dur, gap=gap, active=active, data=data,
        has_data="data" in phases, secs=_comm_value(comm, "seconds"), exposed=_comm_value(comm, "exposed"),
        estimated=bool(comm.get("estimated")) if comm else False, samples=num(rec.get("samples")),
        tokens=num(rec.get("tokens")), flops=num(rec.get("flops")), syncs=num(rec.get("syncs")),
        data_cpu=num(rec.get("data_cpu")), lead=num(rec.get("lead")),
        data_share=max(0.0, min(1.0, data / active)), cpu=cpu, cpu_active=cpu_active)


def num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)

def _comm_value(comm: dict[str, Any] | None, key: str) -> float | None:
    """``comm[key]`` seconds; a step the comm instrumentation saw with no collective counts as 0."""
    if comm is None:
        return None
    value = num(comm.get(key))
    if value is None and comm.get("ops") == 0:
        return 0.0
    return value
