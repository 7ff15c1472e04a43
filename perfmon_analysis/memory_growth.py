"""Memory over time: does the job's memory grow step after step (a leak)? (docs/verdict.md, "Memory
growth").

A rank's series is its own memory as it reports it: a CPU job's resident set (the samples' RSS), a
CUDA job's allocated bytes (``memory`` records; reserved where allocated is not sent). Each reading
is placed at the step count reached by its time, so the growth is in bytes per step, the rate a
leak has whatever the step time. Growth is *steady* (a leak, not a warm-up) when:

* the readings span at least ``MIN_STEPS`` steps with at least ``MIN_POINTS`` readings, the first
  step (lazy initialisation) left out;
* a least-squares line fits them (R² >= ``MIN_FIT``): memory rises with the steps, not in one jump;
* the later half of the readings still rises at half the overall rate or more: a warm-up (allocator
  caches, optimizer state made at the first step) levels off, a leak does not;
* it grew by at least ``MIN_GROWTH_BYTES`` and ``MIN_GROWTH_SHARE`` of where it started over the span.

What grows is named from the memory breakdown (``memory`` records: params, grads, optimizer,
activations, cache, other): the kind that rose the most between the first and last breakdown in the
span. Pure: the rank's buffers in, a ``MemoryGrowth`` out.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfmon_analysis.readings import MemoryReading, StepReading

if TYPE_CHECKING:
    from perfmon_analysis.buffers import RankState

MIN_POINTS = 6
MIN_STEPS = 10
MIN_FIT = 0.8
MIN_LATE_RATE = 0.5
MIN_GROWTH_BYTES = 16 << 20
MIN_GROWTH_SHARE = 0.05
KINDS = ("params", "grads", "optimizer", "activations", "cache", "other")
SERIES_LABEL = {"rss": "host RSS", "allocated": "CUDA allocated", "reserved": "CUDA reserved"}


@dataclass(frozen=True)
class MemoryGrowth:
    """One rank's memory series over the steps it spans: its fitted growth and whether it is steady.

    ``per_step``/``per_s``: bytes per step and per second (the fitted slope); ``first``/``last``: the
    first and last readings (bytes); ``kind``: the breakdown kind that grew most (``kind_per_step``
    its bytes per step), None without two breakdowns in the span; ``steps_to_limit``: steps until the
    fitted line reaches ``limit`` (None without a limit or growth; 0 at or past it)."""

    rank: int
    series: str
    per_step: float
    per_s: float | None
    steps: int
    points: int
    first: int
    last: int
    fit: float
    steady: bool
    kind: str | None = None
    kind_per_step: float | None = None
    limit: int | None = None
    steps_to_limit: int | None = None

    @property
    def label(self) -> str:
        return SERIES_LABEL.get(self.series, self.series)

    def as_json(self) -> dict[str, object]:
        return {"rank": self.rank, "series": self.series, "steady": self.steady,
                "per_step_bytes": round(self.per_step), "per_s_bytes": _round(self.per_s), "steps": self.steps,
                "points": self.points, "first_bytes": self.first, "last_bytes": self.last, "fit": round(self.fit, 3),
                "kind": self.kind, "kind_per_step_bytes": _round(self.kind_per_step), "limit_bytes": self.limit,
                "steps_to_limit": self.steps_to_limit}


def _round(x: float | None) -> int | None:
    return None if x is None else round(x)


def rank_growth(state: RankState, limit: int | None = None) -> MemoryGrowth | None:
    """The rank's memory growth, None when its readings are too few or span too few steps to tell."""
    steps = state.steps
    if len(steps) < 2 or steps[-1].t is None:
        return None
    first_step = steps[0].step if steps[0].step > 0 else steps[1].step
    mems = [m for m in state.memory if m.t is not None]
    device = [m for m in mems if not m.on_host]
    if device:
        series = "allocated" if any(m.allocated is not None for m in device) else "reserved"
        raw = [(m.t, m.allocated if series == "allocated" else m.reserved) for m in device]
    else:
        series = "rss"
        raw = [(s.t, s.host.rss) for s in state.samples]
    points = [(x, float(v)) for t, v in raw if t is not None and v is not None
              for x in [_step_at(steps, t)] if x is not None and x >= first_step]
    if len(points) < MIN_POINTS or points[-1][0] - points[0][0] < MIN_STEPS:
        return None
    slope, fit = _line(points)
    half = points[len(points) // 2:]
    late, _ = _line(half) if len(half) >= 3 and half[-1][0] > half[0][0] else (0.0, 0.0)
    first, last = int(points[0][1]), int(points[-1][1])
    span = points[-1][0] - points[0][0]
    grown = slope * span
    steady = (slope > 0 and fit >= MIN_FIT and late >= MIN_LATE_RATE * slope
              and grown >= max(MIN_GROWTH_BYTES, MIN_GROWTH_SHARE * first))
    rate = _per_second(steps)
    kind, kind_rate = _growing_kind([m for m in mems if (_step_at(steps, m.t or 0.0) or 0.0) >= first_step], steps)
    to_limit = None
    if limit and slope > 0:
        to_limit = max(0, int((limit - last) / slope))
    return MemoryGrowth(state.rank, series, slope, slope * rate if rate else None, int(span), len(points), first, last,
                        fit, steady, kind, kind_rate, limit, to_limit)


def job_growth(rows: Iterable[MemoryGrowth | None]) -> MemoryGrowth | None:
    """The job's: a steady growth first, then the fastest."""
    known = [g for g in rows if g is not None]
    return max(known, key=lambda g: (g.steady, g.per_step), default=None)


def _step_at(steps: Sequence[StepReading], t: float) -> float | None:
    """The step count at time ``t``, interpolated between the ends of ``steps`` (in time order; None
    before the first). A binary search: the buffer holds ~2,000 steps, the series ~150 readings."""
    i = bisect.bisect_right(steps, t, key=_end)
    if i == 0:
        return None
    if i == len(steps):
        return float(steps[-1].step)
    a, b = steps[i - 1], steps[i]
    t0, t1 = _end(a), _end(b)
    return a.step + (b.step - a.step) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)


def _end(step: StepReading) -> float:
    return step.t if step.t is not None else float("-inf")


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of ``points`` and its R² (1 for a flat line through them)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    syy = sum((y - my) ** 2 for _, y in points)
    if sxx <= 0:
        return 0.0, 0.0
    slope = sxy / sxx
    fit = (sxy * sxy) / (sxx * syy) if syy > 0 else 1.0
    return slope, fit


def _per_second(steps: Sequence[StepReading]) -> float | None:
    """Steps per second over the buffered steps."""
    a, b = steps[0], steps[-1]
    t0, t1 = _end(a), _end(b)
    return (b.step - a.step) / (t1 - t0) if t1 > t0 and t0 > float("-inf") else None


def _growing_kind(mems: list[MemoryReading], steps: Sequence[StepReading]) -> tuple[str | None, float | None]:
    """The breakdown kind that rose the most between the first and last breakdown, per step."""
    with_kinds = [m for m in mems if any(getattr(m, k) is not None for k in KINDS)]
    if len(with_kinds) < 2:
        return None, None
    a, b = with_kinds[0], with_kinds[-1]
    xa, xb = _step_at(steps, a.t or 0.0), _step_at(steps, b.t or 0.0)
    if xa is None or xb is None or xb <= xa:
        return None, None
    rises = {k: (getattr(b, k) or 0) - (getattr(a, k) or 0) for k in KINDS}
    kind, rise = max(rises.items(), key=lambda kv: kv[1])
    return (kind, rise / (xb - xa)) if rise > 0 else (None, None)
