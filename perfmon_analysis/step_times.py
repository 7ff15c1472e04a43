"""Step-time percentiles (p50, p90, p99, max) over the window and the whole run, and the steps far
above the median with what ran in them (docs/verdict.md, "Outliers").

The window's percentiles are exact (its steps are all held); the run's come from the rank's
``DurationSketch`` (``perfmon_analysis.sketch``), fed every step at ingest: bounded whatever the
run's length, within 1% of the true value, its maximum exact. A step's time is its ``dur``: from the
previous step's end, so a pause between two steps (a checkpoint, an evaluation) is in the step after
it, as the median's is.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfmon_analysis import units
from perfmon_analysis.buffers import BLOCKING_EVENTS
from perfmon_analysis.readings import EventReading, StepReading, eval_forwards
from perfmon_analysis.sketch import DurationSketch

if TYPE_CHECKING:
    from perfmon_analysis.buffers import RankState

OUTLIER_RATIO = 3.0        # a step at least 3x the run's median is an outlier (docs/verdict.md)
OUTLIERS_KEPT = 5          # the longest outliers listed per job
OUTLIER_SCAN = 512         # the rank's latest steps searched for outliers (the buffer holds ~2,000)
TYPICAL_STEPS = 200        # the latest steps whose phase medians say what a step usually spends
CAUSE_SHARE = 0.5          # a cause explains an outlier when it holds half of its time over the median


@dataclass(frozen=True)
class StepTimes:
    """Percentiles of step times (seconds) over ``n`` steps; ``max_step`` is the longest one's number."""

    n: int
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None
    max_step: int | None = None

    def as_json(self) -> dict[str, float | int | None]:
        return {"steps": self.n, "p50_s": self.p50, "p90_s": self.p90, "p99_s": self.p99, "max_s": self.max,
                "max_step": self.max_step}


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default), ``ordered`` ascending."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def window_times(steps: Sequence[StepReading]) -> StepTimes:
    """Exact percentiles of the window's steps."""
    if not steps:
        return StepTimes(0)
    ordered = sorted(s.dur for s in steps)
    longest = max(steps, key=lambda s: s.dur)
    return StepTimes(len(steps), _quantile(ordered, 0.5), _quantile(ordered, 0.9), _quantile(ordered, 0.99),
                     longest.dur, longest.step)


def run_times(sketch: DurationSketch) -> StepTimes:
    """The run's percentiles, from the rank's sketch (every step it reported but its first)."""
    if not sketch.n:
        return StepTimes(0)
    return StepTimes(sketch.n, sketch.quantile(0.5), sketch.quantile(0.9), sketch.quantile(0.99), sketch.max,
                     sketch.max_step)


def job_times(per_rank: Iterable[StepTimes]) -> StepTimes:
    """The job's: the slowest rank's at each percentile (in a synchronous job the slowest sets the
    pace, as for the median step time), the most steps of any rank."""
    rows = [t for t in per_rank if t.n]
    if not rows:
        return StepTimes(0)
    longest = max(rows, key=lambda t: t.max or 0.0)

    def worst(values: Iterable[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return StepTimes(max(t.n for t in rows), worst(t.p50 for t in rows), worst(t.p90 for t in rows),
                     worst(t.p99 for t in rows), longest.max, longest.max_step)


# -- outliers ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outlier:
    """A step at least ``OUTLIER_RATIO`` times the run's median, and what ran in it.

    ``cause``: ``eval`` (eval-shaped work before it), ``pause`` (another blocking event, or time
    between steps nothing names), ``data`` (data wait), ``comm`` (exposed communication), the name of
    the phase that grew (``forward``, ``other``...), or ``unknown``; ``what``: that, in words;
    ``cause_s``: its seconds in this step."""

    rank: int
    step: int
    dur: float
    ratio: float
    cause: str
    what: str
    cause_s: float | None

    def as_json(self) -> dict[str, object]:
        return {"rank": self.rank, "step": self.step, "dur_s": self.dur, "ratio": round(self.ratio, 2),
                "cause": self.cause, "what": self.what, "cause_s": self.cause_s}


def rank_outliers(state: RankState, median: float | None) -> list[Outlier]:
    """The rank's latest ``OUTLIER_SCAN`` steps (its first, lazy init, left out) at least
    ``OUTLIER_RATIO`` x ``median``."""
    steps = [s for s in itertools.islice(reversed(state.steps), OUTLIER_SCAN) if s.step > 0][::-1]
    if median is None or median <= 0 or not steps:
        return []
    long = [s for s in steps if s.dur >= OUTLIER_RATIO * median]
    if not long:
        return []
    typical = _phase_medians(steps[-TYPICAL_STEPS:])
    events = sorted((e for e in state.events if e.t is not None), key=lambda e: e.t or 0.0)
    out = []
    prev_t = {s.step: p.t for p, s in zip(steps, steps[1:])}
    for s in long:
        lo = prev_t.get(s.step, s.start)
        named = [e for e in events if e.name in BLOCKING_EVENTS and lo is not None and s.t is not None
                 and lo < (e.t or 0.0) <= s.t]
        cause, what, secs = _cause(s, median, named, typical)
        out.append(Outlier(state.rank, s.step, s.dur, s.dur / median, cause, what, secs))
    return out


def job_outliers(per_rank: Iterable[list[Outlier]]) -> tuple[Outlier, ...]:
    """The ``OUTLIERS_KEPT`` longest outliers of all ranks, longest first."""
    rows = [o for rank in per_rank for o in rank]
    return tuple(sorted(rows, key=lambda o: -o.ratio)[:OUTLIERS_KEPT])


_DATA, _COMM, _OTHER = "data", "exposed comm", "other"    # what an outlier's extra time can be in


def _phase_medians(steps: list[StepReading]) -> dict[str, float]:
    """Each phase's median over ``steps`` (a phase a step lacks counts 0), exposed communication's too."""
    names = {name for s in steps for name, _ in s.phases}
    out = {name: _quantile(sorted(s.phase(name) or 0.0 for s in steps), 0.5) for name in names}
    out[_COMM] = _quantile(sorted(s.exposed or 0.0 for s in steps), 0.5)
    return out


def _cause(step: StepReading, median: float, events: list[EventReading],
           typical: dict[str, float]) -> tuple[str, str, float | None]:
    """What holds the step's time over the median: a pause before it (named by its event), its data
    wait, its exposed communication, or the phase that grew the most."""
    excess = step.dur - median
    evals = [e for e in events if e.name in ("eval", "evaluation")]
    if evals:
        secs = sum(e.seconds or 0.0 for e in evals)
        forwards = sum(eval_forwards(e) or 0 for e in evals)
        shape = f": {forwards} training-mode forwards with no backward after them" if forwards else ""
        return "eval", f"evaluation before it{shape} ({units.seconds(secs)} between steps)", secs
    if step.gap >= CAUSE_SHARE * excess:
        names = sorted({e.name for e in events})
        label = " + ".join(names) if names else "time between steps nothing names"
        return "pause", f"{label} ({units.seconds(step.gap)} between steps)", step.gap
    grown = {name: secs - typical.get(name, 0.0) for name, secs in step.phases if name != _DATA}
    grown[_DATA] = step.data - typical.get(_DATA, 0.0)
    grown[_COMM] = (step.exposed or 0.0) - typical.get(_COMM, 0.0)
    name, more = max(grown.items(), key=lambda kv: kv[1])
    if more < CAUSE_SHARE * excess:
        return "unknown", "no measured part of the step holds most of its extra time", None
    if name == _COMM:
        return "comm", f"exposed communication {units.seconds(step.exposed or 0.0)}", step.exposed
    secs = step.data if name == _DATA else step.phase(name) or 0.0
    label = "data wait" if name == _DATA else name
    return name, f"{label} {units.seconds(secs)} (median {units.seconds(typical.get(name, 0.0))})", secs
