"""The diagnosis flowchart's parts: thresholds (each with its source), and the three types a chart
is made of: a ``Question`` (one class per question, ``perfmon_analysis.questions``), an ``Outcome``
(one class per outcome, ``perfmon_analysis.outcomes``) and the ``Chart`` that joins them by the
questions' exits and walks them.

One object owns everything said about its question or outcome, as
``torch/profiler/_pattern_matcher.py`` has one class per pattern: a question its id, wording,
quantity, threshold and source, how it is asked, where the walk goes when it cannot be asked
and what it decides between; an outcome its label, the pane with its evidence, the loss it
names, its headline, fixes and severity. The walk, the verdict bar, the flowchart screen and
the report read these objects, never a table keyed by their ids. The order and every
threshold's source: docs/verdict.md.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfmon_analysis.comm_stats import STRAGGLER_RATIO

__all__ = [
    "Answer", "COMM_EXPOSED_MIN", "CPU_CONTENTION_MIN", "Chart", "DATA_WAIT_MIN", "DEVICE_BUSY_CRIT",
    "DEVICE_BUSY_MIN", "ETTR_MIN", "Explained", "FILL_CRIT", "FILL_MIN", "FINDINGS", "FRAGMENTATION_MAX",
    "GIL_HOLDER_MIN", "HOST_AHEAD_SHARE", "HOST_WAIT_MIN", "LATE_GAP_MIN", "LOADER_CPU_BOUND", "LOADER_MAIN",
    "LOADER_WORKERS", "LOOP_PREP_MIN", "LOSS_MIN", "LOSS_THRESHOLD", "Losses", "MEMORY_PEAK_MAX", "MFU_MIN",
    "Outcome", "Question", "STRAGGLER_RATIO_MAX", "SYNCS_PER_STEP_MIN", "TENSOR_ACTIVE_MIN", "THROTTLE_REASONS",
    "round4",
]

if TYPE_CHECKING:
    from perfmon_analysis.losses import Loss
    from perfmon_analysis.views import JobView

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
# Fill (GPM SM activity over busy): NVIDIA's DCGM user guide, profiling metrics, on SM activity: "a value
# of 0.8 or greater is necessary, but not sufficient, for effective use of the GPU. A value less than
# 0.5 likely indicates ineffective GPU usage." Read of the time a kernel runs (fill), so a device idle
# half the time with full kernels is not called poorly filled; under 0.5 the outcome is a warning.
FILL_MIN = 0.80
FILL_CRIT = 0.50
# A host that finished queueing most steps before the device began them (the step's first event had not
# run when the host ended it) kept a step or more of work queued; a stream runs its queue back to back
# (PyTorch, CUDA semantics: "each device executes operations in the order they are queued"), so launches
# cannot have idled the device inside those steps and the host is not blamed for its idle time. Half:
# the median step, as a lead of one step over the median was before the probe asked each step.
HOST_AHEAD_SHARE = 0.5
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
# The loop's work between steps is mostly preparing the next step's input when most of its busy stack
# samples are before the lines the loop runs its step from (probe.where.LoopLines): "most" is the majority.
LOOP_PREP_MIN = 0.50
# A thread is named as the GIL's holder when it held it (on CPU running Python while the training
# thread waited, probe.where) in at least half of the training thread's waiting samples: the majority.
GIL_HOLDER_MIN = 0.50
# CPU contention: the training thread runnable with no free core for 10% of the step or more, the same
# share at which a measured loss counts (LOSS_MIN); its cause is other processes or threads, not the step.
CPU_CONTENTION_MIN = 0.10
# A late rank's own time between steps is named beside the arrival straggler from the data wait's line
# (5%): less would not explain its late arrival.
LATE_GAP_MIN = DATA_WAIT_MIN
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

FINDINGS = ("step_gaps", "throttling", "fragmentation", "rank_restarted", "drops", "probe_warnings", "cpu_contention",
            "perfmon_cost", "accounting", "data_wait", "comm_exposed", "loop", "device_idle", "memory_growth",
            "step_outliers")
# The share at which each loss of the iteration counts as a cause (and, when not the largest, a secondary
# finding); the loop's own work between steps counts from the same share as device idle.
LOSS_THRESHOLD = {"data_wait": DATA_WAIT_MIN, "comm_exposed": COMM_EXPOSED_MIN, "loop": LOSS_MIN,
                  "device_idle": LOSS_MIN}

Losses = tuple["Loss", ...]
# An outcome's words: headline, fixes, extra evidence.
Explained = tuple[str, list[str], dict[str, Any]]


@dataclass(frozen=True)
class Answer:
    """One question as the verdict asked it: the one judgement of that number, which the verdict
    bar, the flowchart screen and every pane marker display.

    ``answer``: "yes" (the question's problem exit), "no", or None when the question could not be
    asked (not measured; or, with ``applies`` False, it does not apply to this job and the walk
    takes "no"). ``value`` and ``threshold``: the number judged and the line it was judged
    against; ``measure``: what ``value`` is, where the question measures it more than one way;
    ``decided_by``: the test that decided, where it was not ``value`` against ``threshold``
    alone (a larger loss, an OOM, a late rank), so a pane never shows a bare comparison
    that the answer contradicts. ``otherwise``: where the walk goes when the question could not
    be asked, if not the question's own ``unmeasured`` exit (an unmeasured cause that the rest
    of the walk would blame on something else).
    """

    question: Question
    answer: str | None
    value: float | None
    threshold: float
    reason: str = ""
    applies: bool = True
    measure: str = ""
    decided_by: str = ""
    otherwise: str | None = None
    silent: bool = False     # nothing to ask of this job: the walk takes "no" without listing the question

    @property
    def asked(self) -> bool:
        return self.answer is not None


class Question:
    """One question of the chart. Subclasses set the attributes and write ``ask``.

    ``yes``/``no`` name an outcome or the next question (an outcome id wins where both exist:
    the root question shares the name "memory" with its outcome); ``op`` is how ``quantity`` is
    compared with ``threshold`` for a "yes" ("<", ">=", ">"); ``unit`` is "frac" (shown as %),
    "ratio" or "count". ``unmeasured``: where the walk goes when the question cannot be asked;
    never one of its own exits' judgements, since an unmeasured quantity decides nothing
    (docs/verdict.md, "Unknown is unknown"). ``decides_between``: set on the last question
    before an outcome, the causes the verdict cannot tell apart when it cannot be asked.
    ``short``: its name on the verdict bar's path.
    """

    id: str
    text: str
    quantity: str
    threshold: float
    source: str
    yes: str
    no: str
    unmeasured: str
    op: str = ">="
    unit: str = "frac"
    short: str = ""
    decides_between: str | None = None

    def ask(self, view: JobView, losses: Losses) -> Answer:
        raise NotImplementedError

    def fires(self, value: float) -> bool:
        """Does ``value`` take the "yes" exit (the direction that names a problem)? The one
        comparison: the verdict and the panes' judged numbers both use it."""
        return compare(value, self)

    def judged(self, value: float | None, fired: bool, reason: str = "", measure: str = "",
               threshold: float | None = None, decided_by: str = "") -> Answer:
        return Answer(self, "yes" if fired else "no", value, self.threshold if threshold is None else threshold,
                      reason, measure=measure, decided_by=decided_by)

    def unasked(self, reason: str, applies: bool = True, measure: str = "", otherwise: str | None = None) -> Answer:
        return Answer(self, None, None, self.threshold, reason, applies, measure, otherwise=otherwise)

    def silenced(self, reason: str) -> Answer:
        """Nothing to ask of this job (its input does not exist for it): passed on "no", unlisted."""
        return Answer(self, None, None, self.threshold, reason, applies=False, silent=True)

    def rewired(self, **exits: str) -> Question:
        """This question with other exits (``yes``, ``no``, ``unmeasured``): how a chart puts a new
        question behind an existing one (``Chart.with_question``)."""
        new = copy.copy(self)
        for name, target in exits.items():
            if name not in ("yes", "no", "unmeasured"):
                raise ValueError(f"{name!r} is not an exit")
            setattr(new, name, target)
        return new


class Outcome:
    """One outcome of the chart. Subclasses set the attributes and write ``explain``.

    ``pane``: the pane that shows its evidence (highlighted in the TUI); ``loss``: the loss of
    ``perfmon_analysis.losses`` it names, if any (``named``: on a given walk). An outcome in ``Chart.before``
    ends the verdict before the walk when ``applies`` says so (a job that stopped has no steps to judge).
    """

    id: str
    label: str
    pane: str | None = None
    loss: str | None = None

    def applies(self, view: JobView) -> bool:
        return False

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: dict[str, Answer]) -> Explained:
        raise NotImplementedError

    def named(self, answers: dict[str, Answer]) -> str | None:
        """The loss this outcome names on the walk ``answers`` took: ``loss``, unless two losses lead
        here (a host wait inside steps or between them)."""
        return self.loss

    def severity(self, view: JobView, losses: Losses, loss: str | None = None) -> str:
        """"crit" when the device is idle half the time or the named loss (``loss``, else the outcome's)
        takes half the iteration (TB plugin "low GPU utilization" rule, < 50%), else "warn"."""
        busy = view.metrics.device_busy
        named = next((x for x in losses if x.id == (loss or self.loss)), None)
        if (busy is not None and busy < DEVICE_BUSY_CRIT) or \
                (named is not None and named.share is not None and named.share >= 1.0 - DEVICE_BUSY_CRIT):
            return "crit"
        return "warn"


class Chart:
    """Questions joined by their exits, the outcomes they lead to, and the outcomes that come
    before any question. Checked when built: every exit leads somewhere, every question is
    reachable from the root, and no walk can loop."""

    def __init__(self, questions: Iterable[Question], outcomes: Iterable[Outcome], root: str,
                 before: Iterable[str] = ()) -> None:
        self.questions: dict[str, Question] = {q.id: q for q in questions}
        self.outcomes: dict[str, Outcome] = {o.id: o for o in outcomes}
        self.root = root
        self.before = tuple(self.outcomes[o] for o in before)
        self._check()

    def exit_target(self, target: str) -> Question | Outcome:
        return self.outcomes.get(target) or self.questions[target]

    def _check(self) -> None:
        for q in self.questions.values():
            for name in ("yes", "no", "unmeasured"):
                target = getattr(q, name)
                if target not in self.outcomes and target not in self.questions:
                    raise ValueError(f"question {q.id!r}: its {name} exit {target!r} leads nowhere")
        seen: set[str] = set()

        def visit(qid: str, trail: tuple[str, ...]) -> None:
            if qid in trail:
                raise ValueError(f"the chart loops: {' > '.join(trail + (qid,))}")
            seen.add(qid)
            q = self.questions[qid]
            for target in {q.yes, q.no, q.unmeasured}:
                if target not in self.outcomes:
                    visit(target, trail + (qid,))

        visit(self.root, ())
        unreached = set(self.questions) - seen
        if unreached:
            raise ValueError(f"questions no walk reaches: {sorted(unreached)}")

    def with_question(self, question: Question, after: str, exit: str = "no") -> Chart:
        """A chart with ``question`` put into question ``after``'s ``exit``; the new question's own
        exits must already say where it goes."""
        questions = [q.rewired(**{exit: question.id}) if q.id == after else q for q in self.questions.values()]
        return Chart([*questions, question], self.outcomes.values(), self.root, (o.id for o in self.before))

    def ask(self, view: JobView, losses: Losses) -> dict[str, Answer]:
        """Every question answered once, on the walk's path or not: the one judgement of each
        number, which the walk follows and the panes display."""
        return {qid: q.ask(view, losses) for qid, q in self.questions.items()}

    def walk(self, answers: dict[str, Answer]) -> tuple[str, list[str], dict[str, Any]]:
        """Walk by the answers: (outcome, question ids visited, evidence).

        A question that cannot be asked is listed under ``evidence["skipped"]`` and the walk goes
        on with what is known; when it was the outcome's own question (``decides_between``),
        ``evidence["undecided"]`` says what is left open.
        """
        path: list[str] = []
        evidence: dict[str, Any] = {}
        skipped: dict[str, str] = {}
        undecided: dict[str, str] = {}
        qid = self.root
        while True:
            q = self.questions[qid]
            ans = answers[qid]
            if ans.silent:
                qid = q.no
                if qid in self.outcomes:
                    break
                continue
            path.append(qid)
            if ans.answer is None:
                skipped[qid] = ans.reason
                if not ans.applies:           # the question does not apply to this job: its "no" is the answer
                    qid = q.no
                else:                         # not measured: never one of the question's exits
                    if q.decides_between is not None:
                        undecided[qid] = ans.reason
                    qid = ans.otherwise or q.unmeasured
            else:
                evidence[q.quantity] = round4(ans.value)
                if ans.reason:
                    evidence.setdefault("notes", {})[qid] = ans.reason
                qid = q.yes if ans.answer == "yes" else q.no
            if qid in self.outcomes:
                break
        if skipped:
            evidence["skipped"] = skipped
        if undecided:
            evidence["undecided"] = undecided
        return qid, path, evidence


def round4(x: Any) -> Any:
    return round(x, 4) if isinstance(x, float) else x


def compare(value: float, question: Question) -> bool:
    """Does ``value`` take the question's "yes" exit (the direction that names a problem)?"""
    if question.op == "<":
        return value < question.threshold
    if question.op == ">":
        return value > question.threshold
    return value >= question.threshold
