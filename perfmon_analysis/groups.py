"""Per-group reductions of a job's ranks: what a group relay sends instead of its ranks (wire 1.5
``group``), and what the viewer merges into the job (docs/tree.md).

A ``Reduction`` of one quantity over a group's ranks keeps the count, the minimum and the maximum
with the rank that holds each, and a quantile sketch; medians and quantiles of any union of groups
come from merged sketches, so the viewer's job-wide median is the median of every rank, not a median
of medians. The extremes are what the verdict's flowchart reads: its quantities take the worst rank
(``perfmon_analysis.views.Metrics``), and the straggler rule compares the fastest with the slowest
rank, so the ranks holding an extreme travel on in full (``representatives``) and the verdict runs
on them unchanged; sums (throughput) come from the groups' sums.

Groups are keyed by a generic ``(dimension, value)`` pair: ``("group", "g03")`` for the relay tree's
own groups of nodes. Any other grouping of ranks (a pipeline stage, a data-parallel replica) is a
function from a rank's hello to a value in ``GROUPINGS``; a group relay reduces its ranks by every
key their hellos give, and the viewer merges reductions of the same key from every group relay.
Pure: no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from perfmon_analysis.sketch import SKETCH_ACCURACY, SKETCH_MIN, Sketch, is_count

__all__ = [
    "GroupReduction", "MAX_ODD_STALLED", "REPS_PER_STALL", "RankRow", "Reduction", "merge_groups", "reduce_rows",
    "representatives",
]

REPS_PER_STALL = 2          # stalled ranks in the majority's call sent on per group (the rest are counted)
MAX_ODD_STALLED = 8         # stalled ranks outside that call sent on per group (the culprits)
STICKY = SKETCH_ACCURACY    # a representative stays one while within this of the extreme it held


@dataclass(frozen=True)
class Quantity:
    """One reduced quantity: ``name`` on the wire and in the view, ``stat`` its key in a rank's
    ``summary`` stats (``perfmon_analysis.summary.STATS_PAYLOAD``), ``worst`` the end that hurts."""

    name: str
    stat: str
    worst: str          # "max" | "min"
    help: str


QUANTITIES: tuple[Quantity, ...] = (
    Quantity("step_time", "step_median", "max", "Median step time over the window, seconds"),
    Quantity("compute", "compute_median", "max", "Median compute time per step, seconds"),
    Quantity("arrival", "arrive_median", "max", "Median time from the step's start to the collective, seconds"),
    Quantity("data_wait", "data_frac", "max", "Share of the step waiting for the next batch"),
    Quantity("exposed_comm", "exposed_frac", "max", "Share of the step blocked on collectives"),
    Quantity("busy", "device_busy", "min", "Device busy share"),
    Quantity("memory", "peak_frac", "max", "Peak memory over the limit"),
)
SUMS: tuple[str, ...] = ("samples_per_s", "tokens_per_s")

# Groupings besides the tree's own: dimension -> the value a rank's hello gives (None: not known).
# A job layout (pipeline stage, data-parallel replica) adds its dimensions here.
GROUPINGS: dict[str, Callable[[dict[str, Any]], str | None]] = {}


@dataclass
class Reduction:
    """One quantity over a set of ranks: count, extremes with their holders, a sketch."""

    n: int = 0
    min: float | None = None
    min_rank: int | None = None
    min_src: str | None = None
    max: float | None = None
    max_rank: int | None = None
    max_src: str | None = None
    sketch: Sketch = field(default_factory=Sketch)

    def add(self, value: float, rank: int, src: str) -> None:
        self.n += 1
        self.sketch.add(value)
        if self.min is None or value < self.min:
            self.min, self.min_rank, self.min_src = value, rank, src
        if self.max is None or value > self.max:
            self.max, self.max_rank, self.max_src = value, rank, src

    def merge(self, other: Reduction) -> None:
        self.n += other.n
        self.sketch.merge(other.sketch)
        if other.min is not None and (self.min is None or other.min < self.min):
            self.min, self.min_rank, self.min_src = other.min, other.min_rank, other.min_src
        if other.max is not None and (self.max is None or other.max > self.max):
            self.max, self.max_rank, self.max_src = other.max, other.max_rank, other.max_src

    def quantile(self, q: float) -> float | None:
        """The sketch's q-quantile, held within the exact extremes (a bucket's value may lie past them)."""
        value = self.sketch.quantile(q)
        if value is None or self.min is None or self.max is None:
            return value
        return min(max(value, self.min), self.max)

    @property
    def median(self) -> float | None:
        return self.sketch.quantile(0.5)

    def wire(self) -> dict[str, Any]:
        return {"n": self.n, "min": self.min, "min_rank": self.min_rank, "min_src": self.min_src,
                "max": self.max, "max_rank": self.max_rank, "max_src": self.max_src, "sketch": self.sketch.wire()}

    @classmethod
    def read(cls, obj: Any) -> Reduction:
        obj = obj if isinstance(obj, dict) else {}
        lo, hi = _num(obj.get("min")), _num(obj.get("max"))
        return cls(n=obj["n"] if is_count(obj.get("n")) else 0,
                   min=lo, min_rank=_int(obj.get("min_rank")) if lo is not None else None,
                   min_src=_str(obj.get("min_src")) if lo is not None else None,
                   max=hi, max_rank=_int(obj.get("max_rank")) if hi is not None else None,
                   max_src=_str(obj.get("max_src")) if hi is not None else None,
                   sketch=Sketch.read(obj.get("sketch")))


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _str(x: Any) -> str | None:
    return x if isinstance(x, str) else None


@dataclass
class GroupReduction:
    """Every quantity of one group of ranks, with the group's sums and its stalled/silent counts.

    ``ranks``: ranks that said hello; ``timed``: those past warm-up (with a window);
    ``relays_down``: the group's node relays that are not running, by node name."""

    key: tuple[str, str]
    ranks: int = 0
    timed: int = 0
    stalled: int = 0
    silent: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    quantities: dict[str, Reduction] = field(default_factory=dict)
    relays_down: tuple[str, ...] = ()
    steps: int = 0

    @property
    def samples_per_s(self) -> float | None:
        return self.sums.get("samples_per_s")

    @property
    def tokens_per_s(self) -> float | None:
        return self.sums.get("tokens_per_s")

    def merge(self, other: GroupReduction) -> None:
        self.ranks += other.ranks
        self.timed += other.timed
        self.stalled += other.stalled
        self.silent += other.silent
        self.steps = max(self.steps, other.steps)
        for name, value in other.sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        for name, red in other.quantities.items():
            self.quantities.setdefault(name, Reduction()).merge(red)
        self.relays_down = tuple(sorted({*self.relays_down, *other.relays_down}))

    def as_json(self) -> dict[str, Any]:
        """The report's ``groups[]`` entry: counts, sums, and per quantity its extremes with their
        ranks and the median and 90th percentile (within ``SKETCH_ACCURACY``)."""
        def rounded(x: float | None) -> float | None:
            return round(x, 6) if x is not None else None
        return {"key": list(self.key), "ranks": self.ranks, "timed": self.timed, "stalled": self.stalled,
                "silent": self.silent, "relays_down": list(self.relays_down),
                "sums": {k: rounded(v) for k, v in self.sums.items()},
                "quantities": {name: {"n": q.n, "min": rounded(q.min), "min_rank": q.min_rank,
                                      "p50": rounded(q.quantile(0.5)), "p90": rounded(q.quantile(0.9)),
                                      "max": rounded(q.max), "max_rank": q.max_rank}
                               for name, q in self.quantities.items()}}

    def wire(self) -> dict[str, Any]:
        return {"key": list(self.key), "ranks": self.ranks, "timed": self.timed, "stalled": self.stalled,
                "silent": self.silent, "steps": self.steps, "sums": dict(self.sums),
                "q": {name: red.wire() for name, red in self.quantities.items()},
                "relays_down": list(self.relays_down)}

    @classmethod
    def read(cls, obj: dict[str, Any]) -> GroupReduction | None:
        """A group's reduction from a ``group`` record (or its ``keys`` entries); None when its key
        is malformed. Values of the wrong type count as unknown."""
        key = obj.get("key")
        if not (isinstance(key, list) and len(key) == 2 and all(isinstance(k, str) for k in key)):
            return None
        q = v if isinstance(v := obj.get("q"), dict) else {}
        sums = v if isinstance(v := obj.get("sums"), dict) else {}
        down = v if isinstance(v := obj.get("relays_down"), list) else []
        return cls(key=(key[0], key[1]),
                   **{k: obj[k] if is_count(obj.get(k)) else 0
                      for k in ("ranks", "timed", "stalled", "silent", "steps")},
                   sums={k: v for k in SUMS if (v := _num(sums.get(k))) is not None},
                   quantities={x.name: Reduction.read(q[x.name]) for x in QUANTITIES if x.name in q},
                   relays_down=tuple(h for h in down if isinstance(h, str)))


@dataclass(frozen=True)
class RankRow:
    """What a group relay knows of one rank: its summary's stats, its hello, whether it is stalled
    (and in which collective), and how long it has been silent."""

    src: str
    rank: int
    stats: dict[str, Any]
    steps: int = 0
    hello: dict[str, Any] = field(default_factory=dict)
    stalled: bool = False
    call: tuple[str, int] | None = None     # (group, seq) of the collective its stall is in
    silent_s: float | None = None


def keys_of(row: RankRow, group: str) -> list[tuple[str, str]]:
    """The grouping keys of a rank: the tree's own group, then each ``GROUPINGS`` value it has."""
    keys = [("group", group)]
    for dim, value_of in GROUPINGS.items():
        value = value_of(row.hello)
        if value is not None:
            keys.append((dim, str(value)))
    return keys


def reduce_rows(rows: Iterable[RankRow], group: str, silent_after: float) -> list[GroupReduction]:
    """The reductions of one group relay's ranks: its own group first, then any other grouping."""
    out: dict[tuple[str, str], GroupReduction] = {}
    for row in rows:
        for key in keys_of(row, group):
            red = out.get(key) or out.setdefault(key, GroupReduction(key))
            _add(red, row, silent_after)
    own = ("group", group)
    return [out.pop(own, GroupReduction(own)), *out.values()]


def _add(red: GroupReduction, row: RankRow, silent_after: float) -> None:
    red.ranks += 1
    red.steps = max(red.steps, row.steps)
    red.stalled += row.stalled
    red.silent += row.silent_s is not None and row.silent_s >= silent_after
    if row.stats.get("warming_up", True) is not False:
        return
    red.timed += 1
    for name in SUMS:
        value = _num(row.stats.get(name))
        if value is not None:
            red.sums[name] = red.sums.get(name, 0.0) + value
    for x in QUANTITIES:
        value = _num(row.stats.get(x.stat))
        if value is not None:
            red.quantities.setdefault(x.name, Reduction()).add(value, row.rank, row.src)


def representatives(rows: list[RankRow], reductions: list[GroupReduction], previous: set[str],
                    silent_after: float) -> set[str]:
    """The ranks a group relay sends on in full (hello, samples, stalls, summaries): the holder of
    each quantity's extremes (the incumbent kept while within ``STICKY`` of it, so the view does not
    churn between equal ranks), the stalled ranks outside the call most stalled ranks wait in (the
    culprits) and a few inside it, and the silent ranks; bounded whatever the group's size."""
    reps: set[str] = set()
    by_src = {r.src: r for r in rows}
    own = reductions[0] if reductions else None
    for x in QUANTITIES:
        red = own.quantities.get(x.name) if own is not None else None
        if red is None or red.n == 0:
            continue
        for end, src in (("min", red.min_src), ("max", red.max_src)):
            if (rep := _sticky(x, getattr(red, end), src, previous, by_src)) is not None:
                reps.add(rep)
    stalled = [r for r in rows if r.stalled or (r.silent_s is not None and r.silent_s >= silent_after)]
    if stalled:
        calls = Counter(r.call for r in stalled if r.call is not None)
        common = calls.most_common(1)[0][0] if calls else None
        inside = sorted((r for r in stalled if common is not None and r.call == common), key=lambda r: r.rank)
        odd = sorted((r for r in stalled if common is None or r.call != common), key=lambda r: r.rank)
        reps.update(r.src for r in odd[:MAX_ODD_STALLED])
        reps.update(r.src for r in inside[:REPS_PER_STALL])
    return {s for s in reps if s is not None}


def _sticky(x: Quantity, extreme: float | None, src: str | None, previous: set[str],
            by_src: dict[str, RankRow]) -> str | None:
    """The incumbent representative nearest ``extreme`` when within ``STICKY`` of it, else ``src``."""
    if extreme is None:
        return src
    near = []
    for old in previous:
        row = by_src.get(old)
        value = _num(row.stats.get(x.stat)) if row is not None and row.stats.get("warming_up") is False else None
        if value is not None and abs(value - extreme) <= STICKY * max(abs(extreme), SKETCH_MIN):
            near.append((abs(value - extreme), old))
    return min(near)[1] if near else src


def merge_groups(reductions: Iterable[GroupReduction]) -> dict[tuple[str, str], GroupReduction]:
    """Reductions of the same key (from several group relays) merged, plus the whole job under
    ``("job", "")`` merged from the tree's own groups."""
    merged: dict[tuple[str, str], GroupReduction] = {}
    job = GroupReduction(("job", ""))
    for red in reductions:
        target = merged.get(red.key) or merged.setdefault(red.key, GroupReduction(red.key))
        target.merge(red)
        if red.key[0] == "group":
            job.merge(red)
    merged[job.key] = job
    return merged
