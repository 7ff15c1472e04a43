"""The view types the run model hands out: frozen snapshots of one instant of a job.

Built by ``perfmon_analysis.runmodel.RunModel.view``; read by the verdict rules, the report and
the panes. None means unknown, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfmon_analysis.capture import CaptureSummary
from perfmon_analysis.groups import GroupReduction
from perfmon_analysis.health import JobHealth
from perfmon_analysis.layout import Layout, world_layout
from perfmon_analysis.overhead import Overhead
from perfmon_analysis.profile import ModuleProfile
from perfmon_analysis.readings import GpuRow, HostReading, RankTrace, StallReading
from perfmon_analysis.step_times import StepTimes
from perfmon_analysis.stragglers import Straggling
from perfmon_analysis.stuck import StuckDiagnosis

__all__ = ["CommOpRow", "HolderLine", "JobView", "MemoryMetrics", "Metrics", "RankView", "WhereLine", "WhereTable"]


@dataclass(frozen=True)
class MemoryMetrics:
    """Memory of the job's fullest rank. Bytes; None = unknown.

    ``source`` is "device" (CUDA allocator via ``memory`` records / step.mem) or
    "host" (CPU job: RSS against ``mem_limit``). ``peak_frac`` = peak / limit.
    """

    source: str | None = None
    rank: int | None = None
    limit_bytes: int | None = None
    limit_source: str | None = None
    peak_bytes: int | None = None
    peak_frac: float | None = None
    params_bytes: int | None = None
    grads_bytes: int | None = None
    optimizer_bytes: int | None = None
    activations_bytes: int | None = None
    cache_bytes: int | None = None
    other_bytes: int | None = None
    fragmentation_bytes: int | None = None
    reserved_bytes: int | None = None
    allocated_bytes: int | None = None
    alloc_retries: int | None = None
    alloc_retries_rising: bool = False
    ooms: int = 0                   # OOM events + allocator OOM count increase, in the window

    def as_json(self) -> dict[str, Any]:
        """The report's ``metrics.memory`` object (the schema's keys first)."""
        return {
            "limit_bytes": self.limit_bytes, "peak_bytes": self.peak_bytes, "params_bytes": self.params_bytes,
            "grads_bytes": self.grads_bytes, "optimizer_bytes": self.optimizer_bytes,
            "activations_bytes": self.activations_bytes, "cache_bytes": self.cache_bytes,
            "other_bytes": self.other_bytes, "fragmentation_bytes": self.fragmentation_bytes,
            "reserved_bytes": self.reserved_bytes, "peak_frac": self.peak_frac, "source": self.source,
            "limit_source": self.limit_source, "rank": self.rank, "alloc_retries": self.alloc_retries,
            "alloc_retries_rising": self.alloc_retries_rising, "ooms": self.ooms,
        }


@dataclass(frozen=True)
class WhereLine:
    """One user source line over the window: where the training thread was during the stack samples
    of one span (``span``: "step", inside steps, or "between", between them). ``share`` is of the
    iteration (docs/verdict.md, "One whole"): samples here / the span's samples x the span's share of
    the iteration; ``err`` the 95% half-width of ``share`` from the sample count."""

    file: str
    line: int
    function: str
    call: str | None          # the line's source text
    lib: str | None           # "module.function" of the innermost library frame below it
    state: str | None         # "waiting" (off CPU) | "busy" (on CPU) | None (the probe could not tell)
    samples: int
    share: float
    err: float
    span: str = "step"

    @property
    def site(self) -> str:
        """'train.py:21': the file's base name and the line."""
        return f"{self.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{self.line}"

    @property
    def what(self) -> str:
        """The call the line makes: the library function, else the line's text, else its function."""
        return self.lib or self.call or self.function

    def as_json(self) -> dict[str, Any]:
        """One entry of the report's ``verdict.where``."""
        return {"file": self.file, "line": self.line, "function": self.function, "call": self.call,
                "lib": self.lib, "state": self.state, "share": round(self.share, 4), "err": round(self.err, 4),
                "samples": self.samples, "span": self.span}


@dataclass(frozen=True)
class HolderLine:
    """Another Python thread of the process seen on CPU holding the GIL while the training thread
    waited, at that thread's user line: ``share`` of the iteration the training thread waited so
    (its samples / the span's samples x the span's share), ``of_waiting``: of the training thread's
    waiting samples in that span."""

    thread: str
    file: str
    line: int
    function: str
    call: str | None
    span: str
    samples: int
    share: float
    of_waiting: float

    @property
    def site(self) -> str:
        return f"{self.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{self.line}"

    def as_json(self) -> dict[str, Any]:
        return {"thread": self.thread, "file": self.file, "line": self.line, "function": self.function,
                "call": self.call, "span": self.span, "samples": self.samples, "share": round(self.share, 4),
                "of_waiting": round(self.of_waiting, 4)}


@dataclass(frozen=True)
class WhereTable:
    """The window's stack samples of one rank (the one with the most unexplained time), in steps and
    between them.

    ``samples``: all in-step samples in the window (listed lines and the rest); ``span_share``: the
    share of the iteration the in-step sampled span covers (the step body, or the whole active step in
    zero-code mode); ``between_samples``/``between_share``: the same between steps; ``lines``: both
    spans', the largest share first; ``holders``: threads seen holding the GIL while the training thread
    waited, the largest first."""

    rank: int
    samples: int
    hz: float | None
    span_share: float
    waiting: int
    busy: int
    lines: tuple[WhereLine, ...]
    runq: float | None = None     # share of the sampled time the thread was runnable but had no core
    between_samples: int = 0
    between_share: float = 0.0
    between_waiting: int = 0
    between_busy: int = 0
    holders: tuple[HolderLine, ...] = ()
    between_busy_before: int = 0      # busy between-step samples before the loop's step lines (data preparation)
    between_runq: float | None = None   # share of the sampled between-step time runnable with no core free

    @property
    def contention(self) -> float | None:
        """Share of the iteration the thread waited for a core inside steps (CPU contention), when measured."""
        return None if self.runq is None else self.runq * self.span_share

    @property
    def wait_frac(self) -> float | None:
        """In-step waiting samples / (waiting + busy samples); None without any."""
        n = self.waiting + self.busy
        return self.waiting / n if n else None

    @property
    def between_wait_frac(self) -> float | None:
        """Between-step waiting samples / (waiting + busy samples); None without any."""
        n = self.between_waiting + self.between_busy
        return self.between_waiting / n if n else None

    @property
    def between_prep_frac(self) -> float | None:
        """Busy between-step samples taken before the loop's step lines / all busy between-step samples."""
        return self.between_busy_before / self.between_busy if self.between_busy else None

    def top(self, n: int = 5, state: str | None = None, span: str | None = "step") -> tuple[WhereLine, ...]:
        """The ``n`` largest lines of ``span`` (None: either) in ``state`` (None: any)."""
        return tuple(x for x in self.lines if (state is None or x.state == state)
                     and (span is None or x.span == span))[:n]

    def holder(self, span: str | None = None) -> HolderLine | None:
        """The thread seen holding the GIL the most while the training thread waited (in ``span``)."""
        return next((h for h in self.holders if span is None or h.span == span), None)


@dataclass(frozen=True)
class Metrics:
    """Job-level numbers. Field names equal the report JSON ``metrics`` keys (tui/schemas/report.schema.json).

    Aggregation across ranks: the flowchart quantities take the worst rank,
    because in a synchronous job one rank's idle or waiting time is lost by
    all: ``device_busy`` the least busy rank, ``data_wait_frac``, ``comm_frac``,
    ``comm_exposed_frac`` and ``loader_cpu`` the highest; ``ettr`` the least
    productive rank; ``step_time_median_s`` the slowest rank (it sets the
    pace); throughputs are summed; the rest are means over ranks. A rank whose busy is not measured
    makes the job's ``device_busy`` not measured (``device_busy_unknown`` names it and says why): the
    least busy rank may be that one.
    Keys besides the flowchart quantities: busbw, comm_op, comm_estimated, loader_workers,
    data_cpu_frac, gap_frac, compute_ratio, arrival_ratio, straggler_by, flops_per_s,
    memory_headroom, device_busy_source, peak_flops, peak_source, host_lead_s, off_cpu_frac (the
    highest), host_wait_frac and loop_wait_frac (of the rank whose stack samples are shown), loop_frac
    and pause_frac (the highest). Every share of time is of one whole, the iteration over the wall time
    (``perfmon_analysis.stats``).
    """

    steps: int = 0
    step_time_median_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    device_busy: float | None = None        # share of the step a kernel ran (time; docs/verdict.md)
    device_busy_source: str | None = None   # a key of perfmon_analysis.losses.BUSY_SOURCES
    device_busy_unknown: dict[str, str] | None = None   # rank -> why its busy is not measured (NVML's words)
    device_fill: float | None = None        # GPM SM activity / busy: the device the running kernels fill
    gpu_util: float | None = None           # NVML utilization over the window, least of the ranks
    sm_active: float | None = None          # GPM SM activity (idle counting 0), least of the ranks
    tensor_active: float | None = None      # GPM tensor-core activity, mean over ranks
    params_offloaded: float | None = None   # CUDA: share of parameter bytes in host memory (most of the ranks)
    data_wait_frac: float | None = None
    data_cpu_frac: float | None = None      # main-thread CPU share of the data wait (num_workers=0)
    comm_frac: float | None = None
    comm_exposed_frac: float | None = None
    comm_estimated: bool | None = None      # exposed comm is an estimate (GPU without events)
    comm_op: str | None = None              # the collective with the most time in the window
    busbw: float | None = None              # bytes/s of comm_op (nccl-tests definition)
    syncs_per_step: float | None = None
    host_lead_s: float | None = None        # how far the host runs ahead of the GPU (least of the ranks)
    host_lead_steps: float | None = None    # the host's lead in steps of device time (least of the ranks)
    host_queued_whole_frac: float | None = None  # timed steps queued whole before the device began them (least)
    device_time_median_s: float | None = None   # device time of the timed steps, first event to last (slowest rank)
    off_cpu_frac: float | None = None       # step body off CPU, no other measured cause (thread CPU time)
    host_wait_frac: float | None = None     # in-step stack samples off CPU / (off + on CPU)
    cpu_contention_frac: float | None = None  # step time the training thread was runnable with no core free
    mfu: float | None = None
    peak_flops: float | None = None         # the peak the MFU divides by (FLOP/s, device and dtype in use)
    peak_source: str | None = None          # "user" | "PERFMON_PEAK_TFLOPS" | "table" | ...
    flops_per_s: float | None = None        # per rank (mean)
    ettr: float | None = None
    gap_frac: float | None = None           # share of window wall time between steps (loop work and pauses)
    loop_frac: float | None = None          # the loop's own work between steps, of the iteration (window)
    pause_frac: float | None = None         # pauses between steps, of the wall time (the run: 1 - ETTR)
    loop_wait_frac: float | None = None     # the loop's work between steps off CPU: thread CPU clock, else samples
    loop_prep_frac: float | None = None     # busy between-step samples before the loop's step lines / all busy ones
    loader_cpu: float | None = None         # mean share of one core per loader worker (worst rank)
    loader_workers: int | None = None
    compute_ratio: float | None = None      # fastest / slowest rank compute time (1.0 = balanced)
    arrival_ratio: float | None = None      # first / last rank to reach the collective (step - exposed wait)
    straggler_by: str | None = None         # "compute" | "arrival": which rule named the straggler
    memory_headroom: float | None = None    # 1 - memory.peak_frac
    overhead_step_frac: float | None = None  # perfmon's training-thread time per step / the step (worst rank)
    overhead_cpu_frac: float | None = None   # perfmon's CPU / the process's CPU (that rank)
    power_w: float | None = None            # the job's GPUs' mean power over the window (NVML energy counter)
    energy_per_step_j: float | None = None   # their energy per step (the step's wall time, gaps included)
    energy_per_sample_j: float | None = None
    energy_per_token_j: float | None = None
    memory: MemoryMetrics = field(default_factory=MemoryMetrics)


@dataclass(frozen=True)
class RankView:
    """One rank's windowed numbers (the ranks pane and the report's per-rank rows).

    ``generation`` counts processes that have been this rank (0 = the first; a
    torchrun restart or a new pid makes a new one); ``compute_s`` is the median
    compute time per step (active − data − exposed comm), the straggler measure.
    """

    rank: int
    stream: str
    host: str | None
    pid: int | None
    restart: int
    generation: int
    steps: int                       # steps reported by this process (last step number + 1)
    window_steps: int
    warming_up: bool
    step_time_median_s: float | None
    compute_s: float | None
    device_busy: float | None
    data_wait_frac: float | None
    comm_frac: float | None
    comm_exposed_frac: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    syncs_per_step: float | None
    mfu: float | None
    ettr: float | None
    loader_cpu: float | None
    loader_workers: int | None
    cpu: float | None                # cores busy in the process (latest sample)
    rss: int | None
    ended: bool
    since_last_step_s: float | None  # now − end of the latest step (a stall shows here)
    drops: int
    stall: StallReading | None = None   # the probe says no step ended for longer than its stall threshold
    stalled_s: float | None = None      # how long that stall has lasted now
    silent_s: float | None = None       # live: seconds since the rank's newest record arrived
    answered: bool = True               # its hello arrived (False: a connected socket that never spoke)
    overhead_step_frac: float | None = None   # perfmon's own cost: share of the step (perfmon_analysis.overhead)
    overhead_cpu_frac: float | None = None    # ... and of the process's CPU
    step_times: StepTimes | None = None       # step-time percentiles over the window (perfmon_analysis.step_times)
    run_step_times: StepTimes | None = None   # ... and over the whole run
    device_fill: float | None = None    # GPM SM activity over busy (perfmon_analysis.device_stats.gpu_fill)


@dataclass(frozen=True)
class CommOpRow:
    """One collective over the window, summed over ranks; busbw/algbw in bytes/s (mean over ranks)."""

    op: str
    count: int
    bytes: int
    seconds: float
    busbw: float | None
    algbw: float | None
    ranks: int


@dataclass(frozen=True)
class JobView:
    """Everything a pane or the verdict needs, derived from the buffers at one instant.

    No field holds a wire dict: per-rank history is typed (``perfmon_analysis.readings``), so a
    pane formats values and never parses a record.
    * ``traces[r]``: the last ``TIMELINE_STEPS`` steps of rank r as ``StepBar``s, the data-wait
      share of each, and the process CPU of its recent samples;
    * ``gpus``: one ``GpuRow`` per GPU in use (a rank's own GPU; once per host and index);
    * ``hosts[r]``: the host side of rank r's latest sample;
    * ``device_status``: why there are no GPU readings ("no NVIDIA GPU: ..."), from the probe;
    * ``comm_status``: why DDP's communication is not timed (a warning event that says it cannot be);
    * ``started``: when the earliest rank's probe started (its hello), for the uptime.
    ``events``: recent events of all ranks (each with ``rank`` added), oldest first.
    ``problems``: one line per stream problem the caller reported (torn recording, ...).
    ``restarted``: ranks that are on a second or later generation.
    """

    job: str | None
    world_size: int
    device_type: str                 # "cpu" | "cuda"
    device_name: str | None
    now: float
    ranks: list[RankView]
    metrics: Metrics
    window: dict[str, float]         # {"steps": n, "seconds": s}
    warming_up: bool
    ended: bool
    drops_total: int
    traces: dict[int, RankTrace]
    comm_ops: list[CommOpRow]
    gpus: tuple[GpuRow, ...]
    hosts: dict[int, HostReading]
    device_status: str | None
    started: float | None
    events: list[dict[str, Any]]
    straggler_rank: int | None       # see stats._straggler: slowest compute, or last to arrive at the collective
    restarted: list[int]
    problems: list[str]
    stuck: StuckDiagnosis | None = None   # some rank stalled or went silent (perfmon_analysis.stuck)
    profile: ModuleProfile | None = None  # the newest module profile of any rank (perfmon_analysis.profile)
    captures: tuple[CaptureSummary, ...] = ()   # each rank's latest torch.profiler capture (by rank)
    where: WhereTable | None = None       # in-step stack samples (wire 1.3), None when no rank sent any
    overhead: Overhead | None = None      # perfmon's own cost on the rank where it is highest (wire 1.4)
    comm_status: str | None = None        # why communication is not measured, in the probe's words
    health: JobHealth = JobHealth()       # step-time percentiles and outliers, memory growth, crash
    groups: tuple[GroupReduction, ...] = ()   # through group relays: reductions by key, ("job", "") last
    layout: Layout = field(default_factory=lambda: world_layout(1))   # each rank's place (perfmon_analysis.layout)
    straggling: Straggling | None = None  # the what-if over the window's operations (perfmon_analysis.stragglers)
