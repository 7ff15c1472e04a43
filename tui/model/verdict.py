"""The verdict: loss accounting walked through the diagnosis flowchart, one rule per outcome.

The chart follows the seed 000_774f81674ee2bc74 (常见瓶颈识别流程: GPU
utilization, memory, communication, data loading) in the order DESIGN §6
fixes: memory first; then "is the device starved?", which fires when busy is
under 70% or when any single measured loss (``tui.model.losses``) takes 10% of
the step; then the largest measured loss names the bottleneck (the others that
fired become secondary findings); then compute efficiency.

Unknown is unknown: a quantity that was not measured never picks an exit. A
question that cannot be asked is recorded with the reason; the walk goes on
with what is known, and where the last question before an outcome could not be
asked (loader CPU, per-rank compute, sync counts) the verdict names the measured
loss and says which causes it cannot tell apart (``Verdict.undecided``).

Each outcome is one ``Rule`` (id, label, the question and exit that lead to it,
the pane holding its evidence, headline and fixes); the TUI, the report and the
flowchart screen read that one table.

Pure: ``evaluate(view)`` depends only on the ``JobView``; ``VerdictTracker``
adds the two-agreeing-evaluations rule on top.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from tui.model.buffers import MIN_STEPS
from tui.model.losses import STEP_LOSSES, Loss, account, by_id
from tui.model.stats import STRAGGLER_RATIO
from tui.model.views import JobView, RankView

# -- thresholds (each with its source) ---------------------------------------------------------
# Seed 000 (常见瓶颈识别流程 step 1): "低利用率(<70%) → 可能是通信或数据加载瓶颈"; DESIGN §6.
DEVICE_BUSY_MIN = 0.70
# PyTorch Profiler TB plugin DataLoader rule: DataLoader_avg / Total_avg > 0.05 (kineto tb_plugin
# profiler/data.py, see research/analysis_anchors.md §2.2); DESIGN §6 uses >= 5%.
DATA_WAIT_MIN = 0.05
# DESIGN §6 (issue 11): one measured loss of 10% of the step opens the "starved" gate whatever busy says:
# a job losing a tenth of its time to one cause is never healthy. Same figure as the TB plugin
# communication rule below; device idle with no other cause qualifies from it too.
LOSS_MIN = 0.10
# TB plugin communication rule (analysis_anchors §11 step 3: C/T > 0.10); DESIGN §6: exposed comm >= 10%.
COMM_EXPOSED_MIN = 0.10
# NVIDIA Resiliency Extension straggler detection, gpu_relative_perf_threshold = 0.7 (relative score =
# fastest rank / this rank), analysis_anchors §7; defined in tui.model.stats so the view marks the rank.
STRAGGLER_RATIO_MAX = STRAGGLER_RATIO
# TB plugin memory rule: peak_mem > totalGlobalMem * 0.9 (analysis_anchors §2.2); DESIGN §6 applies it to
# the window's peak, never the lifetime one.
MEMORY_PEAK_MAX = 0.90
# DESIGN §6 [proposal in analysis_anchors §11.6]: MFU below 30% with the device busy is inefficient
# compute; reference bands Llama 3 38–43%, PaLM 46%.
MFU_MIN = 0.30
# TB plugin AMP rule fires when the tensor-core time share is 0 (analysis_anchors §2.2); a small
# tolerance for sampling noise of the GPM counter.
TENSOR_ACTIVE_MIN = 0.01
# Loader workers (or the main thread inside the data wait when num_workers=0) on CPU for at least 30%
# of the wall time are computing, not waiting. An I/O-bound worker sits blocked in read() near 0
# (measured: 1% for the slow-read workload of tests/integration), while a CPU-bound one on a contended
# host gets well under a full core (measured: 42-96% for the heavy-transform workload on 2 cores shared
# with other jobs), so "≈100%" (analysis_anchors §11.2) would miss it. Chosen here; tests pin both sides.
LOADER_CPU_BOUND = 0.30
# Host-device syncs: at least one per step in a job whose device idles points at .item()/.cpu() in
# the loop (seed 001 模型写法问题: "存在D2H的同步拷贝"; analysis_anchors §8).
SYNCS_PER_STEP_MIN = 1.0
# Llama 3 reports ">90% effective training time" (arXiv 2407.21783 §3.3.4), seed 001's ETTR status quo.
ETTR_MIN = 0.90
# Severe idleness: TB plugin "low GPU utilization" rule, gpu_utilization < 0.5 (analysis_anchors §2.2).
DEVICE_BUSY_CRIT = 0.50
# Fragmentation finding: inactive-split bytes over 20% of reserved [proposal: analysis_anchors §11.1
# suggests 10–20%; the upper end keeps it quiet on healthy allocators].
FRAGMENTATION_MAX = 0.20
# NVML clock-event reasons that slow the clocks for power or heat, by their wire names
# (probe/gpu/nvml.py THROTTLE_BITS); idle, app_clocks, sync_boost, display_clocks are not throttling.
THROTTLE_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})

FINDINGS = ("step_gaps", "throttling", "fragmentation", "rank_restarted", "drops", "probe_warnings",
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


FLOWCHART: tuple[Node, ...] = (
    Node("memory", "OOM or allocator retries in the window, or the window's peak over 90% of the limit?",
         "memory_peak_frac", MEMORY_PEAK_MAX,
         "PyTorch Profiler TB plugin memory rule (peak > 0.9 x device memory), over the window",
         yes="memory", no="device_busy", op=">"),
    Node("device_busy", "Is the device starved: busy under 70%, or one measured loss 10% or more of the step?",
         "device_busy", DEVICE_BUSY_MIN,
         "seed 000 flowchart step 1 (GPU utilization < 70%); one loss >= 10%: perfmon loss accounting "
         "(docs/verdict.md)",
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
         "seed 001 (D2H sync copies in the model code idle the GPU)", yes="host_sync", no="host_overhead",
         unit="count"),
    Node("mfu", "Not starved: is MFU under 30% (or are the tensor cores idle)?", "mfu", MFU_MIN,
         "Llama 3 (arXiv 2407.21783) 38-43% MFU, PaLM (arXiv 2204.02311) 46%", yes="compute_efficiency",
         no="healthy",
         op="<"),
)
NODES: dict[str, Node] = {n.id: n for n in FLOWCHART}
ROOT = "memory"
# The last questions before an outcome: when one cannot be asked, the verdict says what it cannot tell apart.
DECIDES_BETWEEN = {"loader_cpu": "CPU-bound preprocessing from slow I/O",
                   "straggler": "a slow rank from slow communication",
                   "syncs": "host-device syncs from launch overhead or an unmeasured loss"}


@dataclass(frozen=True)
class Verdict:
    """The answer for one view.

    ``path``: node ids walked; ``evidence``: the numbers behind each answer, plus
    ``skipped`` {node: reason} for questions that could not be asked;
    ``losses``: the window's loss accounting; ``undecided``: {node: reason} where
    the outcome's own question could not be asked (the verdict names the loss, not
    its cause); ``findings``: secondary findings, each a dict with ``id`` (see
    FINDINGS); ``pending``: a different bottleneck seen once, waiting for
    confirmation (tracker only).
    """

    bottleneck: str
    severity: str                    # "ok" | "info" | "warn" | "crit"
    headline: str
    path: list[str]
    evidence: dict[str, Any]
    suggestions: list[str]
    straggler_rank: int | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    pending: str | None = None
    losses: tuple[Loss, ...] = ()
    undecided: dict[str, str] = field(default_factory=dict)

    @property
    def rule(self) -> "Rule":
        return RULES[self.bottleneck]

    def as_json(self) -> dict[str, Any]:
        """The report's ``verdict`` object (DESIGN §7); ``unknown`` maps each quantity that was not
        measured to why."""
        skipped = self.evidence.get("skipped", {}) if isinstance(self.evidence, dict) else {}
        return {"bottleneck": self.bottleneck, "label": RULES[self.bottleneck].label, "severity": self.severity,
                "headline": self.headline, "path": list(self.path), "evidence": dict(self.evidence),
                "suggestions": list(self.suggestions), "straggler_rank": self.straggler_rank,
                "losses": [x.as_json() for x in self.losses], "undecided": dict(self.undecided),
                "unknown": {NODES[n].quantity: why for n, why in skipped.items() if n in NODES}}


# -- measuring each node -----------------------------------------------------------------------
@dataclass(frozen=True)
class _Answer:
    value: Any             # the quantity (None when unknown)
    fired: bool | None     # None = could not be asked
    reason: str = ""       # why it was skipped, or a detail for the evidence
    applies: bool = True   # False: the question does not apply to this job (its "no" exit is the answer)


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def compare(value: float, node: Node) -> bool:
    """Does ``value`` take the node's "yes" exit (the direction that names a problem)?

    The one definition: the verdict and the panes' judged numbers both use it."""
    if node.op == "<":
        return value < node.threshold
    if node.op == ">":
        return value > node.threshold
    return value >= node.threshold


def qualifying(losses: tuple[Loss, ...]) -> list[Loss]:
    """Step losses measured at or over their own threshold, largest first."""
    out = [x for x in losses if x.id in LOSS_THRESHOLD and x.share is not None and x.share >= LOSS_THRESHOLD[x.id]]
    return sorted(out, key=lambda x: -(x.share or 0.0))


def _largest(loss: Loss, losses: tuple[Loss, ...]) -> bool:
    """Is this measured loss over its threshold and at least as large as every other one that is?"""
    fired = qualifying(losses)
    return loss in fired and all((loss.share or 0.0) >= (x.share or 0.0) for x in fired)


def _ask_memory(v: JobView, node: Node, losses: tuple[Loss, ...]) -> _Answer:
    m = v.metrics.memory
    if m.ooms:
        return _Answer(m.peak_frac, True, f"{m.ooms} out-of-memory error(s) in the window")
    if m.alloc_retries_rising:
        return _Answer(m.peak_frac, True, f"allocator retries rising ({m.alloc_retries} so far)")
    if m.peak_frac is None:
        return _Answer(None, None, "memory limit or peak not reported")
    return _Answer(m.peak_frac, compare(m.peak_frac, node))


def _ask_device_busy(v: JobView, node: Node, losses: tuple[Loss, ...]) -> _Answer:
    busy = v.metrics.device_busy
    known = [x for x in losses if x.id in STEP_LOSSES and x.share is not None]
    big = max(known, key=lambda x: x.share or 0.0, default=None)
    if busy is None and big is None:
        return _Answer(None, None, "neither device activity nor any loss measured in the window")
    low = busy is not None and compare(busy, node)
    lossy = big is not None and (big.share or 0.0) >= LOSS_MIN
    if lossy and not low:
        why = f"{big.label} is {_pct(big.share)} of the step (>= {_pct(LOSS_MIN)})"
    else:
        why = v.metrics.device_busy_source or ""
    return _Answer(busy, low or lossy, why)


def _ask_data_wait(v: JobView, node: Node, losses: tuple[Loss, ...]) -> _Answer:
    d = by_id(losses)["data_wait"]
    if d.share is None:
        return _Answer(None, None, "loader wait not measured (wrap the loader: mon.loader(...))")
    return _Answer(d.share, _largest(d, losses))


def _ask_loader_cpu(v: JobView, node: Node, losses: tuple[Loss, ...]) -> _Answer:
    m = v.metrics
    if m.loader_workers == 0 or (m.loader_workers is None and m.loader_cpu is None):
        if m.data_cpu_frac is not None:
            return _Answer(m.data_cpu_frac, compare(m.data_cpu_frac, node),
                           "num_workers=0: main-process CPU share of the data wait")
        return _Answer(None, None, "loader CPU not measured: cannot tell preprocessing from I/O")
    if m.loader_cpu is None:
        return _Answer(None, None, "loader worker CPU not measured: cannot tell preprocessing from I/O")
    return _Answer(m.loader_cpu, compare(m.loader_cpu, node), f"{m.loader_workers} workers")


def _ask_comm_exposed(v: JobView, node: Node, losses: tuple[Loss, ...]) -> _Answer:
    c = by_id(losses)["comm_exposed"]
    if c.share is None:
        if v.metrics.comm_frac is not None:
            return _Answer(None, None, f"communication takes {_pct(v.metrics.comm_frac)} of the step but its "
                                       "exposed part is not measured (NCCL: PERFMON_NCCL_TIMING=1)")
        return _Answer(None, None, "collectives not measured (mon.watch(model=ddp_model) measures them)")
    return _Answer(c.share, _largest(c, losses), "estimated" if v.metrics.comm_estimated else "")


def _ask_straggler(v: JobView, node: Node, losses: tuple[Loss, ...]) -> _Answer:
    m = v.metrics
    if m.compute_ratio is None:
        if v.world_size <= 1 and len(v.ranks) <= 1:
            return _Answer(None, None, "one rank: there is no peer to wait for", applies=False)
        return _Answer(None, None, "needs compute time of two or more ranks")
    if m.straggler_by == "arrival":
        return _Answer(m.compute_ratio, True, f"compute is even, but rank {v.straggler_rank} reaches the "
                                              f"collective last (arrival ratio {m.arrival_ratio:.2f})")
    return _Answer(m.compute_ratio, compare(m.compute_ratio, node))


def _ask_host_sync(v: JobView, node: Node, losses: tuple[Loss, ...]) -> _Answer:
    if v.device_type != "cuda":   # reached only when no measured loss explains a low busy share
        return _Answer(None, None, "CPU job: there is no host-device sync to find")
    s = v.metrics.syncs_per_step
    if s is None:
        return _Answer(None, None, "syncs not counted (opt-in: watch(syncs=True) or PERFMON_SYNCS=1)")
    if not compare(s, node) and by_id(losses)["device_idle"].share is None:
        return _Answer(None, None, "no measured loss explains the low busy share (device idle not measured)")
    return _Answer(s, compare(s, node))


def _ask_mfu(v: JobView, node: Node, losses: tuple[Loss, ...]) -> _Answer:
    mfu = v.metrics.mfu
    if mfu is not None:
        return _Answer(mfu, compare(mfu, node), _peak_note(v))
    tensor = _tensor_active(v) if v.device_type == "cuda" else None
    if tensor is not None:
        return _Answer(tensor, tensor < TENSOR_ACTIVE_MIN, "tensor-core activity (MFU unknown)")
    if v.device_type != "cuda":
        return _Answer(None, None, "CPU job: no peak FLOP/s known (set PERFMON_PEAK_TFLOPS for an MFU)")
    return _Answer(None, None, "MFU unknown: pass flops= to mon.step() or mon.watch(model=...)")


def _peak_note(v: JobView) -> str:
    """'of a 989 TFLOP/s peak (device table, bf16)': the number the MFU divides by, and whence."""
    m = v.metrics
    if m.peak_flops is None:
        return ""
    return f"of a {m.peak_flops / 1e12:.3g} TFLOP/s peak ({m.peak_source or 'source unknown'})"


_ASK: dict[str, Callable[[JobView, Node, tuple[Loss, ...]], _Answer]] = {
    "memory": _ask_memory, "device_busy": _ask_device_busy, "data_wait": _ask_data_wait,
    "loader_cpu": _ask_loader_cpu, "comm_exposed": _ask_comm_exposed, "straggler": _ask_straggler,
    "syncs": _ask_host_sync, "mfu": _ask_mfu,
}


def _tensor_active(v: JobView) -> float | None:
    vals = [g.get("tensor_active") for gpus in v.gpus.values() for g in gpus
            if isinstance(g, dict) and isinstance(g.get("tensor_active"), (int, float))]
    return sum(vals) / len(vals) if vals else None


# -- evaluation --------------------------------------------------------------------------------
def walk(view: JobView, losses: tuple[Loss, ...] | None = None) -> tuple[str, list[str], dict[str, Any]]:
    """Walk the chart: (outcome, node ids visited, evidence).

    A question that cannot be asked is listed under ``evidence["skipped"]`` and
    the walk goes on with what is known; when it was the outcome's own question
    (``DECIDES_BETWEEN``), ``evidence["undecided"]`` says what is left open.
    """
    losses = account(view.metrics, view.device_type) if losses is None else losses
    path: list[str] = []
    evidence: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    undecided: dict[str, str] = {}
    node_id = ROOT
    while True:
        node = NODES[node_id]
        path.append(node_id)
        ans = _ASK[node_id](view, node, losses)
        if ans.fired is None:
            skipped[node_id] = ans.reason
            if ans.applies and node_id in DECIDES_BETWEEN:
                undecided[node_id] = ans.reason
        else:
            evidence[node.quantity] = _round(ans.value)
            if ans.reason:
                evidence.setdefault("notes", {})[node_id] = ans.reason
        node_id = node.yes if ans.fired else node.no
        if node_id in RULES:
            break
    if skipped:
        evidence["skipped"] = skipped
    if undecided:
        evidence["undecided"] = undecided
    return node_id, path, evidence


def evaluate(view: JobView) -> Verdict:
    """The verdict for one view (pure)."""
    losses = account(view.metrics, view.device_type)
    if view.warming_up:
        steps = max((r.window_steps for r in view.ranks), default=0)
        return Verdict("warming_up", "info", f"Warming up: {steps} of {MIN_STEPS} steps seen, no verdict yet",
                       [], {"steps": view.metrics.steps}, [], None, _findings(view), losses=losses)
    leaf, path, evidence = walk(view, losses)
    m = view.metrics
    straggler = view.straggler_rank if leaf == "load_imbalance" else None
    for key, value in (("step_time_median_s", m.step_time_median_s), ("device_busy", m.device_busy),
                       ("data_wait_frac", m.data_wait_frac), ("comm_exposed_frac", m.comm_exposed_frac)):
        evidence.setdefault(key, _round(value))
    rule = RULES[leaf]
    headline, suggestions, extra = rule.explain(view, straggler)
    undecided = evidence.get("undecided", {})
    for node_id in undecided:
        headline += f"; cannot tell {DECIDES_BETWEEN[node_id]} ({_short_reason(undecided[node_id])})"
    evidence.update(extra)
    findings = _loss_findings(rule, losses) + _findings(view)
    return Verdict(leaf, _severity(leaf, view, losses), headline, path, evidence, suggestions, straggler, findings,
                   losses=losses, undecided=dict(undecided))


def _short_reason(reason: str) -> str:
    return reason.split(": cannot tell")[0]


def _round(x: Any) -> Any:
    return round(x, 4) if isinstance(x, float) else x


def _loss_findings(rule: "Rule", losses: tuple[Loss, ...]) -> list[dict[str, Any]]:
    """Measured losses over their threshold that the outcome does not name."""
    return [{"id": x.id, "share": _round(x.share), "source": x.source,
             "message": f"{x.label} also takes {_pct(x.share)} of each step"}
            for x in qualifying(losses) if x.id != rule.loss]


def _severity(leaf: str, v: JobView, losses: tuple[Loss, ...]) -> str:
    m = v.metrics
    if leaf == "healthy":
        return "ok"
    if leaf in ("warming_up", "compute_efficiency"):
        return "info"
    if leaf == "memory":
        return "crit" if m.memory.ooms else "warn"
    named = by_id(losses).get(RULES[leaf].loss or "")
    if (m.device_busy is not None and m.device_busy < DEVICE_BUSY_CRIT) or \
            (named is not None and named.share is not None and named.share >= 1.0 - DEVICE_BUSY_CRIT):
        return "crit"
    return "warn"


def _gb(nbytes: float | None) -> str:
    return "?" if nbytes is None else f"{nbytes / 1e9:.1f} GB"


def _rate(bps: float | None) -> str:
    if bps is None:
        return "? B/s"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} B/s"


def _step(m: Any) -> str:
    return f"{m.step_time_median_s * 1000:.0f} ms" if m.step_time_median_s else "?"


# -- the outcomes: headline and fixes that quote the job's own numbers --------------------------
Explained = tuple[str, list[str], dict[str, Any]]


def _explain_warming_up(v: JobView, straggler: int | None) -> Explained:
    return "Warming up", [], {}


def _explain_memory(v: JobView, straggler: int | None) -> Explained:
    mem = v.metrics.memory
    what = (f"{mem.ooms} out-of-memory error(s)" if mem.ooms else
            "allocator retries rising" if mem.alloc_retries_rising else
            f"{'window' if mem.source == 'device' else 'recent'} peak {_gb(mem.peak_bytes)} is "
            f"{_pct(mem.peak_frac)} of the {_gb(mem.limit_bytes)} limit")
    where = "device memory" if mem.source == "device" else "host RSS"
    fixes = ["activation checkpointing (torch.utils.checkpoint) on the largest blocks",
             "mixed precision (bf16 autocast) to halve activations",
             "smaller micro-batch with gradient accumulation to keep the global batch",
             "shard optimizer state and gradients (FSDP / ZeRO)"]
    if mem.source == "device":
        fixes.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation")
    return f"Memory, {where}: {what}", fixes, {"memory_rank": mem.rank}


def _explain_data_preprocessing(v: JobView, straggler: int | None) -> Explained:
    m = v.metrics
    w = m.loader_workers
    who = (f"the main process spends {_pct(m.data_cpu_frac)} of the wait on CPU (num_workers=0)"
           if not w else f"its {w} workers are CPU-bound ({_pct(m.loader_cpu)} of a core each)" if w > 1
           else f"its worker is CPU-bound ({_pct(m.loader_cpu)} of a core)")
    fixes = ([f"raise num_workers from {w} (up to the free cores)"] if w else
             ["use DataLoader(num_workers=N): loading runs in the training process now"])
    fixes += ["move per-sample transforms to the device or batch them",
              "preprocess offline (cache decoded/tokenized data)",
              "persistent_workers=True so workers are not re-forked every epoch"]
    return f"Data preprocessing: {_pct(m.data_wait_frac)} of each step waits for the loader; {who}", fixes, {}


def _explain_data_loading(v: JobView, straggler: int | None) -> Explained:
    m = v.metrics
    w = m.loader_workers
    fixes = [f"raise num_workers from {w} and prefetch_factor to hide read latency" if w is not None
             else "raise num_workers and prefetch_factor to hide read latency",
             "pin_memory=True and non_blocking copies",
             "persistent_workers=True", "faster or local storage; cache the dataset in RAM or on local SSD"]
    measured = m.loader_cpu is not None or m.data_cpu_frac is not None
    cpu = f"; not CPU-bound (workers at {_pct(m.loader_cpu)} CPU)" if m.loader_cpu is not None else \
        "; not CPU-bound" if measured else ""
    return f"Data loading: {_pct(m.data_wait_frac)} of each step waits for the loader{cpu}", fixes, {}


def _explain_communication(v: JobView, straggler: int | None) -> Explained:
    m = v.metrics
    op = (m.comm_op or "collective").replace("_", "-")
    bw = f" at {_rate(m.busbw)} busbw" if m.busbw else ""
    est = " (estimated)" if m.comm_estimated else ""
    fixes = [f"overlap {op} with backward (DDP bucket_cap_mb; no sync inside backward)",
             "gradient accumulation with no_sync() to communicate every N micro-batches",
             "gradient compression hooks (bf16/fp16 compress, PowerSGD)"]
    if m.samples_per_s is not None and m.step_time_median_s:
        per_step = m.samples_per_s * m.step_time_median_s / max(1, v.world_size)
        fixes.append(f"larger per-rank batch (about {per_step:.0f} samples per rank per step now)")
    fixes.append("check the interconnect: busbw should approach the link's bandwidth")
    return (f"Communication: exposed {op} is {_pct(m.comm_exposed_frac)} of the step{bw}{est}", fixes,
            {"busbw": _round(m.busbw), "comm_op": m.comm_op})


def _explain_load_imbalance(v: JobView, straggler: int | None) -> Explained:
    m = v.metrics
    op = (m.comm_op or "collective").replace("_", "-")
    row = _rank_row(v.ranks, straggler) if straggler is not None else None
    if m.straggler_by == "arrival":
        own = _pct(row.comm_exposed_frac) if row else "?"
        gap = f"; it loses {_pct(m.gap_frac)} between steps" if m.gap_frac and m.gap_frac >= 0.05 else ""
        headline = (f"Load imbalance: rank {straggler} arrives last at {op}; the others wait "
                    f"{_pct(m.comm_exposed_frac)} of the step for it (it waits {own}){gap}")
        fixes = [f"find what delays rank {straggler} outside its compute: work between steps, logging, "
                 "checkpointing on that rank only, its data path",
                 f"check rank {straggler}'s host for other processes or throttling"]
        return headline, fixes, {"straggler_rank": straggler, "arrival_ratio": _round(m.arrival_ratio)}
    fast = min((r for r in v.ranks if r.compute_s is not None), key=lambda r: r.compute_s, default=None)
    slow_ms = f"{row.compute_s * 1000:.0f} ms" if row and row.compute_s else "?"
    fast_ms = f"{fast.compute_s * 1000:.0f} ms" if fast and fast.compute_s else "?"
    headline = (f"Load imbalance: rank {straggler} computes {slow_ms}/step vs {fast_ms} on rank "
                f"{fast.rank if fast else '?'}; the others wait {_pct(m.comm_exposed_frac)} in {op}")
    fixes = [f"find what makes rank {straggler} slower: its data shard, sequence lengths, host load",
             "balance work per rank (bucket samples by length, even shards)",
             f"check rank {straggler}'s host for other processes or throttling"]
    return headline, fixes, {"straggler_rank": straggler, "compute_ratio": _round(m.compute_ratio)}


def _idle_text(v: JobView) -> str:
    idle = next((x.share for x in account(v.metrics, v.device_type) if x.id == "device_idle"), None)
    lead = v.metrics.host_lead_s
    # the starvation signal: a host that keeps only a few ms ahead of the GPU cannot keep it fed
    ahead = f" (the host runs {lead * 1000:.1f} ms ahead of it)" if lead is not None else ""
    return f"the device idles {_pct(idle)} of each step with no other measured cause{ahead}"


def _explain_host_sync(v: JobView, straggler: int | None) -> Explained:
    m = v.metrics
    site = next((s.get("sync_site") for r in v.steps_recent.values() for s in reversed(r) if s.get("sync_site")),
                None)
    where = f" (most at {site})" if site else ""
    return (f"Host-device sync: {_idle_text(v)}; {m.syncs_per_step:.1f} syncs per step{where}",
            ["remove .item() / .cpu() / print(tensor) from the step; log every N steps",
             "keep metrics on the device and read them asynchronously (non_blocking=True into pinned memory)"],
            {"syncs_per_step": _round(m.syncs_per_step)})


def _explain_host_overhead(v: JobView, straggler: int | None) -> Explained:
    m = v.metrics
    return (f"Host overhead: {_idle_text(v)} (busy {_pct(m.device_busy)} of a {_step(m)} step); "
            "the CPU cannot feed it",
            ["larger batch per step", "torch.compile or CUDA graphs to cut launch overhead",
             "fuse small ops; avoid Python work per micro-op"], {})


def _explain_compute_efficiency(v: JobView, straggler: int | None) -> Explained:
    m = v.metrics
    if m.mfu is not None:
        what = f"MFU {_pct(m.mfu)}" + (f" {_peak_note(v)}" if m.peak_flops else "")
        extra: dict[str, Any] = {"mfu": _round(m.mfu)}
    else:
        what = f"tensor cores {_pct(_tensor_active(v))} active"
        extra = {}
    return (f"Compute efficiency: device busy {_pct(m.device_busy)} but {what}",
            ["bf16 autocast (torch.autocast('cuda', dtype=torch.bfloat16))",
             "torch.backends.cuda.matmul.allow_tf32 = True for fp32 matmuls",
             "fused kernels (fused AdamW, flash attention) and torch.compile", "larger batch per step"], extra)


def _explain_healthy(v: JobView, straggler: int | None) -> Explained:
    m = v.metrics
    busy = f"{v.device_type.upper()} busy {_pct(m.device_busy)}"
    note = f" {_peak_note(v)}" if m.peak_flops else ""
    extra = f", MFU {_pct(m.mfu)}{note}" if m.mfu is not None else ""
    return f"Healthy: {busy} of a {_step(m)} step, no measured loss of 10% or more{extra}", [], {}


@dataclass(frozen=True)
class Rule:
    """One outcome of the chart, owning everything said about it.

    ``node``/``exit``: the question and answer that lead here (the question's
    quantity, threshold and source are the rule's test); ``loss``: the loss in
    ``tui.model.losses`` it names, if any; ``pane``: the pane that shows its
    evidence (highlighted in the TUI); ``explain``: headline, fixes and extra
    evidence from the view.
    """

    id: str
    label: str
    node: str | None
    exit: str | None
    pane: str | None
    explain: Callable[[JobView, int | None], Explained]
    loss: str | None = None

    @property
    def question(self) -> Node | None:
        return NODES.get(self.node) if self.node else None


RULES_TABLE: tuple[Rule, ...] = (
    Rule("warming_up", "WARMING UP", None, None, None, _explain_warming_up),
    Rule("memory", "MEMORY", "memory", "yes", "memory", _explain_memory),
    Rule("data_loading", "DATA LOADING", "loader_cpu", "no", "data", _explain_data_loading, loss="data_wait"),
    Rule("data_preprocessing", "DATA PREPROCESSING", "loader_cpu", "yes", "data", _explain_data_preprocessing,
         loss="data_wait"),
    Rule("communication", "COMMUNICATION", "straggler", "no", "comm", _explain_communication, loss="comm_exposed"),
    Rule("load_imbalance", "LOAD IMBALANCE", "straggler", "yes", "ranks", _explain_load_imbalance,
         loss="comm_exposed"),
    Rule("host_sync", "HOST-DEVICE SYNC", "syncs", "yes", "timeline", _explain_host_sync, loss="device_idle"),
    Rule("host_overhead", "HOST OVERHEAD", "syncs", "no", "timeline", _explain_host_overhead, loss="device_idle"),
    Rule("compute_efficiency", "COMPUTE EFFICIENCY", "mfu", "yes", "device", _explain_compute_efficiency),
    Rule("healthy", "HEALTHY", "mfu", "no", None, _explain_healthy),
)
RULES: dict[str, Rule] = {r.id: r for r in RULES_TABLE}
BOTTLENECKS: tuple[str, ...] = tuple(r.id for r in RULES_TABLE)


def label(bottleneck: str) -> str:
    """The outcome's display label (one spelling for the bar, the report and the flowchart)."""
    rule = RULES.get(bottleneck)
    return rule.label if rule else bottleneck.upper().replace("_", " ")


def _rank_row(ranks: list[RankView], rank: int) -> RankView | None:
    return next((r for r in ranks if r.rank == rank), None)


def _findings(v: JobView) -> list[dict[str, Any]]:
    """Secondary findings; each dict has ``id`` and its numbers."""
    out: list[dict[str, Any]] = []
    m = v.metrics
    gaps_now = m.gap_frac is not None and m.gap_frac >= 1.0 - ETTR_MIN
    if (m.ettr is not None and m.ettr < ETTR_MIN) or gaps_now:
        pauses = [e for e in v.events if e.get("name") in ("checkpoint", "eval", "evaluation", "save", "pause")]
        lost = f"ETTR {_pct(m.ettr)}" if m.ettr is not None and m.ettr < ETTR_MIN else \
            f"{_pct(m.gap_frac)} of recent time"
        out.append({"id": "step_gaps", "ettr": _round(m.ettr), "gap_frac": _round(m.gap_frac),
                    "events": len(pauses),
                    "message": f"{lost}: time between steps is lost to "
                               f"{'checkpoints/evaluation' if pauses else 'pauses or stalls'}"})
    throttled = sorted({(rank, g.get("index"), reason) for rank, gpus in v.gpus.items() for g in gpus
                        if isinstance(g, dict) for reason in (g.get("throttle") or []) if reason in THROTTLE_REASONS})
    if throttled:
        out.append({"id": "throttling", "gpus": [{"rank": r, "index": i, "reason": why} for r, i, why in throttled],
                    "message": f"{len(throttled)} GPU clock throttle reason(s) active (power/thermal)"})
    mem = m.memory
    if mem.fragmentation_bytes is not None and mem.reserved_bytes:
        frac = mem.fragmentation_bytes / mem.reserved_bytes
        if frac > FRAGMENTATION_MAX:
            out.append({"id": "fragmentation", "fraction": round(frac, 4), "bytes": mem.fragmentation_bytes,
                        "message": f"{_pct(frac)} of reserved memory is fragmented: try expandable_segments:True"})
    for r in v.ranks:
        if r.generation > 0:
            out.append({"id": "rank_restarted", "rank": r.rank, "generation": r.generation, "restart": r.restart,
                        "pid": r.pid, "message": f"rank {r.rank} restarted (generation {r.generation}, pid {r.pid})"})
    if v.drops_total:
        out.append({"id": "drops", "count": v.drops_total,
                    "message": f"{v.drops_total} records dropped on the way; numbers may have holes"})
    probe_warning = _probe_warnings(v.events)
    if probe_warning is not None:
        out.append(probe_warning)
    return out


def _probe_warnings(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The probe's own counted failures (``warning`` events with ``source: perfmon``, each carrying
    the running ``count`` for its ``where``): the newest count per rank and place, summed."""
    latest: dict[tuple[Any, str], dict[str, Any]] = {}
    for e in events:
        if e.get("name") == "warning" and e.get("source") == "perfmon":
            latest[(e.get("rank"), str(e.get("where") or "?"))] = e
    if not latest:
        return None
    total = sum(int(e.get("count") or 1) for e in latest.values())
    where = sorted({w for _, w in latest})
    return {"id": "probe_warnings", "count": total, "where": where,
            "message": f"the probe counted {total} failure(s) of its own ({', '.join(where)}): "
                       "numbers from those parts may be missing"}


class VerdictTracker:
    """Hysteresis: a different bottleneck replaces the shown one only after two evaluations in a row
    agree on it. While the bottleneck stays the same the numbers refresh every evaluation."""

    def __init__(self) -> None:
        self.current: Verdict | None = None
        self._candidate: str | None = None

    def update(self, view: JobView) -> Verdict:
        new = evaluate(view)
        cur = self.current
        if cur is not None and new.bottleneck == cur.bottleneck:
            self._candidate = None
            self.current = new
            return new
        if (cur is None and new.bottleneck == "warming_up") or self._candidate == new.bottleneck:
            self._candidate = None
            self.current = new
            return new
        self._candidate = new.bottleneck
        shown = cur or Verdict("warming_up", "info", "Warming up: confirming the first verdict", [], {}, [])
        self.current = shown
        return dataclasses.replace(shown, pending=new.bottleneck, findings=new.findings)
