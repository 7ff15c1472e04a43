"""The verdict: loss accounting walked through the diagnosis flowchart, one rule per outcome.

The chart asks the usual triage questions (memory, GPU utilization, data loading,
communication) in this order (docs/verdict.md): memory first; then "is the device
starved?", which fires when busy is under 70% or when any single measured loss
(``perfmon_analysis.losses``) takes 10% of the step; then the largest measured loss
names the bottleneck (the others that fired become secondary findings); then compute
efficiency.

Every question is answered once per evaluation (``ask``), on the walk's path or not;
``Verdict.answers`` is that one judgement of each number, which the panes draw
instead of comparing numbers with thresholds themselves.

Unknown is unknown: a quantity that was not measured never picks an exit. A
question that cannot be asked is recorded with the reason; the walk goes on
with what is known, and where the last question before an outcome could not be
asked (loader CPU, per-rank compute, sync counts) the verdict names the measured
loss and says which causes it cannot tell apart (``Verdict.undecided``).

Each outcome is one ``Rule`` (id, label, the question and exit that lead to it,
the pane holding its evidence, headline and fixes); the TUI, the report and the
flowchart screen read that one table. The questions and thresholds live in
``perfmon_analysis.flowchart``, the wording of each outcome in ``perfmon_analysis.explain``.

Pure: ``evaluate(view)`` depends only on the ``JobView``; ``VerdictTracker``
adds the two-agreeing-evaluations rule on top.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from perfmon_analysis import units
from perfmon_analysis.buffers import MIN_STEPS
from perfmon_analysis.losses import STEP_LOSSES, Loss, account, by_id
from perfmon_analysis.explain import (Explain, explain_communication, explain_compute_efficiency, explain_data_loading,
                               explain_data_preprocessing, explain_healthy, explain_host_overhead, explain_host_sync,
                               explain_host_wait, explain_load_imbalance, explain_memory, explain_not_measured,
                               explain_stuck, explain_warming_up, gaps_lost, peak_note, round4 as _round,
                               tensor_active, where_text)
from perfmon_analysis.explain import findings as secondary_findings  # beside the named outcome
from perfmon_analysis.flowchart import (DECIDES_BETWEEN, DEVICE_BUSY_CRIT, LOADER_MAIN, LOADER_WORKERS, LOSS_MIN,
                                        LOSS_THRESHOLD, NODES, ROOT, TENSOR_ACTIVE_MIN, UNMEASURED, Answer, Node,
                                        compare)
from perfmon_analysis.gains import Gains, estimate as estimate_gains
from perfmon_analysis.stuck import StuckDiagnosis
from perfmon_analysis.views import JobView, WhereLine, WhereTable

WHERE_TOP = 5     # lines of ``verdict.where`` in the report

@dataclass(frozen=True)
class Verdict:
    """The answer for one view.

    ``path``: node ids walked; ``answers``: every question's answer (on the path or not), the
    judgement the panes show; ``evidence``: the numbers behind each answer, plus
    ``skipped`` {node: reason} for questions that could not be asked;
    ``losses``: the window's loss accounting; ``gains``: what removing each would buy;
    ``undecided``: {node: reason} where the outcome's own question could not be asked (the verdict names the loss, not
    its cause); ``findings``: secondary findings, each a dict with ``id`` (see
    FINDINGS); ``pending``: a different bottleneck seen once, waiting for
    confirmation (tracker only); ``where``: the window's in-step stack samples
    per user line (None when no rank sent any).
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
    stuck: StuckDiagnosis | None = None
    straggler_host: str | None = None    # the node of ``straggler_rank`` (the report's verdict.straggler_host)
    where: WhereTable | None = None
    answers: dict[str, Answer] = field(default_factory=dict)
    gains: Gains | None = None           # what removing each loss would buy (perfmon_analysis.gains)

    @property
    def rule(self) -> "Rule":
        return RULES[self.bottleneck]

    def steps(self) -> list[Answer]:
        """Each question on the path as the walk answered it."""
        return [self.answers[n] for n in self.path if n in self.answers]

    @property
    def finding_ids(self) -> list[str]:
        return [str(f["id"]) for f in self.findings if f.get("id")]

    def gain_headline(self, price: float | None = None, compact: bool = False) -> str | None:
        """What fixing the named loss buys ('fixing it: up to 1.4× faster, 3.1 GPU-h/day'); a healthy
        job that loses time between steps is priced on that time."""
        if self.gains is None or self.bottleneck in ("stuck", "warming_up"):
            return None
        loss = self.rule.loss or ("step_gaps" if self.bottleneck == "healthy" and self.severity != "ok" else None)
        return self.gains.headline(loss, price, compact)

    def as_json(self, price: float | None = None) -> dict[str, Any]:
        """The report's ``verdict`` object; ``unknown`` maps each quantity that was not measured to why;
        ``price``: per device-hour, for the gains' money."""
        skipped = self.evidence.get("skipped", {}) if isinstance(self.evidence, dict) else {}
        return {"bottleneck": self.bottleneck, "label": RULES[self.bottleneck].label, "severity": self.severity,
                "headline": self.headline, "path": list(self.path), "evidence": dict(self.evidence),
                "suggestions": list(self.suggestions), "straggler_rank": self.straggler_rank,
                "straggler_host": self.straggler_host,
                "losses": [x.as_json() for x in self.losses], "undecided": dict(self.undecided),
                "unknown": {NODES[n].quantity: why for n, why in skipped.items() if n in NODES},
                "stuck": self.stuck.as_json() if self.stuck is not None else None,
                "where": [x.as_json() for x in self.where_lines()[:WHERE_TOP]] if self.where is not None else None,
                **(self.gains.as_json(price) if self.gains is not None
                   else {"gains": [], "gains_combined": None, "gains_basis": None}),
                "gain_headline": self.gain_headline(price)}

    def where_lines(self) -> tuple[WhereLine, ...]:
        """The window's sampled lines, largest first; a host wait puts its waiting lines first, since
        the time off CPU is the time it names."""
        if self.where is None:
            return ()
        if self.bottleneck != "host_wait":
            return self.where.lines
        return tuple(sorted(self.where.lines, key=lambda x: x.state != "waiting"))


# -- measuring each node -----------------------------------------------------------------------
def _judged(node: Node, value: float | None, fired: bool, reason: str = "", measure: str = "",
            threshold: float | None = None, decided_by: str = "") -> Answer:
    return Answer(node, "yes" if fired else "no", value, node.threshold if threshold is None else threshold,
                  reason, measure=measure, decided_by=decided_by)


def _unasked(node: Node, reason: str, applies: bool = True, measure: str = "", otherwise: str | None = None) -> Answer:
    return Answer(node, None, None, node.threshold, reason, applies, measure, otherwise=otherwise)


_pct = units.pct


def qualifying(losses: tuple[Loss, ...]) -> list[Loss]:
    """Step losses measured at or over their own threshold, largest first."""
    out = [x for x in losses if x.id in LOSS_THRESHOLD and x.share is not None and x.share >= LOSS_THRESHOLD[x.id]]
    return sorted(out, key=lambda x: -(x.share or 0.0))


def _ask_largest(node: Node, loss: Loss, losses: tuple[Loss, ...], reason: str = "") -> Answer:
    """Is this measured loss over its threshold and at least as large as every other one that is?"""
    fired = qualifying(losses)
    larger = next((x for x in fired if (x.share or 0.0) > (loss.share or 0.0)), None)
    if loss in fired and larger is not None:
        return _judged(node, loss.share, False, reason, decided_by=f"{larger.label} {_pct(larger.share)} is larger")
    return _judged(node, loss.share, loss in fired, reason)


def _ask_memory(v: JobView, node: Node, losses: tuple[Loss, ...]) -> Answer:
    m = v.metrics.memory
    if m.ooms:
        return _judged(node, m.peak_frac, True, f"{m.ooms} out-of-memory error(s) in the window",
                       decided_by=f"{m.ooms} OOM")
    if m.alloc_retries_rising:
        return _judged(node, m.peak_frac, True, f"allocator retries rising ({m.alloc_retries} so far)",
                       decided_by="allocator retries rising")
    if m.peak_frac is None:
        return _unasked(node, "memory limit or peak not reported")
    return _judged(node, m.peak_frac, compare(m.peak_frac, node))


def _ask_device_busy(v: JobView, node: Node, losses: tuple[Loss, ...]) -> Answer:
    """Starved when busy is low or one measured loss is 10% or more. "Not starved" needs busy
    measured: small or zero measured losses say nothing about the time they do not cover."""
    busy = v.metrics.device_busy
    known = [x for x in losses if x.id in STEP_LOSSES and x.share is not None]
    big = max(known, key=lambda x: x.share or 0.0, default=None)
    low = busy is not None and compare(busy, node)
    lossy = big is not None and (big.share or 0.0) >= LOSS_MIN
    if lossy and not low:
        return _judged(node, busy, True, f"{big.label} is {_pct(big.share)} of the step (>= {_pct(LOSS_MIN)})",
                       decided_by=f"a loss of {_pct(big.share)} ≥{_pct(LOSS_MIN)}")
    if busy is None:
        return _unasked(node, f"{v.device_type.upper()} busy not measured ({_busy_missing(v)})")
    return _judged(node, busy, low, v.metrics.device_busy_source or "")


def _busy_missing(v: JobView) -> str:
    """Why a device's busy share is unknown, in the probe's words where it gave any."""
    if v.device_type == "cuda":
        return v.device_status or "no GPU utilization samples for this job's GPU"
    return "no step timing yet"


def _ask_data_wait(v: JobView, node: Node, losses: tuple[Loss, ...]) -> Answer:
    d = by_id(losses)["data_wait"]
    if d.share is None:
        return _unasked(node, "loader wait not measured (wrap the loader: mon.loader(...))")
    return _ask_largest(node, d, losses)


def _ask_loader_cpu(v: JobView, node: Node, losses: tuple[Loss, ...]) -> Answer:
    """Without workers the loading runs in the training process: its CPU share inside the data wait
    is the measure; with workers, their CPU per worker."""
    m = v.metrics
    if m.loader_workers == 0 or (m.loader_workers is None and m.loader_cpu is None):
        if m.data_cpu_frac is not None:
            return _judged(node, m.data_cpu_frac, compare(m.data_cpu_frac, node),
                           "num_workers=0: main-process CPU share of the data wait", LOADER_MAIN)
        return _unasked(node, "loader CPU not measured: cannot tell preprocessing from I/O", measure=LOADER_MAIN)
    if m.loader_cpu is None:
        return _unasked(node, "loader worker CPU not measured: cannot tell preprocessing from I/O",
                        measure=LOADER_WORKERS)
    return _judged(node, m.loader_cpu, compare(m.loader_cpu, node), f"{m.loader_workers} workers", LOADER_WORKERS)


def _ask_comm_exposed(v: JobView, node: Node, losses: tuple[Loss, ...]) -> Answer:
    """Untimed in a job of several ranks (not at all, or DDP's own traffic while the script's other
    collectives are timed: ``comm_status``), communication cannot be ruled out as the time nothing
    measured explains when that time is the larger: the walk then stops at ``not_measured`` rather
    than blame it on the host (the outcomes after this question all claim it)."""
    c = by_id(losses)["comm_exposed"]
    idle = by_id(losses)["device_idle"]
    several = v.world_size > 1 or len(v.ranks) > 1
    unexplained = idle.share is not None and idle.share >= LOSS_MIN and idle.share > (c.share or 0.0)
    if c.share is None:
        if v.metrics.comm_frac is not None:
            return _unasked(node, f"communication takes {_pct(v.metrics.comm_frac)} of the step but its "
                                  "exposed part is not measured (NCCL: PERFMON_NCCL_TIMING=1)")
        reason = v.comm_status or "collectives not measured (mon.watch(model=ddp_model) measures them)"
        return _unasked(node, reason, otherwise="not_measured" if several and unexplained else None)
    if v.comm_status is not None and several and unexplained:
        return _unasked(node, f"{v.comm_status} (the {_pct(c.share)} timed is the other collectives)",
                        otherwise="not_measured")
    return _ask_largest(node, c, losses, "estimated" if v.metrics.comm_estimated else "")


def _ask_straggler(v: JobView, node: Node, losses: tuple[Loss, ...]) -> Answer:
    m = v.metrics
    if m.compute_ratio is None:
        if v.world_size <= 1 and len(v.ranks) <= 1:
            return _unasked(node, "one rank: there is no peer to wait for", applies=False)
        return _unasked(node, "needs compute time of two or more ranks")
    if m.straggler_by == "arrival":
        return _judged(node, m.compute_ratio, True, f"compute is even, but rank {v.straggler_rank} reaches the "
                                                    f"collective last (arrival ratio {units.ratio(m.arrival_ratio)})",
                       decided_by=f"rank {v.straggler_rank} arrives last")
    return _judged(node, m.compute_ratio, compare(m.compute_ratio, node))


def _ask_host_sync(v: JobView, node: Node, losses: tuple[Loss, ...]) -> Answer:
    if v.device_type != "cuda":
        return _unasked(node, "CPU job: there is no host-device sync to find", applies=False)
    s = v.metrics.syncs_per_step
    if s is None:
        return _unasked(node, "syncs not counted (opt-in: watch(syncs=True) or PERFMON_SYNCS=1)")
    if not compare(s, node) and by_id(losses)["device_idle"].share is None:
        return _unasked(node, "no measured loss explains the low busy share (device idle not measured)")
    return _judged(node, s, compare(s, node))


def _ask_host_waiting(v: JobView, node: Node, losses: tuple[Loss, ...]) -> Answer:
    if v.device_type != "cuda":
        if by_id(losses)["device_idle"].share is None:
            return _unasked(node, "the training thread's CPU time is not reported")
        return _judged(node, 1.0, compare(1.0, node),
                       "CPU job: the unexplained loss is the training thread's time off CPU")
    frac = v.metrics.host_wait_frac
    if frac is None:
        return _unasked(node, "no stack samples of the training thread in steps")
    n = (v.where.waiting + v.where.busy) if v.where is not None else 0
    return _judged(node, frac, compare(frac, node), f"{n} stack samples")


def _ask_mfu(v: JobView, node: Node, losses: tuple[Loss, ...]) -> Answer:
    mfu = v.metrics.mfu
    if mfu is not None:
        return _judged(node, mfu, compare(mfu, node), peak_note(v))
    tensor = tensor_active(v) if v.device_type == "cuda" else None
    if tensor is not None:
        return _judged(node, tensor, tensor < TENSOR_ACTIVE_MIN, "tensor-core activity (MFU unknown)",
                       "tensor-core activity", TENSOR_ACTIVE_MIN)
    if v.device_type != "cuda":
        return _unasked(node, "CPU job: no peak FLOP/s known (set PERFMON_PEAK_TFLOPS for an MFU)")
    return _unasked(node, "MFU unknown: pass flops= to mon.step() or mon.watch(model=...)")


_ASK: dict[str, Callable[[JobView, Node, tuple[Loss, ...]], Answer]] = {
    "memory": _ask_memory, "device_busy": _ask_device_busy, "data_wait": _ask_data_wait,
    "loader_cpu": _ask_loader_cpu, "comm_exposed": _ask_comm_exposed, "straggler": _ask_straggler,
    "syncs": _ask_host_sync, "host_waiting": _ask_host_waiting, "mfu": _ask_mfu,
}


# -- evaluation --------------------------------------------------------------------------------
def ask(view: JobView, losses: tuple[Loss, ...]) -> dict[str, Answer]:
    """Every question of the chart answered once, on the walk's path or not: the one judgement of
    each number, which the walk follows and the panes display."""
    return {node_id: _ASK[node_id](view, node, losses) for node_id, node in NODES.items()}


def walk(view: JobView, losses: tuple[Loss, ...] | None = None,
         answers: dict[str, Answer] | None = None) -> tuple[str, list[str], dict[str, Any]]:
    """Walk the chart by the answers: (outcome, node ids visited, evidence).

    A question that cannot be asked is listed under ``evidence["skipped"]`` and
    the walk goes on with what is known; when it was the outcome's own question
    (``DECIDES_BETWEEN``), ``evidence["undecided"]`` says what is left open.
    """
    losses = account(view.metrics, view.device_type, view.comm_status) if losses is None else losses
    answers = ask(view, losses) if answers is None else answers
    path: list[str] = []
    evidence: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    undecided: dict[str, str] = {}
    node_id = ROOT
    while True:
        node = NODES[node_id]
        path.append(node_id)
        ans = answers[node_id]
        if ans.answer is None:
            skipped[node_id] = ans.reason
            if not ans.applies:           # the question does not apply to this job: its "no" is the answer
                node_id = node.no
            else:                         # not measured: never one of the question's exits
                if node_id in DECIDES_BETWEEN:
                    undecided[node_id] = ans.reason
                node_id = ans.otherwise or UNMEASURED[node_id]
        else:
            evidence[node.quantity] = _round(ans.value)
            if ans.reason:
                evidence.setdefault("notes", {})[node_id] = ans.reason
            node_id = node.yes if ans.answer == "yes" else node.no
        if node_id in RULES:
            break
    if skipped:
        evidence["skipped"] = skipped
    if undecided:
        evidence["undecided"] = undecided
    return node_id, path, evidence


def evaluate(view: JobView) -> Verdict:
    """The verdict for one view (pure). Every question is answered even when the walk stops
    before it (stuck, warming up), so a pane always shows the verdict's judgement, never its own."""
    losses = account(view.metrics, view.device_type, view.comm_status)
    answers = ask(view, losses)
    if view.stuck is not None:     # before everything, warming up included: a stopped job has no steps to judge
        headline, suggestions, extra = explain_stuck(view, None, losses, answers)
        culprits = view.stuck.culprit_ranks
        culprit = culprits[0] if len(culprits) == 1 else None
        return Verdict("stuck", "crit", headline, [], extra, suggestions, culprit, secondary_findings(view),
                       losses=losses, stuck=view.stuck, straggler_host=_host_of(view, culprit), where=view.where,
                       answers=answers)
    if view.warming_up:
        steps = max((r.window_steps for r in view.ranks), default=0)
        return Verdict("warming_up", "info", f"Warming up: {steps} of {MIN_STEPS} steps seen, no verdict yet",
                       [], {"steps": view.metrics.steps}, [], None, secondary_findings(view), losses=losses,
                       where=view.where, answers=answers)
    leaf, path, evidence = walk(view, losses, answers)
    m = view.metrics
    straggler = view.straggler_rank if leaf == "load_imbalance" else None
    for key, value in (("step_time_median_s", m.step_time_median_s), ("device_busy", m.device_busy),
                       ("data_wait_frac", m.data_wait_frac), ("comm_exposed_frac", m.comm_exposed_frac)):
        evidence.setdefault(key, _round(value))
    rule = RULES[leaf]
    headline, suggestions, extra = rule.explain(view, straggler, losses, answers)
    undecided = evidence.get("undecided", {})
    for node_id in undecided:
        headline += f"; cannot tell {DECIDES_BETWEEN[node_id]} ({_short_reason(undecided[node_id])})"
    evidence.update(extra)
    found = _loss_findings(rule, losses, view.where) + secondary_findings(view)
    gains = estimate_gains(view, losses, tuple(x.id for x in qualifying(losses)))
    return Verdict(leaf, _severity(leaf, view, losses), headline, path, evidence, suggestions, straggler, found,
                   losses=losses, undecided=dict(undecided), straggler_host=_host_of(view, straggler),
                   where=view.where, answers=answers, gains=gains)


def _host_of(view: JobView, rank: int | None) -> str | None:
    row = next((r for r in view.ranks if r.rank == rank), None) if rank is not None else None
    return row.host if row is not None else None


def _short_reason(reason: str) -> str:
    return reason.split(": cannot tell")[0]


def _loss_findings(rule: "Rule", losses: tuple[Loss, ...], where: WhereTable | None = None) -> list[dict[str, Any]]:
    """Measured losses over their threshold that the outcome does not name; the unexplained one says
    where the host thread waits most, when stack samples say so."""
    wait = where.top(1, "waiting") if where is not None else ()
    return [{"id": x.id, "share": _round(x.share), "source": x.source,
             "message": f"{x.label} also takes {_pct(x.share)} of each step"
                        + (f" (most waiting in {where_text(wait[0])})" if x.id == "device_idle" and wait else "")}
            for x in qualifying(losses) if x.id != rule.loss]


def _severity(leaf: str, v: JobView, losses: tuple[Loss, ...]) -> str:
    m = v.metrics
    if leaf == "healthy":   # healthy steps, but a tenth of the time lost between them is not ok
        return "ok" if gaps_lost(m) is None else "warn"
    if leaf in ("warming_up", "compute_efficiency"):
        return "info"
    if leaf == "not_measured":
        return "warn"
    if leaf == "memory":
        return "crit" if m.memory.ooms else "warn"
    named = by_id(losses).get(RULES[leaf].loss or "")
    if (m.device_busy is not None and m.device_busy < DEVICE_BUSY_CRIT) or \
            (named is not None and named.share is not None and named.share >= 1.0 - DEVICE_BUSY_CRIT):
        return "crit"
    return "warn"


@dataclass(frozen=True)
class Rule:
    """One outcome of the chart, owning everything said about it.

    ``node``/``exit``: the question and answer that lead here (the question's
    quantity, threshold and source are the rule's test); ``loss``: the loss in
    ``perfmon_analysis.losses`` it names, if any; ``pane``: the pane that shows its
    evidence (highlighted in the TUI); ``explain``: headline, fixes and extra
    evidence from the view.
    """

    id: str
    label: str
    node: str | None
    exit: str | None
    pane: str | None
    explain: Explain
    loss: str | None = None


RULES_TABLE: tuple[Rule, ...] = (
    Rule("stuck", "STUCK", None, None, "ranks", explain_stuck),
    Rule("warming_up", "WARMING UP", None, None, None, explain_warming_up),
    Rule("memory", "MEMORY", "memory", "yes", "memory", explain_memory),
    Rule("data_loading", "DATA LOADING", "loader_cpu", "no", "data", explain_data_loading, loss="data_wait"),
    Rule("data_preprocessing", "DATA PREPROCESSING", "loader_cpu", "yes", "data", explain_data_preprocessing,
         loss="data_wait"),
    Rule("communication", "COMMUNICATION", "straggler", "no", "comm", explain_communication, loss="comm_exposed"),
    Rule("load_imbalance", "LOAD IMBALANCE", "straggler", "yes", "ranks", explain_load_imbalance,
         loss="comm_exposed"),
    Rule("host_sync", "HOST-DEVICE SYNC", "syncs", "yes", "timeline", explain_host_sync, loss="device_idle"),
    Rule("host_wait", "HOST WAIT", "host_waiting", "yes", "timeline", explain_host_wait, loss="device_idle"),
    Rule("host_overhead", "HOST OVERHEAD", "host_waiting", "no", "timeline", explain_host_overhead,
         loss="device_idle"),
    Rule("compute_efficiency", "COMPUTE EFFICIENCY", "mfu", "yes", "device", explain_compute_efficiency),
    Rule("healthy", "HEALTHY", "mfu", "no", None, explain_healthy),
    Rule("not_measured", "NOT MEASURED", "device_busy", None, "device", explain_not_measured),
)
RULES: dict[str, Rule] = {r.id: r for r in RULES_TABLE}
BOTTLENECKS: tuple[str, ...] = tuple(r.id for r in RULES_TABLE)


def label(bottleneck: str) -> str:
    """The outcome's display label (one spelling for the bar, the report and the flowchart)."""
    rule = RULES.get(bottleneck)
    return rule.label if rule else bottleneck.upper().replace("_", " ")


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
