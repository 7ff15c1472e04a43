"""The whole run so far, bounded: downsampled series per rank and the verdict's changes.

The run model's window answers "what is slow now"; the history answers "what happened": the step
time and its losses over the whole run, memory by kind, and when the verdict changed. It feeds the
HTML report (``perfmon report --html``) and the TUI's trends screen.

Each series keeps at most ``capacity`` buckets of consecutive points. Every bucket holds ``span``
points; when the buckets are all full, neighbours merge pairwise and ``span`` doubles, so a series
of any length costs the same memory and adding a point is O(1) amortized. A bucket keeps the sum
and count of each field, and the min and max of the fields that ask for it (the step time, the
time between steps), so a one-step spike or pause survives as the bucket's max however long the
run; at most 51 KB a rank. An unknown
value (None) is left out of its field's count: a bucket whose field saw no value reads None,
never 0.
"""

from __future__ import annotations

import collections
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perfmon_analysis.readings import MemoryReading, StepReading

__all__ = [
    "BUCKETS", "History", "MEMORY_BUCKETS", "MEMORY_FIELDS", "STEP_FIELDS", "Series", "VerdictChange",
    "memory_used",
]

BUCKETS = 256            # buckets of a rank's steps: a day at 10 steps/s is ~3,400 steps a bucket, spikes kept as max
MEMORY_BUCKETS = 64      # buckets of a rank's memory readings (it moves slowly)
VERDICT_CHANGES = 512    # verdict changes kept (the oldest go first)

STEP_FIELDS = ("step", "compute", "data", "comm", "gap")
MEMORY_FIELDS = ("params", "grads", "optimizer", "activations", "cache", "other", "rss", "limit")
_NAN = float("nan")


@dataclass(frozen=True)
class Bucket:
    """Consecutive points of one series: their time and step range, and per field its mean, min and
    max over the points that knew it (None where none did, and min and max None where the series
    does not keep them)."""

    t0: float
    t1: float
    first: int          # the first and last point's label (a step number for steps; 0 otherwise)
    last: int
    n: int
    mean: tuple[float | None, ...]
    lo: tuple[float | None, ...]
    hi: tuple[float | None, ...]


class Series:
    """Points ``(t, label, values)`` downsampled into at most ``capacity`` buckets (module doc);
    ``ranged``: the fields whose min and max are kept."""

    __slots__ = ("fields", "capacity", "span", "points", "_t0", "_t1", "_first", "_last", "_n",
                 "_count", "_sum", "_ranged", "_lo", "_hi")

    def __init__(self, fields: Sequence[str], capacity: int = BUCKETS, ranged: Sequence[str] = ()) -> None:
        self.fields = tuple(fields)
        self._ranged = tuple(self.fields.index(f) for f in ranged)
        self.capacity = max(2, capacity - capacity % 2)
        self.span = 1            # points per full bucket
        self.points = 0          # points added in all
        self._t0, self._t1 = array("d"), array("d")
        self._first, self._last, self._n = array("q"), array("q"), array("q")
        k = len(self.fields)
        self._count = [array("q") for _ in range(k)]
        self._sum = [array("d") for _ in range(k)]
        self._lo = {f: array("d") for f in self._ranged}
        self._hi = {f: array("d") for f in self._ranged}

    def __len__(self) -> int:
        return len(self._n)

    def add(self, t: float, values: Sequence[float | None], label: int = 0) -> None:
        """Append one point; ``values`` in ``fields`` order, None where unknown."""
        self.points += 1
        if not self._n or self._n[-1] >= self.span:
            if len(self._n) >= self.capacity:
                self._halve()
            if not self._n or self._n[-1] >= self.span:
                self._open(t, label)
        i = len(self._n) - 1
        self._t1[i] = t
        self._last[i] = label
        self._n[i] += 1
        for f, v in enumerate(values):
            if v is None or v != v:
                continue
            if f in self._lo:
                if self._count[f][i] == 0:
                    self._lo[f][i] = self._hi[f][i] = v
                else:
                    if v < self._lo[f][i]:
                        self._lo[f][i] = v
                    if v > self._hi[f][i]:
                        self._hi[f][i] = v
            self._count[f][i] += 1
            self._sum[f][i] += v

    def _open(self, t: float, label: int) -> None:
        self._t0.append(t)
        self._t1.append(t)
        self._first.append(label)
        self._last.append(label)
        self._n.append(0)
        for f in range(len(self.fields)):
            self._count[f].append(0)
            self._sum[f].append(0.0)
        for f in self._ranged:
            self._lo[f].append(_NAN)
            self._hi[f].append(_NAN)

    def _halve(self) -> None:
        """Merge neighbouring buckets pairwise (the last one alone when their number is odd)."""
        pairs = range(0, len(self._n), 2)

        def merged(arr: array[Any], how: str) -> array[Any]:     # counts ("q") and values ("d") alike
            out: array[Any] = array(arr.typecode)
            for j in pairs:
                if j + 1 == len(arr):
                    out.append(arr[j])
                elif how == "first":
                    out.append(arr[j])
                elif how == "last":
                    out.append(arr[j + 1])
                elif how == "sum":
                    out.append(arr[j] + arr[j + 1])
                elif how == "lo":
                    out.append(_nanmin(arr[j], arr[j + 1]))
                else:
                    out.append(_nanmax(arr[j], arr[j + 1]))
            return out

        self._t0, self._first = merged(self._t0, "first"), merged(self._first, "first")
        self._t1, self._last = merged(self._t1, "last"), merged(self._last, "last")
        self._n = merged(self._n, "sum")
        self._count = [merged(a, "sum") for a in self._count]
        self._sum = [merged(a, "sum") for a in self._sum]
        self._lo = {f: merged(a, "lo") for f, a in self._lo.items()}
        self._hi = {f: merged(a, "hi") for f, a in self._hi.items()}
        self.span *= 2

    def buckets(self) -> list[Bucket]:
        out = []
        k = range(len(self.fields))
        for i in range(len(self._n)):
            counts = [self._count[f][i] for f in k]
            out.append(Bucket(
                t0=self._t0[i], t1=self._t1[i], first=self._first[i], last=self._last[i], n=self._n[i],
                mean=tuple(self._sum[f][i] / counts[f] if counts[f] else None for f in k),
                lo=tuple(self._lo[f][i] if counts[f] and f in self._lo else None for f in k),
                hi=tuple(self._hi[f][i] if counts[f] and f in self._hi else None for f in k)))
        return out

    def column(self, name: str) -> list[tuple[float, float | None]]:
        """(bucket middle time, mean of field ``name``) per bucket."""
        f = self.fields.index(name)
        return [((self._t0[i] + self._t1[i]) / 2, self._sum[f][i] / self._count[f][i] if self._count[f][i] else None)
                for i in range(len(self._n))]


def _nanmin(a: float, b: float) -> float:
    return b if a != a else a if b != b else min(a, b)


def _nanmax(a: float, b: float) -> float:
    return b if a != a else a if b != b else max(a, b)


def step_values(step: StepReading) -> tuple[float | None, ...]:
    """A step's ``STEP_FIELDS``: its wall time and the parts it splits into (compute = the active time
    less data wait and exposed communication, as in the window's statistics; comm None unmeasured)."""
    active = max(0.0, step.dur - step.gap)
    exposed = step.exposed
    compute = max(0.0, active - step.data - (exposed or 0.0))
    return (step.dur, compute, step.data, exposed, step.gap)


def memory_values(mem: MemoryReading) -> tuple[float | None, ...]:
    """A memory reading's ``MEMORY_FIELDS`` (a CPU job has only its resident set and limit)."""
    return (mem.params, mem.grads, mem.optimizer, mem.activations, mem.cache, mem.other, mem.rss, mem.limit)


def memory_used(values: Sequence[float | None]) -> float | None:
    """Memory in use from ``MEMORY_FIELDS`` values (a bucket's means, or one reading's): the
    allocator's kinds summed where known (a GPU job), else the resident set (a CPU job)."""
    kinds = [v for v in values[:6] if v is not None]
    return sum(kinds) if kinds else values[MEMORY_FIELDS.index("rss")]


@dataclass(frozen=True)
class TrendPoint:
    """One time slice of the job (``History.trend``): each step field's mean, the step time's range."""

    t: float
    mean: tuple[float | None, ...]
    lo: float
    hi: float


@dataclass(frozen=True)
class VerdictChange:
    """The verdict became ``bottleneck`` at ``t`` (the view's instant)."""

    t: float
    bottleneck: str
    severity: str
    headline: str


class RankHistory:
    """One rank's series (the newest generation and its predecessors, in arrival order)."""

    __slots__ = ("rank", "host", "steps", "memory", "memory_peak", "memory_limit")

    def __init__(self, rank: int, host: str | None, capacity: int) -> None:
        self.rank = rank
        self.host = host
        self.memory_peak: float | None = None     # the most memory used (``memory_used``) of any reading
        self.memory_limit: float | None = None    # the newest limit read
        self.steps = Series(STEP_FIELDS, capacity, ranged=("step", "gap"))
        self.memory = Series(MEMORY_FIELDS, min(capacity, MEMORY_BUCKETS), ranged=("rss",))


class History:
    """Every rank's downsampled series and the verdict's changes (module doc). Bounded: per rank two
    series of ``capacity`` buckets; at most ``VERDICT_CHANGES`` changes."""

    def __init__(self, capacity: int = BUCKETS) -> None:
        self.capacity = capacity
        self.ranks: dict[int, RankHistory] = {}
        self.verdicts: collections.deque[VerdictChange] = collections.deque(maxlen=VERDICT_CHANGES)

    def _rank(self, rank: int, host: str | None) -> RankHistory:
        hist = self.ranks.get(rank)
        if hist is None:
            hist = self.ranks[rank] = RankHistory(rank, host, self.capacity)
        elif host and not hist.host:
            hist.host = host
        return hist

    def add_step(self, rank: int, host: str | None, step: StepReading) -> None:
        if step.t is not None:
            self._rank(rank, host).steps.add(step.t, step_values(step), step.step)

    def add_memory(self, rank: int, host: str | None, mem: MemoryReading) -> None:
        if mem.t is None:
            return
        hist = self._rank(rank, host)
        values = memory_values(mem)
        hist.memory.add(mem.t, values)
        used = memory_used(values)
        if used is not None and (hist.memory_peak is None or used > hist.memory_peak):
            hist.memory_peak = used
        if mem.limit is not None:
            hist.memory_limit = mem.limit

    def closest_to_memory_limit(self) -> RankHistory | None:
        """The rank whose peak came closest to its limit (the largest peak where no rank has a limit)."""
        ranks = [h for h in self.ranks.values() if h.memory_peak is not None]
        limited = [h for h in ranks if h.memory_limit]
        if limited:
            return max(limited, key=lambda h: (h.memory_peak or 0.0) / (h.memory_limit or 1.0))
        return max(ranks, key=lambda h: h.memory_peak or 0.0, default=None)

    def note_verdict(self, t: float, bottleneck: str, severity: str, headline: str) -> None:
        """Keep the verdict at ``t`` when it differs from the last one kept."""
        last = self.verdicts[-1] if self.verdicts else None
        if last is None or last.bottleneck != bottleneck or last.severity != severity:
            if last is None or t >= last.t:
                self.verdicts.append(VerdictChange(t, bottleneck, severity, headline))

    # -- derived ----------------------------------------------------------------------------
    def span(self) -> tuple[float, float] | None:
        """(first, last) time of any step or memory point."""
        ends = [(s._t0[0], s._t1[-1]) for h in self.ranks.values() for s in (h.steps, h.memory) if len(s)]
        if not ends:
            return None
        return min(a for a, _ in ends), max(b for _, b in ends)

    def ordered_ranks(self) -> list[RankHistory]:
        """Ranks grouped by node (hosts in order of their first rank), by rank within a node."""
        by_rank = sorted(self.ranks.values(), key=lambda h: h.rank)
        first: dict[str | None, int] = {}
        for h in by_rank:
            first.setdefault(h.host, h.rank)
        return sorted(by_rank, key=lambda h: (first[h.host], h.rank))

    def trend(self, columns: int) -> list[TrendPoint]:
        """The job over time: ``columns`` equal time slices over the run; in each, every step field's
        mean over all ranks' buckets whose middle falls in it (weighted by their steps), and the
        lowest and highest step time any of them saw. Empty slices are left out."""
        span = self.span()
        if span is None or columns < 1:
            return []
        t0, t1 = span
        width = (t1 - t0) / columns or 1.0
        k = len(STEP_FIELDS)
        sums = [[0.0] * k for _ in range(columns)]
        weights = [[0] * k for _ in range(columns)]
        lo: list[float] = [_NAN] * columns
        hi: list[float] = [_NAN] * columns
        last = columns - 1
        for h in self.ranks.values():
            s = h.steps
            cols = [min(last, int(((a + b) / 2 - t0) / width)) for a, b in zip(s._t0, s._t1)]
            for f in range(k):      # field by field over whole arrays: a 1,024-rank run in a fraction of a second
                for c, count, total in zip(cols, s._count[f], s._sum[f]):
                    if count:
                        sums[c][f] += total
                        weights[c][f] += count
            for c, count, low, high in zip(cols, s._count[0], s._lo[0], s._hi[0]):
                if count:
                    lo[c] = _nanmin(lo[c], low)
                    hi[c] = _nanmax(hi[c], high)
        return [TrendPoint(t=t0 + width * (c + 0.5),
                           mean=tuple(sums[c][f] / weights[c][f] if weights[c][f] else None for f in range(k)),
                           lo=lo[c], hi=hi[c])
                for c in range(columns) if weights[c][0]]

    def grid(self, field: str, columns: int, share: bool = False) -> tuple[list[float], list[RankHistory],
                                                                              list[list[float | None]]]:
        """A rank × time matrix of field ``field`` (``share``: as a share of the step's active time):
        ``columns`` equal time slices over the run, each cell the mean over the rank's buckets whose
        middle falls in it (None where none does). Returns (slice edges, ranks in node order, rows)."""
        span = self.span()
        ranks = self.ordered_ranks()
        if span is None or columns < 1:
            return [], ranks, [[] for _ in ranks]
        t0, t1 = span
        width = (t1 - t0) / columns or 1.0
        edges = [t0 + width * c for c in range(columns + 1)]
        f = STEP_FIELDS.index(field)
        g = STEP_FIELDS.index("gap")
        rows = []
        for h in ranks:
            sums = [0.0] * columns
            weights = [0] * columns
            s = h.steps
            for i in range(len(s)):
                count = s._count[f][i]
                if not count:
                    continue
                value = s._sum[f][i] / count
                if share:
                    active = (s._sum[0][i] - s._sum[g][i]) / max(1, s._count[0][i])
                    if active <= 0:
                        continue
                    value /= active
                c = min(columns - 1, int(((s._t0[i] + s._t1[i]) / 2 - t0) / width))
                sums[c] += value * s._n[i]
                weights[c] += s._n[i]
            rows.append([sums[c] / weights[c] if weights[c] else None for c in range(columns)])
        return edges, ranks, rows

