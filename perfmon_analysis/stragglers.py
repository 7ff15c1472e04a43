"""Which kind of straggling a job has, and what removing it buys (docs/layout.md, docs/verdict.md).

Three causes need three different fixes, and the ranks' layout tells them apart:
* a **slow stage**: one pipeline stage does more work than the others on every replica and every
  step, by design (partitioning): move layers between stages;
* a **slow worker**: one worker (a rank, or the tensor-parallel group that shares its stage and
  replica) is slower than its peers of the same stage on most steps (host or hardware): replace or
  drain its node;
* **rotating imbalance**: a different worker is the slow one from step to step (data, or sequence
  lengths, spread unevenly over the replicas): pack or bucket the sequences.
A worker that stands out on a few steps only is a **one-off** (a stall, a hiccup), named as such and
never called a straggler.

The test per step: each worker's own work (its work slots in the step's dependency model: compute
and, on the host clock, the thread's own time between operations) against the median of its stage's
workers in that step; the worker furthest above it *stands out* when that excess is at least
``STANDOUT`` of the step. A worker standing out on at least ``CHRONIC`` of the steps is chronic;
standouts on ``CHRONIC`` of the steps spread over several workers, none chronic (two workers taking
turns are not one chronic: it must stand out twice as often as the next), are rotating, counting
only those that stand out by the measured CPU contention on top (a contended host slows a random
rank each step, and that is not the data's doing). The
stages are compared by the median work of their workers: the heaviest over the mean of the stages
by ``STAGE_RATIO`` is a slow stage. A cause is named only when it costs at least ``MIN_SLOWDOWN``.

Figures (``perfmon_analysis.whatif``): ``slowdown`` is the paper's attribution (the simulated step
with every duration typical except the cause's, as measured, over the all-typical step), checked
against its published traces; ``gain`` is what removing the cause buys the job now (the measured
step over the one simulated with the cause removed: the worker at its peers' speed, the stages
balanced, the work evened over the replicas).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perfmon_analysis.layout import Layout
from perfmon_analysis.readings.layout import StepOps
from perfmon_analysis.whatif import Model, StepGraph, compile_step

SLOW_WORKER, SLOW_STAGE, ROTATING = "slow_worker", "slow_stage", "rotating_imbalance"
STANDOUT = 0.10        # a worker's work over its stage's median, as a share of the step
CHRONIC = 0.5          # share of the steps
STAGE_RATIO = 1.10     # heaviest stage's median work over the mean of the stages'
MIN_SLOWDOWN = 1.05    # a cause costing less than 5% of the step is not named
MIN_STEPS = 3
NO_GAIN = "the simulation shows no faster step without it: the measured steps vary more than it costs"


@dataclass(frozen=True)
class StageTime:
    """One pipeline stage over the analysed steps: the median per step of its workers' compute (the
    stage's forward, backward and other compute operations) and of their bubble (time the thread was
    blocked on its neighbours: in point-to-point calls and their waits where the probe timed them, else
    the receives' durations), in seconds and as shares of the step (its whole cycle: a stage that waits
    for the pipeline to fill before its first forward waits inside the step, whatever the step's
    boundaries make of that time)."""

    stage: int
    compute_s: float
    bubble_s: float
    compute_frac: float
    bubble_frac: float

    def as_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "compute_s": _r(self.compute_s), "bubble_s": _r(self.bubble_s),
                "compute_frac": _r(self.compute_frac), "bubble_frac": _r(self.bubble_frac)}


@dataclass(frozen=True)
class Straggling:
    """The analysis of a window's operations. ``cause`` is None when none is named (``why`` says why
    when nothing could be analysed). ``worker`` is (stage, replica); ``rank`` the worker's slowest
    rank; ``stage`` the slow stage, or with rotating imbalance the stage that costs the most;
    ``whole``: the slowdown of every straggler together (the paper's S)."""

    cause: str | None
    steps: int
    whole: float | None = None
    slowdown: float | None = None
    gain: float | None = None
    chronic: bool = False
    worker: tuple[int, int] | None = None
    rank: int | None = None
    stage: int | None = None
    stage_slowdown: float | None = None
    standout_steps: int = 0
    workers_standing_out: int = 0
    one_off: tuple[int, int] | None = None        # (step, rank) of a worker that stood out once or rarely
    stages: tuple[StageTime, ...] = ()
    forced: int = 0
    why: str | None = None
    by_stage: dict[int, float] = field(default_factory=dict)     # each stage's attributed slowdown
    why_no_gain: str | None = None
    top_share: float | None = None       # share of the steps on which the most frequent worker stood out
    stage_ratio: float | None = None     # the heaviest stage's median work over the mean of the stages'
    replicas: int = 1                    # replicas and stages among the ranks analysed
    stages_seen: int = 1

    @property
    def standout_share(self) -> float | None:
        """Share of the steps on which one worker stood out."""
        return self.standout_steps / self.steps if self.steps else None

    def as_json(self, layout: Layout | None = None) -> dict[str, Any]:
        """The report's ``straggling``."""
        worker = None if self.worker is None else {"stage": self.worker[0], "replica": self.worker[1],
                                                    "label": layout.worker_label(*self.worker) if layout else None}
        out: dict[str, Any] = {
            "cause": self.cause, "chronic": self.chronic, "steps": self.steps, "slowdown": _r(self.slowdown),
            "gain": _r(self.gain), "whole_slowdown": _r(self.whole), "rank": self.rank, "stage": self.stage,
            "stage_slowdown": _r(self.stage_slowdown), "standout_steps": self.standout_steps,
            "workers_standing_out": self.workers_standing_out, "worker": worker,
            "one_off": None if self.one_off is None else {"step": self.one_off[0], "rank": self.one_off[1]},
            "by_stage": {str(k): _r(v) for k, v in sorted(self.by_stage.items())},
            "stages": [s.as_json() for s in self.stages], "forced": self.forced}
        if self.why is not None:
            out["why"] = self.why
        if self.why_no_gain is not None:
            out["why_no_gain"] = self.why_no_gain
        return out


def analyse(layout: Layout, steps: Mapping[int, Mapping[int, StepOps]], noise: float | None = None) -> Straggling:
    """The straggling of the steps that every rank reporting operations sent whole (``steps[step][rank]``;
    a rank missing from most steps is left out, a step missing a rank or with operations dropped too).
    ``noise``: the share of the step a rank waited for a core (measured CPU contention), which a
    worker must stand out by on top of ``STANDOUT`` for rotating imbalance: contention slows a random
    rank each step, which is not the data's doing."""
    seen = collections.Counter(r for by_rank in steps.values() for r in by_rank if layout.worker(r) is not None)
    ranks = {r for r, n in seen.items() if 2 * n >= len(steps)}      # a rank that reports at all, most steps
    usable = sorted(s for s, by_rank in steps.items()
                    if all(r in by_rank and by_rank[r].dropped == 0 for r in ranks))
    if len(ranks) < 2 or len(usable) < MIN_STEPS:
        why = "fewer than two ranks sent their operations" if len(ranks) < 2 else \
            f"fewer than {MIN_STEPS} steps with every rank's operations"
        return Straggling(cause=None, steps=len(usable), why=why)
    graphs = [compile_step(s, {r: steps[s][r] for r in ranks}) for s in usable]
    stage_of = {r: layout.stage(r) or 0 for r in ranks}
    replica_of = {r: layout.replica(r) or 0 for r in ranks}
    model = Model(graphs, stage_of.__getitem__, replica_of.__getitem__)
    measured, ideal = model.times("measured"), model.times("ideal")
    t_meas, t_ideal = statistics.fmean(measured), statistics.fmean(ideal)
    whole = t_meas / t_ideal if t_ideal > 0 else None
    stages = sorted(set(stage_of.values()))
    by_stage = {s: r for s in stages if (r := _ratio(model.times("ideal", "measured", model.of_stage(s)), ideal))
                is not None} if len(stages) > 1 else {}     # a stage whose slowdown is unknown is left out
    work = _work(graphs, layout)
    base = Straggling(cause=None, steps=len(graphs), whole=whole, forced=sum(g.forced for g in graphs),
                      stages=stage_times(layout, [{r: steps[s][r] for r in ranks} for s in usable]),
                      by_stage=by_stage)
    excess = _standouts(work, measured)
    standouts = [(step, w) for step, w, _ in excess]
    beyond_noise = [w for _, w, share in excess if share >= STANDOUT + (noise or 0.0)]
    tops = collections.Counter(w for _, w in standouts)
    ranked = tops.most_common(2)
    chronic = next((w for w, n in ranked[:1] if n >= CHRONIC * len(graphs)
                    and (len(ranked) < 2 or n >= 2 * ranked[1][1])), None)   # and not one of two taking turns
    heavy_ratio = _stage_ratio(work)
    base = dataclasses.replace(base, top_share=ranked[0][1] / len(graphs) if ranked else 0.0,
                               stage_ratio=heavy_ratio[1] if heavy_ratio else None,
                               replicas=len(set(replica_of.values())), stages_seen=len(stages))
    heavy = max(by_stage, key=by_stage.__getitem__) if by_stage else None
    if chronic is not None:
        where = model.of_worker(*chronic)
        slowdown = _ratio(model.times("ideal", "measured", where), ideal)
        result = _named(base, SLOW_WORKER, slowdown, _ratio(measured, model.times("measured", "peers", where)),
                        chronic=True, worker=chronic, rank=_slowest_rank(work, chronic))
    elif len(beyond_noise) >= CHRONIC * len(graphs) and len(set(beyond_noise)) > 1:
        result = _named(base, ROTATING, whole, _ratio(measured, model.times("evened")), chronic=True,
                        stage=heavy, stage_slowdown=by_stage.get(heavy) if heavy is not None else None)
    else:
        result = base
        slow = heavy_ratio[0] if heavy_ratio is not None and heavy_ratio[1] >= STAGE_RATIO else None
        if slow is not None and slow in by_stage:
            result = _named(base, SLOW_STAGE, by_stage[slow], _ratio(measured, model.times("balanced")),
                            chronic=True, stage=slow, stage_slowdown=by_stage[slow])
    if result.cause is None and standouts:
        step, worker = max(standouts, key=lambda sw: work[sw[0]][sw[1]][0])
        if (rank := _slowest_rank(work, worker, step)) is not None:    # the worker stood out on that step
            result = dataclasses.replace(base, one_off=(step, rank))
    return dataclasses.replace(result, standout_steps=len(standouts), workers_standing_out=len(tops))


def _named(base: Straggling, cause: str, slowdown: float | None, gain: float | None, **fields: Any) -> Straggling:
    """``base`` with ``cause`` named, unless it costs less than ``MIN_SLOWDOWN``. A gain under 1 (the
    simulation, on timings noisier than what the cause costs, shows the job no faster without it) is
    not a gain: unknown, and ``why_no_gain`` says so."""
    if slowdown is None or slowdown < MIN_SLOWDOWN:
        return base
    why = None
    if gain is not None and gain < 1.0:
        gain, why = None, NO_GAIN
    return dataclasses.replace(base, cause=cause, slowdown=slowdown, gain=gain, why_no_gain=why, **fields)


def _ratio(num: list[float], den: list[float]) -> float | None:
    d = statistics.fmean(den)
    return statistics.fmean(num) / d if d > 0 else None


Work = dict[int, dict[tuple[int, int], tuple[float, int]]]     # step -> worker -> (its work, its slowest rank)


def _work(graphs: list[StepGraph], layout: Layout) -> Work:
    """Per step, each worker's own work: the work slots of its slowest rank (the others of a
    tensor-parallel group wait for it in their collectives)."""
    out: Work = {}
    for g in graphs:
        per_rank: dict[int, float] = collections.defaultdict(float)
        for s in g.slots:
            if s.work:
                per_rank[s.owners[0]] += s.dur
        workers: dict[tuple[int, int], tuple[float, int]] = {}
        for rank, seconds in per_rank.items():
            w = layout.worker(rank)
            if w is not None and seconds > workers.get(w, (-1.0, -1))[0]:
                workers[w] = (seconds, rank)
        out[g.step] = workers
    return out


def _standouts(work: Work, measured: list[float]) -> list[tuple[int, tuple[int, int], float]]:
    """(step, worker, its excess as a share of the step) for each step in which one worker's work
    exceeds its stage's median by at least ``STANDOUT`` of the step."""
    out = []
    for (step, workers), t in zip(sorted(work.items()), measured):
        by_stage: dict[int, list[float]] = collections.defaultdict(list)
        for (stage, _), (seconds, _) in workers.items():
            by_stage[stage].append(seconds)
        median = {s: statistics.median(v) for s, v in by_stage.items() if len(v) > 1}
        excess = {w: seconds - median[w[0]] for w, (seconds, _) in workers.items() if w[0] in median}
        if excess and t > 0:
            top = max(excess, key=excess.__getitem__)
            if excess[top] >= STANDOUT * t:
                out.append((step, top, excess[top] / t))
    return out


def _slowest_rank(work: Work, worker: tuple[int, int], step: int | None = None) -> int | None:
    ranks = collections.Counter(workers[worker][1] for s, workers in work.items()
                                if worker in workers and (step is None or s == step))
    return ranks.most_common(1)[0][0] if ranks else None


def _stage_ratio(work: Work) -> tuple[int, float] | None:
    """(the heaviest stage, its workers' median work over the mean of the stages' medians); None with
    one stage."""
    by_stage: dict[int, list[float]] = collections.defaultdict(list)
    for workers in work.values():
        for (stage, _), (seconds, _) in workers.items():
            by_stage[stage].append(seconds)
    if len(by_stage) < 2:
        return None
    median = {s: statistics.median(v) for s, v in by_stage.items()}
    heavy = max(median, key=median.__getitem__)
    mean = statistics.fmean(median.values())
    return (heavy, median[heavy] / mean) if mean > 0 else None


def stage_times(layout: Layout, steps: list[Mapping[int, StepOps]]) -> tuple[StageTime, ...]:
    """Each stage's compute and bubble (``StageTime``), for a job with more than one stage."""
    if layout.stages < 2:
        return ()
    compute: dict[int, list[float]] = collections.defaultdict(list)
    bubble: dict[int, list[float]] = collections.defaultdict(list)
    active: dict[int, list[float]] = collections.defaultdict(list)
    for by_rank in steps:
        for rank, step in by_rank.items():
            stage = layout.stage(rank)
            if stage is None:
                continue
            compute[stage].append(sum(op.dur for op in step.ops if op.compute))
            bubble[stage].append(step.p2p_wait if step.p2p_wait is not None else
                                 sum(op.dur for op in step.ops if op.kind == "recv"))
            active[stage].append(step.body[1])
    out = []
    for stage in sorted(compute):
        c, b, a = (statistics.median(x[stage]) for x in (compute, bubble, active))
        out.append(StageTime(stage, c, b, c / a if a > 0 else 0.0, b / a if a > 0 else 0.0))
    return tuple(out)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
