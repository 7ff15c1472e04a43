"""The diagnosis flowchart: its questions, thresholds (each with its source) and exits.

Data only, plus ``compare`` and the ``Answer`` type: ``perfmon_analysis.verdict`` asks and walks
it, ``perfmon_analysis.explain`` words its outcomes, the flowchart screen and the panes draw its
answers. The order and every threshold's source: docs/verdict.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmon_analysis.comm_stats import STRAGGLER_RATIO

# -- thresholds (each with its source) ---------------------------------------------------------
# The usual first triage step: GPU utilization under 70% points at communication or data loading.
DEVICE_BUSY_MIN = 0.70
# PyTorch Profiler TB plugin DataLoader rule: DataLoader_avg / Total_avg > 0.05 (kineto tb_plugin
# profiler/data.py); perfmon counts the edge, >= 5%.
DATA_WAIT_MIN = 0.05
# One measured loss of 10% of the step opens the "starved" gate whatever busy says: a job losing a
# tenth of its time to one cause is never healthy. Same figure as the TB plugin
# communication rule below; device idle with no other cause qualifies from it too.
LOSS_MIN = 0.10
# TB plugin communication rule (communication / total > 0.10); perfmon judges the exposed part, >= 10%.
COMM_EXPOSED_MIN = 0.10
# NVIDIA Resiliency Extension straggler detection, gpu_relative_perf_threshold = 0.7 (relative score =
# fastest rank / this rank); defined in perfmon_analysis.stats so the view marks the rank.
STRAGGLER_RATIO_MAX = STRAGGLER_RATIO
# TB plugin memory rule: peak_mem > totalGlobalMem * 0.9, applied to the window's peak, never the
# lifetime one (a peak long gone says nothing about the job now).
MEMORY_PEAK_MAX = 0.90
# MFU below 30% with the device busy is inefficient compute: well under the reference bands of
# large training runs (Llama 3 38–43%, PaLM 46%).
MFU_MIN = 0.30
# TB plugin AMP rule fires when the tensor-core time share is 0; a small tolerance for sampling noise
# of the GPM counter.
TENSOR_ACTIVE_MIN = 0.01
# Loader workers (or the main thread inside the data wait when num_workers=0) on CPU for at least 30%
# of the wall time are computing, not waiting. An I/O-bound worker sits blocked in read() near 0
# (measured: 1% for the slow-read workload of tests/integration), while a CPU-bound one on a contended
# host gets well under a full core (measured: 42-96% for the heavy-transform workload on 2 cores shared
# with other jobs), so "≈100%" would miss it. Chosen here; tests pin both sides.
LOADER_CPU_BOUND = 0.30
# What the loader question measures: without workers the loading runs in the training process.
LOADER_MAIN = "main process (num_workers=0)"
LOADER_WORKERS = "of a core per worker"
# Host-device syncs: at least one per step in a job whose device idles points at .item()/.cpu() in
# the loop (synchronous device-to-host copies written into the model code).
SYNCS_PER_STEP_MIN = 1.0
# The host thread is "waiting" when most of its in-step stack samples find it off CPU (its CPU clock
# advanced by less than half the wall time since the previous sample): "most" is the majority. On a
# CPU job the unexplained loss is off-CPU time by its definition (the share is 1).
HOST_WAIT_MIN = 0.50
# CPU contention: the training thread runnable with no free core for 10% of the step or more, the same
# share at which a measured loss counts (LOSS_MIN); its cause is other processes or threads, not the step.
CPU_CONTENTION_MIN = 0.10
# Llama 3 reports ">90% effective training time" (arXiv 2407.21783 §3.3.4): less is time worth finding.
ETTR_MIN = 0.90
# Severe idleness: TB plugin "low GPU utilization" rule, gpu_utilization < 0.5.
DEVICE_BUSY_CRIT = 0.50
# Fragmentation finding: inactive-split bytes over 20% of reserved (10–20% is the usual range; the upper
# end keeps it quiet on healthy allocators).
FRAGMENTATION_MAX = 0.20
# NVML clock-event reasons that slow the clocks for power or heat, by their wire names
# (probe/gpu/nvml.py THROTTLE_BITS); idle, app_clocks, sync_boost, display_clocks are not throttling.
THROTTLE_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})

FINDINGS = ("step_gaps", "throttling", "fragmentation", "rank_restarted", "drops", "probe_warnings", "cpu_contention", "perfmon_cost",
            "data_wait", "comm_exposed", "device_idle")
# The share at which each step loss counts as a cause (and, when not the largest, a secondary finding).
LOSS_THRESHOLD = {"data_wait": DATA_WAIT_MIN, "comm_exposed": COMM_EXPOSED_MIN, "device_idle": LOSS_MIN}


@dataclass(frozen=True)
class Node:
    """One question of the flowchart. ``yes``/``no`` name an outcome (a ``Rule`` id; the root
    node shares the name "memory" with its outcome) or else the next node.

    ``op`` is how ``quantity`` is compared with ``threshold`` for a "yes"
    ("<", ">=", ">"); ``unit`` is "frac" (shown as %) or "ratio"/"count".
    """

    id: str
    question: str
    quantity: str
    threshold: float
    threshold_source: str
    yes: str
    no: str
    op: str = ">="
    unit: str = "frac"


@dataclass(frozen=True)
class Answer:
    """One flowchart question as the verdict's rule answered it: the one judgement of that number,
    which the verdict bar, the flowchart screen and every pane marker display.

    ``answer``: "yes" (the node's problem exit), "no", or None when the question could not be
    asked (not measured; or, with ``applies`` False, it does not apply to this job and the walk
    takes "no"). ``value`` and ``threshold``: the number judged and the line it was judged
    against; ``measure``: what ``value`` is, where the question measures it more than one way;
    ``decided_by``: the test that decided, where it was not ``value`` against ``threshold``
    alone (a larger loss, an OOM, a late rank), so a pane never shows a bare comparison
    that the answer contradicts. ``otherwise``: where the walk goes when the question could not
    be asked, if not ``UNMEASURED``'s exit (an unmeasured cause that the rest of the walk would
    blame on something else).
    """

    node: Node
    answer: str | None
    value: float | None
    threshold: float
    reason: str = ""
    applies: bool = True
    measure: str = ""
    decided_by: str = ""
    otherwise: str | None = None

    @property
    def asked(self) -> bool:
        return self.answer is not None


FLOWCHART: tuple[Node, ...] = (
    Node("memory", "OOM or allocator retries in the window, or the window's peak over 90% of the limit?",
         "memory_peak_frac", MEMORY_PEAK_MAX,
         "PyTorch Profiler TB plugin memory rule (peak > 0.9 x device memory), over the window",
         yes="memory", no="device_busy", op=">"),
    Node("device_busy", "Is the device starved: busy under 70%, or one measured loss 10% or more of the step?",
         "device_busy", DEVICE_BUSY_MIN,
         "common triage: GPU utilization < 70% points at communication or data loading; one loss >= 10%: "
         "perfmon loss accounting (docs/verdict.md)",
         yes="data_wait", no="mfu", op="<"),
    Node("data_wait", "Is waiting for the next batch the largest loss, at 5% or more of the step?",
         "data_wait_frac", DATA_WAIT_MIN, "PyTorch Profiler TB plugin DataLoader rule (> 5% of step time)",
         yes="loader_cpu", no="comm_exposed"),
    Node("loader_cpu", "Are the loader workers (or the main process) CPU-bound?", "loader_cpu", LOADER_CPU_BOUND,
         "perfmon: I/O-bound workers sit near 0% CPU, CPU-bound ones >= 30% even on a contended host",
         yes="data_preprocessing", no="data_loading"),
    Node("comm_exposed", "Is blocking on communication the largest loss, at 10% or more of the step?",
         "comm_exposed_frac", COMM_EXPOSED_MIN, "PyTorch Profiler TB plugin communication rule (> 10%)",
         yes="straggler", no="syncs"),
    Node("straggler", "Is one rank slower than the rest (fastest/slowest < 0.7)?",
         "compute_ratio", STRAGGLER_RATIO_MAX,
         "NVIDIA Resiliency Extension relative straggler score 0.7; HTA late-arrival straggler",
         yes="load_imbalance", no="communication", op="<", unit="ratio"),
    Node("syncs", "The device idles with no other measured cause: does every step force a host-device sync?",
         "syncs_per_step", SYNCS_PER_STEP_MIN,
         "synchronous device-to-host copies in the model code (.item(), .cpu()) idle the GPU", yes="host_sync",
         no="host_waiting",
         unit="count"),
    Node("host_waiting", "The host thread: is it off CPU (waiting) for most of the unexplained time?",
         "host_wait_frac", HOST_WAIT_MIN,
         "perfmon: in-step stack samples with the thread's CPU clock (off CPU = under half the wall time); "
         "a CPU job's unexplained loss is off-CPU time by definition",
         yes="host_wait", no="host_overhead"),
    Node("mfu", "Not starved: is MFU under 30% (or are the tensor cores idle)?", "mfu", MFU_MIN,
         "Llama 3 (arXiv 2407.21783) 38-43% MFU, PaLM (arXiv 2204.02311) 46%", yes="compute_efficiency",
         no="healthy",
         op="<"),
)
# Where the walk goes when a question cannot be answered. Never through the question's own
# exits: an unmeasured quantity decides nothing (docs/verdict.md "Unknown is unknown").
# * a screening question (is it memory? the loader? communication?) leaves that cause unchecked,
#   listed as not measured, and the walk asks the next question;
# * the gate "is the device starved?" cannot be passed: the outcome is ``not_measured``, which says
#   what is missing and what the measured losses do say;
# * the question that tells two causes of one measured loss apart (``DECIDES_BETWEEN``) ends at the
#   outcome that names the loss's family (data loading, communication, host overhead) and the
#   verdict says which causes it cannot tell apart;
#   (syncs not counted still asks whether the host waits, which the stack samples can tell);
# * MFU unknown ends at healthy: the device is busy and no measured loss is large; efficiency is
#   then listed as not measured.
UNMEASURED = {"memory": "device_busy", "device_busy": "not_measured", "data_wait": "comm_exposed",
              "loader_cpu": "data_loading", "comm_exposed": "syncs", "straggler": "communication",
              "syncs": "host_waiting", "host_waiting": "host_overhead", "mfu": "healthy"}
NODES: dict[str, Node] = {n.id: n for n in FLOWCHART}
ROOT = "memory"
# The last questions before an outcome: when one cannot be asked, the verdict says what it cannot tell apart.
DECIDES_BETWEEN = {"loader_cpu": "CPU-bound preprocessing from slow I/O",
                   "straggler": "a slow rank from slow communication",
                   "syncs": "host-device syncs from launch overhead or an unmeasured loss",
                   "host_waiting": "a host that waits (I/O, a lock, a service) from launch overhead"}


def compare(value: float, node: Node) -> bool:
    """Does ``value`` take the node's "yes" exit (the direction that names a problem)?

    The one definition: the verdict and the panes' judged numbers both use it."""
    if node.op == "<":
        return value < node.threshold
    if node.op == ">":
        return value > node.threshold
    return value >= node.threshold
