"""The flowchart's straggler questions and outcomes: which kind of straggling the exposed wait is.

Exposed communication (collectives, and the point-to-point waits a pipeline schedule exposes: a
stage's bubble) is where every straggler shows: the others wait for it. Before the per-rank compute
comparison (``questions.Straggler``), the what-if over the window's operations
(``perfmon_analysis.stragglers``; docs/layout.md) is asked, in its own order of precedence:

* ``worker_slow``: one worker slower than its stage's peers on most steps → ``slow_worker``;
* ``rotating``: a different worker slow from step to step → ``rotating_imbalance``;
* ``stage_heavy``: one stage doing more work than the others → ``slow_stage``.
Each decides nothing that the analysis did not: it shows the quantity the analysis judged, and
when the analysis's other condition decided (a cause costing under 5% of the step, two workers
taking turns), says so. Without operations (no rank sent any: wire 1.5 is sent by CPU jobs), and in
a data-parallel job unless the analysis names rotating imbalance, the questions pass silently and
the walk goes on to the per-rank comparison as before (``_WhatIf.ask``).
"""

from __future__ import annotations

from perfmon_analysis import units
from perfmon_analysis.explain import who
from perfmon_analysis.flowchart import Answer, Explained, Losses, Outcome, Question, round4
from perfmon_analysis.stragglers import (
    CHRONIC,
    MIN_SLOWDOWN,
    ROTATING,
    SLOW_STAGE,
    SLOW_WORKER,
    STAGE_RATIO,
    Straggling,
)
from perfmon_analysis.views import JobView

_pct = units.pct
SOURCE = "what-if over the ranks' operations (straggler paper, OSDI '25; docs/layout.md)"
NO_OPS = "no rank sent its operations (wire 1.5; CUDA jobs: not timed on the device yet): stragglers not simulated"
CAUSE_OUTCOMES = {SLOW_WORKER: "slow_worker", ROTATING: "rotating_imbalance", SLOW_STAGE: "slow_stage"}


class _WhatIf(Question):
    """A question the what-if answers: ``cause`` is the analysis's cause it asks about, ``value`` the
    quantity the analysis judged for it, ``needs`` what the job must have for it to be asked."""

    cause: str
    source = SOURCE
    unmeasured = "straggler"

    def value(self, s: Straggling) -> tuple[float | None, str]:
        raise NotImplementedError

    def needs(self, s: Straggling) -> str | None:
        """Why this job has nothing to ask (one replica, one stage), else None."""
        return None

    def ask(self, view: JobView, losses: Losses) -> Answer:
        """The analysis's own decision on ``cause``, with the quantity it judged; where that quantity
        alone would have decided otherwise, what did decide. A job with no operations, and a
        data-parallel job in which the what-if finds no rotating imbalance, pass silently: they read
        as before these questions (a chronic slow rank of a data-parallel job stays
        ``load_imbalance``, whose fixes cover its data shard as well as its host)."""
        s = view.straggling
        if s is None:
            return self.silenced(NO_OPS)
        if not view.layout.beyond_dp and not (self.cause == ROTATING and s.cause == ROTATING):
            return self.silenced("a data-parallel job: a chronic slow rank is the per-rank comparison's")
        if s.why is not None:
            return self.unasked(s.why)
        nothing = self.needs(s)
        if nothing is not None:
            return self.silenced(nothing)
        value, reason = self.value(s)
        fired = s.cause == self.cause
        decided = ""
        if value is not None and fired != self.fires(value):
            decided = (f"the what-if names {s.cause.replace('_', ' ')} first" if s.cause is not None else
                       f"it would cost under {units.speedup(MIN_SLOWDOWN)}, or another worker stands out as often")
        return self.judged(value, fired, reason, decided_by=decided)


class WorkerSlow(_WhatIf):
    id = "worker_slow"
    text = "Is one worker slower than its stage's peers on most steps (the same one)?"
    quantity = "worker_standout_frac"
    threshold = CHRONIC
    cause = SLOW_WORKER
    yes, no = "slow_worker", "rotating"
    short = "worker"

    def needs(self, s: Straggling) -> str | None:
        return "one replica: a worker has no peers doing the same work" if s.replicas < 2 else None

    def value(self, s: Straggling) -> tuple[float | None, str]:
        return s.top_share, f"over {s.steps} steps"


class Rotating(_WhatIf):
    id = "rotating"
    text = "Is a different worker the slow one from step to step?"
    quantity = "standout_frac"
    threshold = CHRONIC
    cause = ROTATING
    yes, no = "rotating_imbalance", "stage_heavy"
    short = "rotating"

    def needs(self, s: Straggling) -> str | None:
        return "one replica: no peers to take turns with" if s.replicas < 2 else None

    def value(self, s: Straggling) -> tuple[float | None, str]:
        return s.standout_share, f"{s.workers_standing_out} worker(s) stood out"


class StageHeavy(_WhatIf):
    id = "stage_heavy"
    text = "Does one pipeline stage do more work than the others (median work over the stages' mean)?"
    quantity = "stage_work_ratio"
    threshold = STAGE_RATIO
    cause = SLOW_STAGE
    yes, no = "slow_stage", "straggler"
    unit = "ratio"
    short = "stages"

    def needs(self, s: Straggling) -> str | None:
        return "one stage: no pipeline" if s.stages_seen < 2 else None

    def value(self, s: Straggling) -> tuple[float | None, str]:
        return s.stage_ratio, ""


def _gain(s: Straggling) -> str:
    return f"{units.speedup(s.gain)} (simulated)" if s.gain is not None else "not shown by the simulation"


class SlowWorker(Outcome):
    id = "slow_worker"
    label = "SLOW WORKER"
    pane = "ranks"
    loss = "comm_exposed"

    def explain(self, view: JobView, straggler: int | None, losses: Losses, answers: dict[str, Answer]) -> Explained:
        s = view.straggling
        assert s is not None and s.worker is not None
        worker = view.layout.worker_label(*s.worker)
        headline = (f"Slow worker: {worker}, {who(view, s.rank)}, is slower than its stage's peers on "
                    f"{_pct(s.top_share)} of steps; every other worker waits for it "
                    f"({_pct(view.metrics.comm_exposed_frac)}"
                    f" of the step exposed); without it: {_gain(s)}")
        host = next((r.host for r in view.ranks if r.rank == s.rank and r.host), None)
        fixes = [f"replace or drain the node of rank {s.rank}{f' ({host})' if host else ''}: a worker slow on most "
                 "steps is its host or hardware (throttling, a failing device, another process)",
                 "check that node: clocks and throttle reasons, ECC and link errors, other processes on its cores",
                 "restart the job without that node (elastic training: exclude it) until it is fixed"]
        return headline, fixes, {"straggler_rank": s.rank, "worker": worker, "slowdown": round4(s.slowdown),
                                 "gain": round4(s.gain)}


class SlowStage(Outcome):
    id = "slow_stage"
    label = "SLOW STAGE"
    pane = "ranks"
    loss = "comm_exposed"

    def explain(self, view: JobView, straggler: int | None, losses: Losses, answers: dict[str, Answer]) -> Explained:
        s = view.straggling
        assert s is not None and s.stage is not None
        mine = next((t for t in s.stages if t.stage == s.stage), None)
        others = [t for t in s.stages if t.stage != s.stage]
        busy = f" ({units.seconds(mine.compute_s)} of compute a step, {_pct(mine.compute_frac)})" if mine else ""
        bubble = max((t.bubble_frac for t in others), default=0.0)
        waits = f", up to {_pct(bubble)} of their step" if bubble > 0 else ""
        headline = (f"Slow stage: pipeline stage {s.stage} does the most work{busy}; the other stages wait for "
                    f"it{waits}; balancing the stages: {_gain(s)}")
        fixes = [f"move layers out of stage {s.stage} into its neighbours (the pipeline's split points)",
                 "the last stage also computes the loss and the output layer, the first the embedding: give them "
                 "fewer layers than the middle stages",
                 "more micro-batches shrink the fill and drain bubble, not an imbalance between stages"]
        return headline, fixes, {"stage": s.stage, "slowdown": round4(s.slowdown), "gain": round4(s.gain)}


class RotatingImbalance(Outcome):
    id = "rotating_imbalance"
    label = "ROTATING IMBALANCE"
    pane = "ranks"
    loss = "comm_exposed"

    def explain(self, view: JobView, straggler: int | None, losses: Losses, answers: dict[str, Answer]) -> Explained:
        s = view.straggling
        assert s is not None
        heavy = f"; stage {s.stage} costs the most" if s.stage is not None else ""
        headline = (f"Rotating imbalance: on {_pct(s.standout_share)} of steps one worker is much slower than its "
                    f"peers, a different one each time ({s.workers_standing_out} workers), so every step waits "
                    f"for one{heavy}; evening the work over the replicas: {_gain(s)}")
        fixes = ["pack sequences so each micro-batch holds the same number of tokens",
                 "bucket samples by length: each replica's batch then costs the same",
                 "split batches by tokens (or by attention cost), not by sample count"]
        return headline, fixes, {"slowdown": round4(s.slowdown), "gain": round4(s.gain)}


QUESTIONS: tuple[Question, ...] = (WorkerSlow(), Rotating(), StageHeavy())
OUTCOMES: tuple[Outcome, ...] = (SlowWorker(), SlowStage(), RotatingImbalance())
