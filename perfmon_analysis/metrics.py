"""Every number perfmon exports, named once: the report JSON, the Prometheus gauges and the
trainer callbacks' ``perfmon/...`` keys all derive from ``METRICS``.

A ``Metric`` has one ``name`` (its key in the report JSON). The exported names follow from it
and its ``Unit``: the report suffix (``_frac``, ``_s``, ``_per_s``) is replaced by the Prometheus
base-unit suffix (``_ratio``, ``_seconds``, ``_per_second``), so ``data_wait_frac`` is
``perfmon_data_wait_ratio`` on a scrape and ``perfmon/data_wait_ratio`` in a trainer's logs.
Renaming a metric here renames it on every surface.

Each metric says how it is computed: ``job`` from the window's ``JobView`` (the report's
``metrics`` object, the callbacks), ``rank`` from one rank's ``RankView`` (the report's per-rank
rows, the per-rank Prometheus gauges). Values are rounded once, here
(``DECIMALS``), so every surface shows the same number. None (unknown) stays None: a surface
leaves it out or writes null, never 0.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfmon_analysis.losses import account, by_id

__all__ = [
    "CALLBACK_PREFIX", "COMM_BUSBW_FAMILY", "COMM_SECONDS_FAMILY", "COMPARED", "DECIMALS", "ETTR",
    "GAIN_CALLBACKS", "GAIN_FAMILIES", "GROUP_COUNTS", "GROUP_EXTREME_RANK", "GROUP_PREFIX", "GROUP_QUANTITIES",
    "GROUP_RELAYS_DOWN", "GROUP_STATS", "GROUP_SUMS", "MEMORY_FAMILY", "MEMORY_PEAK", "METRICS", "Metric",
    "Surface", "Unit", "VERDICT_FAMILY", "bottleneck_callback", "by_name", "callback_values", "gain_callback",
    "job_values", "loss_metrics", "markdown", "on", "rank_values", "rounded",
]

if TYPE_CHECKING:
    from perfmon_analysis.views import JobView, RankView

DECIMALS = 6          # one precision for every exported float: a microsecond, a millionth of a step


class Surface(enum.Flag):
    """Where a metric is exported."""

    REPORT = enum.auto()          # ``perfmon report --json``: ``metrics`` (job) and ``ranks[]`` (rank)
    PROMETHEUS = enum.auto()      # ``perfmon export --prometheus``: one series per rank
    CALLBACKS = enum.auto()       # Lightning / HF callbacks, ``perfmon/<name>``: this rank's job numbers


ALL = Surface.REPORT | Surface.PROMETHEUS | Surface.CALLBACKS


class Unit(enum.Enum):
    """A metric's unit: ``(report suffix, Prometheus suffix, numeric)``."""

    RATIO = ("_frac", "_ratio", True)                 # 0..1 share
    CORES = ("", "_cores", True)                      # share of one CPU core (can pass 1)
    SECONDS = ("_s", "_seconds", True)
    PER_SECOND = ("_per_s", "_per_second", True)
    PER_STEP = ("_per_step", "_per_step", True)
    BYTES_PER_SECOND = ("", "_bytes_per_second", True)
    FLOPS = ("", "_flops_per_second", True)           # FLOP/s
    WATTS = ("_w", "_watts", True)
    JOULES = ("_j", "_joules", True)
    COUNT = ("", "", True)
    LABEL = ("", "", False)                           # a string, a flag or a category: report only

    @property
    def report_suffix(self) -> str:
        return self.value[0]

    @property
    def prometheus_suffix(self) -> str:
        return self.value[1]

    @property
    def numeric(self) -> bool:
        return self.value[2]


JobFn = Callable[["JobView"], Any]
RankFn = Callable[["RankView"], Any]


@dataclass(frozen=True)
class Metric:
    """One exported number. ``job``/``rank``: how it is computed (None: not at that scope);
    ``loss``: the verdict's loss (``perfmon_analysis.losses``) whose share this metric is."""

    name: str
    unit: Unit
    help: str
    job: JobFn | None = None
    rank: RankFn | None = None
    surfaces: Surface = Surface.REPORT
    counter: bool = False         # Prometheus counter (``_total``) rather than gauge
    loss: str | None = None
    worse: str | None = None      # "up" | "down": which change ``perfmon compare`` calls worse (None: context)

    @property
    def stem(self) -> str:
        """The name without its report unit suffix: ``data_wait_frac`` -> ``data_wait``."""
        suffix = self.unit.report_suffix
        return self.name[: -len(suffix)] if suffix and self.name.endswith(suffix) else self.name

    @property
    def exported(self) -> str:
        """The unit-explicit name the scrape and the callbacks use: ``data_wait_ratio``."""
        suffix = self.unit.prometheus_suffix
        return self.stem if not suffix or self.stem.endswith(suffix) else self.stem + suffix

    @property
    def prometheus(self) -> str:
        return f"perfmon_{self.exported}"

    @property
    def callback(self) -> str:
        return callback_key(self.exported)

    def job_value(self, view: JobView) -> Any:
        return rounded(self.job(view)) if self.job is not None else None

    def rank_value(self, rank: RankView) -> Any:
        return rounded(self.rank(rank)) if self.rank is not None else None


CALLBACK_PREFIX = "perfmon/"


def callback_key(*parts: str) -> str:
    """A trainer callback's scalar key: ``perfmon/<part>/<part>...``, the one place it is spelled."""
    return CALLBACK_PREFIX + "/".join(parts)


def rounded(x: Any) -> Any:
    """The one precision of exported floats (bools and ints pass unchanged)."""
    return round(x, DECIMALS) if isinstance(x, float) else x


def _idle(view: JobView) -> float | None:
    """The device-idle loss of the view's accounting, the share the verdict judges."""
    return by_id(account(view.metrics, view.device_type, view.comm_status))["device_idle"].share


def _times(rank: RankView, name: str, run: bool = False) -> float | None:
    """A percentile of the rank's step times (``perfmon_analysis.step_times``), None before any."""
    times = rank.run_step_times if run else rank.step_times
    return getattr(times, name) if times is not None else None


_RP = Surface.REPORT | Surface.PROMETHEUS

METRICS: tuple[Metric, ...] = (
    Metric("steps", Unit.COUNT, "Steps the rank has completed",
           job=lambda v: v.metrics.steps, rank=lambda r: r.steps, surfaces=_RP, counter=True),
    Metric("step_time_median_s", Unit.SECONDS,
           "Median step time over the window: the iteration, from one step's start to the next's "
           "(data wait and time between steps included)",
           job=lambda v: v.metrics.step_time_median_s, rank=lambda r: r.step_time_median_s, surfaces=ALL, worse="up"),
    Metric("step_time_p90_s", Unit.SECONDS, "90th percentile of the step time over the window",
           job=lambda v: v.health.window.p90, rank=lambda r: _times(r, "p90"), surfaces=_RP),
    Metric("step_time_p99_s", Unit.SECONDS, "99th percentile of the step time over the window",
           job=lambda v: v.health.window.p99, rank=lambda r: _times(r, "p99"), surfaces=_RP),
    Metric("step_time_max_s", Unit.SECONDS, "Longest step over the window",
           job=lambda v: v.health.window.max, rank=lambda r: _times(r, "max"), surfaces=_RP),
    Metric("run_step_time_p50_s", Unit.SECONDS, "Median step time over the whole run (first step left out; "
           "within 1%)", job=lambda v: v.health.run.p50, rank=lambda r: _times(r, "p50", run=True)),
    Metric("run_step_time_p90_s", Unit.SECONDS, "90th percentile of the step time over the whole run (within 1%)",
           job=lambda v: v.health.run.p90, rank=lambda r: _times(r, "p90", run=True)),
    Metric("run_step_time_p99_s", Unit.SECONDS, "99th percentile of the step time over the whole run (within 1%)",
           job=lambda v: v.health.run.p99, rank=lambda r: _times(r, "p99", run=True)),
    Metric("run_step_time_max_s", Unit.SECONDS, "Longest step of the whole run (first step left out)",
           job=lambda v: v.health.run.max, rank=lambda r: _times(r, "max", run=True)),
    Metric("compute_s", Unit.SECONDS, "Median compute time per step: step - gaps - data wait - exposed comm",
           rank=lambda r: r.compute_s),
    Metric("samples_per_s", Unit.PER_SECOND, "Samples per second over the window",
           job=lambda v: v.metrics.samples_per_s, rank=lambda r: r.samples_per_s, surfaces=ALL, worse="down"),
    Metric("tokens_per_s", Unit.PER_SECOND, "Tokens per second over the window",
           job=lambda v: v.metrics.tokens_per_s, rank=lambda r: r.tokens_per_s, surfaces=ALL, worse="down"),
    Metric("device_busy", Unit.RATIO, "Device busy share, in time: on GPU the share of the step a kernel ran "
           "(NVML utilization, or the steps' CUDA timeline where it proves more); on CPU the training thread's "
           "CPU time in the step. Least busy rank; not measured when any rank's is not",
           job=lambda v: v.metrics.device_busy, rank=lambda r: r.device_busy, surfaces=ALL, worse="down"),
    Metric("device_busy_unknown", Unit.LABEL, "Ranks whose busy is not measured, each with why (NVML's words: "
           "NotSupported, NoPermission, GpuIsLost, no NVML)", job=lambda v: v.metrics.device_busy_unknown),
    Metric("gpu_util", Unit.RATIO, "NVML utilization over the window: the share of time a kernel ran, as "
           "nvidia-smi shows it (least of the ranks), whichever source device_busy used",
           job=lambda v: v.metrics.gpu_util),
    Metric("device_fill", Unit.RATIO, "GPU fill: how much of the device the running kernels use, GPM SM "
           "activity over busy (Hopper and newer; least filled rank)",
           job=lambda v: v.metrics.device_fill, rank=lambda r: r.device_fill, surfaces=ALL),
    Metric("sm_active", Unit.RATIO, "GPM SM activity: the share of SMs with a warp resident, over time, idle "
           "time counting 0 (least of the ranks)", job=lambda v: v.metrics.sm_active),
    Metric("tensor_active", Unit.RATIO, "GPM tensor-core activity over time (mean over ranks)",
           job=lambda v: v.metrics.tensor_active),
    Metric("params_offloaded", Unit.RATIO, "CUDA job: share of the watched parameters' bytes held in host "
           "memory (CPU offload, a CPU embedding)", job=lambda v: v.metrics.params_offloaded),
    Metric("data_wait_frac", Unit.RATIO, "Share of the iteration blocked waiting for the next batch",
           job=lambda v: v.metrics.data_wait_frac, rank=lambda r: r.data_wait_frac, surfaces=ALL,
           loss="data_wait", worse="up"),
    Metric("comm_frac", Unit.RATIO, "Share of the iteration in collectives",
           job=lambda v: v.metrics.comm_frac, rank=lambda r: r.comm_frac, surfaces=_RP),
    Metric("comm_exposed_frac", Unit.RATIO, "Share of the iteration blocked on collectives (not overlapped)",
           job=lambda v: v.metrics.comm_exposed_frac, rank=lambda r: r.comm_exposed_frac, surfaces=ALL,
           loss="comm_exposed", worse="up"),
    Metric("device_idle_frac", Unit.RATIO, "Share of the iteration idle with no other measured cause "
           "(the verdict's device-idle loss)", job=_idle, loss="device_idle", worse="up"),
    Metric("syncs_per_step", Unit.PER_STEP, "Host-device synchronisations per step",
           job=lambda v: v.metrics.syncs_per_step, rank=lambda r: r.syncs_per_step, surfaces=_RP),
    Metric("mfu", Unit.RATIO, "Model FLOPs utilization: achieved FLOP/s over the device's peak for the dtype",
           job=lambda v: v.metrics.mfu, rank=lambda r: r.mfu, surfaces=ALL, worse="down"),
    Metric("ettr", Unit.RATIO,
           "Effective training time ratio: time in the training loop (steps and the loop's own work "
           "between them) over wall time; 1 - pause_frac",
           job=lambda v: v.metrics.ettr, rank=lambda r: r.ettr, surfaces=ALL, worse="down"),
    Metric("loader_cpu", Unit.CORES, "Mean share of one core per loader worker",
           job=lambda v: v.metrics.loader_cpu, rank=lambda r: r.loader_cpu),
    Metric("loader_workers", Unit.COUNT, "DataLoader worker processes",
           job=lambda v: v.metrics.loader_workers, rank=lambda r: r.loader_workers),
    Metric("busbw", Unit.BYTES_PER_SECOND, "Bus bandwidth of the busiest collective (nccl-tests busbw)",
           job=lambda v: v.metrics.busbw),
    Metric("comm_op", Unit.LABEL, "The collective with the most time in the window",
           job=lambda v: v.metrics.comm_op),
    Metric("comm_estimated", Unit.LABEL, "Exposed communication is estimated from collective times",
           job=lambda v: v.metrics.comm_estimated),
    Metric("data_cpu_frac", Unit.CORES, "Main-thread CPU share of the data wait (num_workers=0)",
           job=lambda v: v.metrics.data_cpu_frac),
    Metric("gap_frac", Unit.RATIO, "Share of the window's wall time between steps (loop work and pauses)",
           job=lambda v: v.metrics.gap_frac),
    Metric("loop_frac", Unit.RATIO, "Share of the iteration the loop spends between steps on every step "
           "(tokenizing, logging, a lock): the loop-work loss, over the window",
           job=lambda v: v.metrics.loop_frac, loss="loop", worse="up"),
    Metric("pause_frac", Unit.RATIO, "Share of the wall time lost to occasional pauses between steps "
           "(checkpoints, evaluation, stalls) over the whole run: 1 - ETTR",
           job=lambda v: v.metrics.pause_frac, loss="step_gaps", worse="up"),
    Metric("loop_wait_frac", Unit.RATIO, "Share of the loop's work between steps the training thread spends off CPU "
           "(its CPU clock in the gaps, zero-code mode; else the between-step stack samples)",
           job=lambda v: v.metrics.loop_wait_frac),
    Metric("loop_prep_frac", Unit.RATIO, "Busy between-step samples taken before the lines the loop runs its "
           "step from (preparing its input) over all busy between-step samples",
           job=lambda v: v.metrics.loop_prep_frac),
    Metric("compute_ratio", Unit.RATIO, "Fastest over slowest rank compute time (1 = balanced)",
           job=lambda v: v.metrics.compute_ratio),
    Metric("arrival_ratio", Unit.RATIO, "First over last rank to reach the collective",
           job=lambda v: v.metrics.arrival_ratio),
    Metric("straggler_by", Unit.LABEL, "Which rule named the straggler: compute or arrival",
           job=lambda v: v.metrics.straggler_by),
    Metric("flops_per_s", Unit.FLOPS, "Achieved FLOP/s per rank (mean)",
           job=lambda v: v.metrics.flops_per_s),
    Metric("memory_headroom", Unit.RATIO, "1 - peak memory over the limit (fullest rank)",
           job=lambda v: v.metrics.memory_headroom),
    Metric("device_busy_source", Unit.LABEL, "What device_busy measures (perfmon_analysis.losses.BUSY_SOURCES)",
           job=lambda v: v.metrics.device_busy_source),
    Metric("peak_flops", Unit.FLOPS, "The peak FLOP/s the MFU divides by",
           job=lambda v: v.metrics.peak_flops),
    Metric("peak_source", Unit.LABEL, "Where the peak FLOP/s came from",
           job=lambda v: v.metrics.peak_source),
    Metric("host_lead_s", Unit.SECONDS, "How far the host runs ahead of the GPU (least of the ranks; CUDA "
           "events on about ten steps a second)", job=lambda v: v.metrics.host_lead_s),
    Metric("host_lead_steps", Unit.COUNT, "The host's lead over the step's device time, as read (late, never "
           "short; least of the ranks)", job=lambda v: v.metrics.host_lead_steps),
    Metric("host_queued_whole_frac", Unit.RATIO, "Share of the CUDA-timed steps the host finished queueing before the "
           "GPU began them (least of the ranks): most, and launches are not what idles the GPU",
           job=lambda v: v.metrics.host_queued_whole_frac),
    Metric("device_time_median_s", Unit.SECONDS, "Device time of a step, its first CUDA event to its last (idle "
           "gaps inside included), over the timed steps (slowest rank)",
           job=lambda v: v.metrics.device_time_median_s),
    Metric("off_cpu_frac", Unit.RATIO, "Share of the iteration the step body is off CPU with no other measured cause",
           job=lambda v: v.metrics.off_cpu_frac),
    Metric("host_wait_frac", Unit.RATIO, "In-step stack samples off CPU over all in-step samples",
           job=lambda v: v.metrics.host_wait_frac),
    Metric("cpu_contention_frac", Unit.RATIO,
           "Share of the iteration the training thread was runnable in steps with no core free",
           job=lambda v: v.metrics.cpu_contention_frac),
    Metric("overhead_step_frac", Unit.RATIO, "perfmon's own cost: training-thread time in its step calls, "
           "hooks and wrappers over the step time (the rank where it is highest)",
           job=lambda v: v.metrics.overhead_step_frac, rank=lambda r: r.overhead_step_frac, surfaces=ALL),
    Metric("overhead_cpu_frac", Unit.RATIO, "perfmon's own cost: its threads' CPU and training-thread time "
           "over the process's CPU",
           job=lambda v: v.metrics.overhead_cpu_frac, rank=lambda r: r.overhead_cpu_frac, surfaces=ALL),
    Metric("power_w", Unit.WATTS, "Mean power of the job's GPUs over the window, from NVML's total-energy counter",
           job=lambda v: v.metrics.power_w),
    Metric("energy_per_step_j", Unit.JOULES, "Energy of the job's GPUs per step (the step's wall time, time "
           "between steps included)", job=lambda v: v.metrics.energy_per_step_j),
    Metric("energy_per_sample_j", Unit.JOULES, "Energy of the job's GPUs per sample",
           job=lambda v: v.metrics.energy_per_sample_j),
    Metric("energy_per_token_j", Unit.JOULES, "Energy of the job's GPUs per token",
           job=lambda v: v.metrics.energy_per_token_j),
)


# The relay tree's per-group series (``perfmon_analysis.groups``): quantity -> (Prometheus name, help).
# Each has a ``stat`` label (min, p50, p90, max); the ranks holding the extremes are
# ``perfmon_group_extreme_rank{quantity, end}``. Labels: job, group (a group of nodes: a node
# when there is no tree), and the grouping's dimension when it is not the tree's own.
GROUP_QUANTITIES: dict[str, tuple[str, str]] = {
    "step_time": ("perfmon_group_step_time_seconds", "Step time (window median per rank) across the group's ranks"),
    "compute": ("perfmon_group_compute_seconds", "Compute time per step across the group's ranks"),
    "arrival": ("perfmon_group_arrival_seconds",
                "Time from the step's start to the collective across the group's ranks"),
    "data_wait": ("perfmon_group_data_wait_ratio", "Data-wait share of the step across the group's ranks"),
    "exposed_comm": ("perfmon_group_comm_exposed_ratio", "Exposed-communication share across the group's ranks"),
    "busy": ("perfmon_group_device_busy_ratio", "Device busy share across the group's ranks"),
    "memory": ("perfmon_group_memory_peak_ratio", "Peak memory over the limit across the group's ranks"),
}
GROUP_STATS: tuple[tuple[str, float | None], ...] = (("min", None), ("p50", 0.5), ("p90", 0.9), ("max", None))
GROUP_COUNTS: dict[str, tuple[str, str]] = {
    "ranks": ("perfmon_group_ranks", "Ranks of the group that said hello"),
    "timed": ("perfmon_group_timed_ranks", "Ranks of the group past warm-up"),
    "stalled": ("perfmon_group_stalled_ranks", "Ranks of the group that report a stall"),
    "silent": ("perfmon_group_silent_ranks", "Ranks of the group silent past the heartbeat"),
}
GROUP_SUMS: dict[str, tuple[str, str]] = {
    "samples_per_s": ("perfmon_group_samples_per_second", "Samples per second summed over the group's ranks"),
    "tokens_per_s": ("perfmon_group_tokens_per_second", "Tokens per second summed over the group's ranks"),
}
GROUP_EXTREME_RANK = "perfmon_group_extreme_rank"
GROUP_RELAYS_DOWN = "perfmon_group_relays_down"


# The Prometheus families beside the table's per-rank ones (``tui/export/prometheus.py``): name, help.
MEMORY_FAMILY = ("perfmon_memory_bytes", "Memory of the fullest rank by kind (device, else host)")
COMM_BUSBW_FAMILY = ("perfmon_comm_busbw_bytes_per_second",
                     "Bus bandwidth per collective over the window (nccl-tests busbw)")
COMM_SECONDS_FAMILY = ("perfmon_comm_window_seconds", "Seconds in each collective over the window, all ranks")
VERDICT_FAMILY = ("perfmon_verdict", "The verdict: the job's bottleneck now")
GROUP_PREFIX = "perfmon_group_"       # every relay-tree family above starts so (a group relay keeps them unlabelled)

# What fixing each loss buys (``perfmon_analysis.gains``): the ``Gain`` field -> its Prometheus family
# (label ``loss``) and, where the trainer callbacks log it, its callback quantity (``gain_callback``).
GAIN_FAMILIES: dict[str, tuple[str, str]] = {
    "speedup_bound": ("perfmon_loss_speedup_bound", "Upper bound on the speedup if the loss were removed: "
                      "1 / (1 - share)"),
    "per_day": ("perfmon_loss_device_hours_per_day", "Device-hours the loss costs per day at the window's pace: "
                "ranks x 24 h x its share of wall time"),
    "device_hours": ("perfmon_loss_device_hours", "Device-hours the loss cost since the job started, at the "
                     "window's share"),
}
GAIN_CALLBACKS: dict[str, str] = {"speedup_bound": "speedup_bound", "per_day": "device_hours_per_day"}


def gain_callback(field: str, loss: str) -> str:
    """The callback key of one gain figure: ``perfmon/speedup_bound/<loss>``,
    ``perfmon/device_hours_per_day/<loss>``."""
    return callback_key(GAIN_CALLBACKS[field], loss)


def bottleneck_callback(bottleneck: str) -> str:
    """The callbacks' verdict flag: ``perfmon/bottleneck/<id>`` is 1 for the verdict now, 0 for those said before."""
    return callback_key("bottleneck", bottleneck)


# ``perfmon compare``'s table (``perfmon_analysis.compare``), in its order: (metric, label). Each row's
# worse direction is its metric's ``worse``; the losses' metrics follow it, labelled by their loss.
MEMORY_PEAK = Metric("memory_peak_bytes", Unit.COUNT, "Peak memory of the fullest rank, bytes (the report's "
                     "metrics.memory.peak_bytes)", job=lambda v: v.metrics.memory.peak_bytes, worse="up")
COMPARED: tuple[tuple[Metric, str], ...] = tuple(
    (MEMORY_PEAK if name == MEMORY_PEAK.name else next(m for m in METRICS if m.name == name), label)
    for name, label in (("step_time_median_s", "step time (median)"), ("samples_per_s", "samples/s"),
                        ("tokens_per_s", "tokens/s"), ("mfu", "MFU"), ("ettr", "ETTR"),
                        (MEMORY_PEAK.name, "memory peak"), ("device_busy", "device busy"),
                        ("loader_cpu", "loader CPU per worker"), ("loader_workers", "loader workers")))


ETTR = next(m for m in METRICS if m.name == "ettr")     # the HTML report's ETTR section reads it


def on(surface: Surface) -> tuple[Metric, ...]:
    """The metrics exported on ``surface``, in table order (the table read at call time)."""
    return tuple(m for m in METRICS if surface in m.surfaces)


def by_name(name: str) -> Metric | None:
    return next((m for m in METRICS if m.name == name), None)



def loss_metrics() -> dict[str, str]:
    """Loss id -> the name of the metric that states its share."""
    return {m.loss: m.name for m in METRICS if m.loss is not None}


def job_values(view: JobView) -> dict[str, Any]:
    """The report's ``metrics`` numbers: every job-scope metric of the table, None when unknown."""
    return {m.name: m.job_value(view) for m in on(Surface.REPORT) if m.job is not None}


def rank_values(rank: RankView) -> dict[str, Any]:
    """One rank's row numbers for the report."""
    return {m.name: m.rank_value(rank) for m in on(Surface.REPORT) if m.rank is not None}


def callback_values(view: JobView) -> dict[str, float]:
    """``perfmon/<name>`` -> value for the callbacks' scalar loggers; unknown values are left out."""
    out = {}
    for m in on(Surface.CALLBACKS):
        value = m.job_value(view)
        if value is not None:
            out[m.callback] = float(value)
    return out


def markdown() -> str:
    """The table as docs/metrics.md lists it (``python -m perfmon_analysis.metrics``)."""
    rows = ["| report key | unit | scope | Prometheus | callbacks | meaning |", "|---|---|---|---|---|---|"]
    for m in METRICS:
        scope = "/".join(s for s, fn in (("job", m.job), ("rank", m.rank)) if fn is not None)
        prom = f"`{m.prometheus}`" + (" (counter)" if m.counter else "") if Surface.PROMETHEUS in m.surfaces else ""
        callback = f"`{m.callback}`" if Surface.CALLBACKS in m.surfaces else ""
        rows.append(f"| `{m.name}` | {m.unit.name.lower()} | {scope} | {prom} | {callback} | {m.help} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
