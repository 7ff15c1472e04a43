"""Two runs side by side: did the candidate get slower than the baseline, by how much, and why.

Pure: ``compare(baseline, candidate)`` takes two ``Analysis`` objects of whole runs
(``whole_run()``) and returns the ``perfmon.compare/1`` dict (``tui/schemas/compare.schema.json``);
``render_text`` prints that dict. docs/compare.md is the user's description.

The decision is on the step time, per step, over every step of both runs (the slowest rank's
time on each step number all ranks reported), less a warm-up. Steps in one run are not
independent (a slow phase lasts several steps), so a t-interval over the steps would be far too
narrow: the steps are cut into contiguous batches, each batch's median is its typical step (one
preempted step does not move it), and the interval is Welch's over those batch medians (the
batch-means method), at 95%. A change is significant when that interval leaves out 0, and it is
called a regression (or an improvement) only when it is also at least ``min_change``: two runs of
one job on a shared machine differ by a few percent in ways no interval over one run's steps can
see.

What moved: each measured loss (``perfmon_analysis.losses``) as seconds of each run's typical step,
its difference in points of the baseline's typical step; the rest of the difference is compute and
what no loss measures. An unknown loss is listed as unknown, never counted as 0.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from perfmon_analysis import units
from perfmon_analysis.analysis import Analysis, Snapshot
from perfmon_analysis.buffers import MIN_STEPS, STEP_BUFFER
from perfmon_analysis.losses import Loss
from perfmon_analysis.metrics import COMPARED, MEMORY_PEAK, Metric, Unit, by_name, loss_metrics, rounded
from perfmon_analysis.readings import StepReading
from perfmon_analysis.verdict import label as outcome_label

__all__ = [
    "StepChange", "compare", "decide", "job_steps", "parse_limits", "render_text", "step_change", "t_quantile",
    "whole_run",
]

SCHEMA = "perfmon.compare/1"
CONFIDENCE = 0.95
MIN_CHANGE = 0.10        # default: smaller step-time changes may be the machine, not the job (docs/compare.md)
MOVED = 0.02             # a loss moved when its time per step changed by 2 points of the baseline step or more
BATCH_STEPS = 5          # the fewest steps in a batch
MAX_BATCHES = 10         # fewer, longer batches: a slow phase of ~10 steps still leaves 95% coverage
WARMUP = 10              # default: steps a run takes to settle (loader workers starting, allocator, caches)
MIN_BATCHES = 3          # fewer: no interval (Welch's df would be under 2)


def whole_run() -> Analysis:
    """An analysis whose window is every step the run model holds, so the metrics, the losses and
    the per-step samples all describe the whole run."""
    return Analysis(window_steps=STEP_BUFFER, window_seconds=math.inf)


# -- the step-time interval ---------------------------------------------------------------------
@dataclass(frozen=True)
class JobStep:
    """One step of the job: the slowest rank's wall time on that step number."""

    dur: float


def job_steps(by_rank: dict[int, list[StepReading]]) -> list[JobStep]:
    """Per step number every rank reported, the slowest rank's step (it sets the job's pace)."""
    ranks = [{s.step: s for s in steps} for steps in by_rank.values() if steps]
    if not ranks:
        return []
    common = sorted(set.intersection(*(set(r) for r in ranks)))
    out = []
    for n in common:
        slowest = max((r[n] for r in ranks), key=lambda s: s.dur)
        out.append(JobStep(slowest.dur))
    return out


def batch_medians(xs: list[float]) -> list[float]:
    """The medians of up to ``MAX_BATCHES`` contiguous batches of at least ``BATCH_STEPS`` steps: a
    batch's median is its typical step, which one preempted step does not move."""
    k = min(MAX_BATCHES, len(xs) // BATCH_STEPS)
    return [statistics.median(xs[i * len(xs) // k:(i + 1) * len(xs) // k]) for i in range(k)]


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile by its Cornish-Fisher expansion (within 1% of the table for df >= 2)."""
    z = statistics.NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / (92160 * df ** 4))


@dataclass(frozen=True)
class StepChange:
    """The typical step time of each run (the mean of its batch medians) and the relative change
    with its confidence interval."""

    baseline_s: float
    candidate_s: float
    change: float            # candidate / baseline - 1
    low: float
    high: float
    steps: tuple[int, int]
    batches: tuple[int, int]

    @property
    def significant(self) -> bool:
        return self.low > 0 or self.high < 0

    def as_json(self) -> dict[str, Any]:
        return {"statistic": "mean of batch medians", "baseline_s": rounded(self.baseline_s),
                "candidate_s": rounded(self.candidate_s), "change": rounded(self.change),
                "ci_low": rounded(self.low), "ci_high": rounded(self.high), "confidence": CONFIDENCE,
                "method": "batch medians, Welch t", "steps": list(self.steps), "batches": list(self.batches)}


def step_change(base: list[float], cand: list[float]) -> StepChange | str:
    """The interval on the typical step time's change, or why there is none."""
    for name, xs in (("baseline", base), ("candidate", cand)):
        if len(xs) < MIN_BATCHES * BATCH_STEPS:
            return f"the {name} has {len(xs)} steps past its warm-up; an interval needs {MIN_BATCHES * BATCH_STEPS}"
    bb, bc = batch_medians(base), batch_medians(cand)
    mb, mc = statistics.fmean(bb), statistics.fmean(bc)
    vb, vc = statistics.variance(bb) / len(bb), statistics.variance(bc) / len(bc)
    se = math.sqrt(vb + vc)
    if se > 0:
        df = (vb + vc) ** 2 / (vb ** 2 / (len(bb) - 1) + vc ** 2 / (len(bc) - 1))
        half = t_quantile(0.5 + CONFIDENCE / 2, max(df, MIN_BATCHES - 1)) * se
    else:
        half = 0.0
    return StepChange(mb, mc, mc / mb - 1, (mc - mb - half) / mb, (mc - mb + half) / mb,
                      (len(base), len(cand)), (len(bb), len(bc)))


def decide(change: StepChange | str, min_change: float) -> str:
    """'regression' | 'improvement' | 'no significant change' | 'unknown'."""
    if isinstance(change, str):
        return "unknown"
    if change.significant and change.change >= min_change:
        return "regression"
    if change.significant and change.change <= -min_change:
        return "improvement"
    return "no significant change"


# -- what moved ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Moved:
    """One loss in both runs: its shares and its change in points of the baseline's typical step."""

    loss: str
    label: str
    baseline: float | None
    candidate: float | None
    points: float | None
    why_unknown: str | None = None

    def as_json(self) -> dict[str, Any]:
        out = {"loss": self.loss, "label": self.label, "metric": loss_metrics().get(self.loss),
               "baseline_share": rounded(self.baseline), "candidate_share": rounded(self.candidate),
               "points": rounded(self.points)}
        if self.why_unknown is not None:
            out["why_unknown"] = self.why_unknown
        return out


def _seconds(loss: Loss, typical: float) -> float | None:
    """The loss's seconds in a typical step: every share is of the iteration (docs/verdict.md, "One whole")."""
    return None if loss.share is None else loss.share * typical


def attribute(base: tuple[Loss, ...], cand: tuple[Loss, ...], change: StepChange) -> tuple[list[Moved], float | None]:
    """Each loss's change in points of the baseline's typical step, largest first (unknown last), and
    the rest of the step's change: compute and what no loss measures (None when a loss is unknown)."""
    cand_by = {x.id: x for x in cand}
    rows, known_sum, all_known = [], 0.0, True
    for b in base:
        c = cand_by.get(b.id)
        if c is None:
            continue
        sb, sc = _seconds(b, change.baseline_s), _seconds(c, change.candidate_s)
        if sb is None or sc is None:
            all_known = False
            why = "; ".join(f"{name}: {x.source}" for name, x in (("baseline", b), ("candidate", c)) if not x.known)
            rows.append(Moved(b.id, b.label, b.share, c.share, None, why))
            continue
        points = (sc - sb) / change.baseline_s
        known_sum += points
        rows.append(Moved(b.id, b.label, b.share, c.share, points))
    rows.sort(key=lambda m: (m.points is None, -abs(m.points or 0.0)))
    return rows, (change.change - known_sum) if all_known else None


# -- the side-by-side table ---------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One compared quantity: a metric (``perfmon_analysis.metrics.COMPARED`` and the losses'), its
    label, and which way is worse (the metric's ``worse``)."""

    metric: Metric
    label: str

    @property
    def name(self) -> str:
        return self.metric.name

    @property
    def worse(self) -> str | None:
        return self.metric.worse


ROWS = tuple(Row(metric, label) for metric, label in COMPARED)


def _rows(view_losses: tuple[Loss, ...]) -> list[Row]:
    names = loss_metrics()
    return [*ROWS, *(Row(m, x.label) for x in view_losses if x.id in names
                     for m in (by_name(names[x.id]),) if m is not None)]


def is_share(name: str) -> bool:
    """A share of the step (its change is in points) rather than an amount (its change is relative)."""
    metric = by_name(name)
    return metric is not None and metric.unit is Unit.RATIO


def limitable() -> list[str]:
    """The names ``--limit NAME=VALUE`` accepts: every compared quantity with a worse direction."""
    names = [r.name for r in ROWS if r.worse is not None]
    return names + [n for n in loss_metrics().values() if n not in names]


def _value(row: Row, snap: Snapshot) -> Any:
    return row.metric.job_value(snap.view)


def _change(name: str, base: Any, cand: Any) -> float | None:
    if base is None or cand is None or isinstance(base, (bool, str)):
        return None
    change: float | None = (cand - base if is_share(name)          # metric values are numbers from here on
                            else cand / base - 1 if base else None)
    return change


def _worsening(row: Row, change: float | None) -> float | None:
    """How much worse the candidate is (negative: better), in the change's own terms."""
    if change is None or row.worse is None:
        return None
    return change if row.worse == "up" else -change


# -- the comparison -----------------------------------------------------------------------------
def compare(baseline: Analysis, candidate: Analysis, *, min_change: float = MIN_CHANGE, warmup: int = WARMUP,
            max_regression: float | None = None, limits: dict[str, float] | None = None,
            sources: tuple[dict[str, Any], dict[str, Any]] = ({}, {})) -> dict[str, Any]:
    """The ``perfmon.compare/1`` dict. ``min_change``: the least step-time change called a regression
    or an improvement; ``warmup``: the first steps of each run left out of everything compared (each
    analysis's window is narrowed to the rest); ``max_regression``: the step-time change (0.10 =
    10%) that a significant slowdown may not pass, whatever ``min_change`` says; ``limits``: name ->
    the most a quantity of ``limitable()`` may worsen (a share in points, 0.05 = 5 points; anything
    else relative, 0.10 = 10%)."""
    for analysis in (baseline, candidate):
        held = max((len(s) for s in analysis.steps_in_window().values()), default=0)
        analysis.set_window(max(held - warmup, MIN_STEPS), math.inf)
    snaps = baseline.snapshot(), candidate.snapshot()
    steps = tuple(job_steps(a.steps_in_window()) for a in (baseline, candidate))
    change = step_change([s.dur for s in steps[0]], [s.dur for s in steps[1]])
    decision = decide(change, min_change)
    moved, rest = ([], None) if isinstance(change, str) else \
        attribute(snaps[0].verdict.losses, snaps[1].verdict.losses, change)

    rows, changes = [], {}
    compared = _rows(snaps[0].verdict.losses)
    for row in compared:
        b, c = _value(row, snaps[0]), _value(row, snaps[1])
        changes[row.name] = _change(row.name, b, c)
        rows.append({"name": row.name, "label": row.label, "baseline": rounded(b), "candidate": rounded(c),
                     "change": rounded(changes[row.name]),
                     "change_in": "points" if is_share(row.name) else "relative", "worse": row.worse})

    checks, over_limit = [], False
    if max_regression is not None:
        if isinstance(change, str):
            checks.append({"metric": "step_time", "limit": max_regression, "value": None, "status": "unknown",
                           "why": change})
        else:
            over_limit = change.significant and change.change > max_regression
            checks.append({"metric": "step_time", "limit": max_regression, "value": rounded(change.change),
                           "status": "over" if over_limit else "ok"})
    by_row = {r.name: r for r in compared}
    for name, limit in (limits or {}).items():
        worse = _worsening(by_row[name], changes[name])
        if worse is None:
            checks.append({"metric": name, "limit": limit, "value": None, "status": "unknown",
                           "why": "not measured in both runs"})
        else:
            over_limit = over_limit or worse > limit
            checks.append({"metric": name, "limit": limit, "value": rounded(worse),
                           "status": "over" if worse > limit else "ok"})

    result = {
        "schema": SCHEMA,
        "baseline": _side(snaps[0], sources[0], len(steps[0])),
        "candidate": _side(snaps[1], sources[1], len(steps[1])),
        "decision": decision,
        "min_change": min_change,
        "step_time": change.as_json() if isinstance(change, StepChange) else {"why_unknown": change},
        "moved": [m.as_json() for m in moved],
        "rest_points": rounded(rest),
        "metrics": rows,
        "limits": checks,
        "over_limit": over_limit,
    }
    result["summary"] = summary(result)
    return result


def _side(snap: Snapshot, source: dict[str, Any], steps: int) -> dict[str, Any]:
    return {"job": snap.view.job, "world_size": snap.view.world_size, "device": snap.view.device_type,
            "steps": steps, "bottleneck": snap.verdict.bottleneck, "headline": snap.verdict.headline,
            "source": source}


# -- text ---------------------------------------------------------------------------------------
def _moved_words(result: dict[str, Any]) -> list[str]:
    words = [f"{m['label']} {units.points(m['points'])}" for m in result["moved"]
             if m["points"] is not None and abs(m["points"]) >= MOVED]
    rest = result["rest_points"]
    if rest is not None and abs(rest) >= MOVED:
        words.append(f"compute and the rest {units.points(rest)}")
    return words


def summary(result: dict[str, Any]) -> str:
    """One line: the decision, the step-time change with its interval, what moved, the verdicts."""
    st = result["step_time"]
    if "why_unknown" in st:
        return f"step time change unknown: {st['why_unknown']}"
    line = (f"{result['decision']}: step time {units.change(st['change'], 1)} "
            f"(95% CI {units.change(st['ci_low'], 1)} to {units.change(st['ci_high'], 1)})")
    words = _moved_words(result)
    if words and result["decision"] != "no significant change":
        line += ": " + ", ".join(words)
    b, c = result["baseline"]["bottleneck"], result["candidate"]["bottleneck"]
    if b != c:
        line += f"; verdict {outcome_label(b)} -> {outcome_label(c)}"
    return line


def _fmt(name: str, value: Any) -> str:
    if value is None:
        return units.NA
    if name == MEMORY_PEAK.name:
        return units.nbytes(value)
    metric = by_name(name)
    unit = metric.unit if metric is not None else Unit.COUNT
    if unit is Unit.SECONDS:
        return units.seconds(value)
    if unit is Unit.PER_SECOND:
        return units.rate(value)
    if unit in (Unit.RATIO, Unit.CORES):
        return units.pct(value)
    return units.count(value)


def _fmt_change(row: dict[str, Any]) -> str:
    if row["change"] is None:
        return ""
    return units.points(row["change"]) if row["change_in"] == "points" else units.change(row["change"])


def render_text(result: dict[str, Any], width: int = 80) -> str:
    """The comparison as text: the decision, what moved, the table, the limits."""
    lines = [f"perfmon compare: {result['summary']}", ""]
    for side in ("baseline", "candidate"):
        s = result[side]
        lines.append(f"{side:>9}: {s['job'] or units.NA}, {s['steps']} steps, verdict {outcome_label(s['bottleneck'])}")
        where = s["source"].get("paths") or [s["source"].get("kind", "")]
        lines.append(f"{'':>11}from {where[0]}" + (f" and {len(where) - 1} more" if len(where) > 1 else ""))
    st = result["step_time"]
    if "why_unknown" not in st:
        lines.append(f"typical step: {units.seconds(st['baseline_s'])} -> {units.seconds(st['candidate_s'])} "
                     f"(means of {st['batches'][0]} and {st['batches'][1]} batch medians)")
        lines.append(f"a regression or an improvement: a significant change of {units.pct(result['min_change'])} "
                     "or more")
    lines += ["", f"{'':<30}{'baseline':>14}{'candidate':>14}{'change':>12}"]
    for row in result["metrics"]:
        lines.append(f"{row['label'][:30]:<30}{_fmt(row['name'], row['baseline']):>14}"
                     f"{_fmt(row['name'], row['candidate']):>14}{_fmt_change(row):>12}")
    if result["moved"]:
        lines += ["", "what moved (points of the baseline's typical step):"]
        for m in result["moved"]:
            lines.append(f"  {m['label']:<30}{units.points(m['points']):>12}"
                         + (f"  ({m['why_unknown']})" if m.get("why_unknown") else ""))
        lines.append(f"  {'compute and the rest':<30}{units.points(result['rest_points']):>12}")
    if result["limits"]:
        lines += ["", "limits:"]
        for c in result["limits"]:
            value = units.NA if c["value"] is None else _limit_value(c["metric"], c["value"])
            lines.append(f"  {c['metric']}: {value} worse, limit {_limit_value(c['metric'], c['limit'])}: "
                         f"{c['status'].upper()}" + (f" ({c['why']})" if c.get("why") else ""))
    out = []
    for line in lines:    # a path is left whole; the rest wraps to ``width``
        whole = line.lstrip().startswith("from ")
        out += [line] if whole else textwrap.wrap(line, width, subsequent_indent="    ") or [""]
    return "\n".join(out) + "\n"


def _limit_value(name: str, value: float) -> str:
    return units.points(value) if is_share(name) else units.change(value)


def parse_limits(items: Iterable[str]) -> dict[str, float]:
    """``NAME=VALUE`` pairs (VALUE in percent or points) -> name -> fraction; ValueError names the bad one."""
    out = {}
    names = limitable()
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise ValueError(f"--limit {item}: expected NAME=VALUE, NAME one of {', '.join(names)}")
        try:
            out[name] = float(value.rstrip("%")) / 100
        except ValueError:
            raise ValueError(f"--limit {item}: {value!r} is not a number") from None
    return out
