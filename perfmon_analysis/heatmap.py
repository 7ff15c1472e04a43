"""The ranks of a large job at a glance: a heat level per rank for step time, data wait, exposed
communication and compute, ranks grouped by node (or, in a job with a layout beyond data parallel,
by stage and replica: the ranks doing the same work side by side), and the slowest rank and node named.

Levels are computed here, before any pane sees them (the ranks pane only picks glyphs and colours).
Times are judged against the fastest rank (a rank 1.5x slower than the best one is what holds a
synchronous job back); shares of the step against fixed bands, so a job where every rank waits
for data is hot everywhere. Unknown values stay unknown (None), never cold.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from perfmon_analysis.layout import Layout
from perfmon_analysis.views import JobView, RankView

__all__ = ["HeatMap", "METRICS", "RATIO_BANDS", "SHARE_BANDS", "heatmap", "level"]

RATIO_BANDS = (1.1, 1.25, 1.5, 2.0)       # x the fastest rank: levels 1..4
# The slowest rank or node is marked from the map's second level, where its cells warm.
SLOW_MARK = RATIO_BANDS[1]
SHARE_BANDS = (0.05, 0.15, 0.30, 0.50)    # share of the step: levels 1..4

# (row label, what the level measures, value of a rank, judged as a ratio to the fastest rank?)
METRICS: tuple[tuple[str, str, Callable[[RankView], float | None], bool], ...] = (
    ("step", "step time vs the fastest rank", lambda r: r.step_time_median_s, True),
    ("data", "data wait share of the step", lambda r: r.data_wait_frac, False),
    ("comm", "exposed communication share", lambda r: r.comm_exposed_frac, False),
    ("comp", "compute time vs the fastest rank", lambda r: r.compute_s, True),
)


@dataclass(frozen=True)
class HeatMap:
    """Columns are ranks in node order (``hosts`` per column); ``levels[label]`` per column."""

    ranks: tuple[int, ...]
    hosts: tuple[str | None, ...]
    levels: dict[str, tuple[int | None, ...]]
    groups: tuple[str | None, ...] = ()         # per column: its group's label (its node, or its stage and replica)
    group_by: str = "node"                      # "node" | "stage": what the columns are grouped by
    slowest_by: str = "compute"                  # "compute" (median compute time), else "step" (step time)
    slowest_rank: int | None = None
    slowest_rank_host: str | None = None
    slowest_ratio: float | None = None           # its time / the fastest rank's
    slowest_node: str | None = None              # by the median time of its ranks (2+ nodes, >= 1.1x the fastest)
    slowest_node_ratio: float | None = None      # that median / the fastest node's

    @property
    def slowest_rank_marked(self) -> bool:
        """Is the slowest rank slow enough to mark (``SLOW_MARK`` x the fastest)?"""
        return self.slowest_ratio is not None and self.slowest_ratio >= SLOW_MARK

    @property
    def slowest_node_marked(self) -> bool:
        return self.slowest_node_ratio is not None and self.slowest_node_ratio >= SLOW_MARK

    @property
    def nodes(self) -> list[tuple[str | None, int, int]]:
        """(group, first column, column count) of each run of one group's ranks (a node's, or with a
        layout beyond data parallel a stage's replica's)."""
        out: list[tuple[str | None, int, int]] = []
        for i, host in enumerate(self.groups or self.hosts):
            if out and out[-1][0] == host:
                out[-1] = (host, out[-1][1], out[-1][2] + 1)
            else:
                out.append((host, i, 1))
        return out


def level(value: float | None, bands: tuple[float, ...]) -> int | None:
    """0 (cool) .. len(bands) (hot); None when unknown."""
    if value is None:
        return None
    return bisect.bisect_right(bands, value)


def heatmap(view: JobView) -> HeatMap:
    first: dict[str | None, int] = {}           # nodes in the order of their lowest rank
    for r in view.ranks:
        first[r.host] = min(first.get(r.host, r.rank), r.rank)
    ranks = sorted(view.ranks, key=lambda r: (first[r.host], r.rank))
    lay = view.layout
    by_stage = lay.beyond_dp and all(r.rank in lay.coords for r in view.ranks)
    if by_stage:          # ranks that do the same work side by side: stage, then replica
        ranks = sorted(view.ranks, key=lambda r: (lay.stage(r.rank), lay.replica(r.rank), r.rank))
    groups = tuple(_group_label(lay, r.rank) if by_stage else r.host for r in ranks)
    levels: dict[str, tuple[int | None, ...]] = {}
    for label, _, get, relative in METRICS:
        values = [get(r) for r in ranks]
        if relative:
            best = min((v for v in values if v is not None and v > 0), default=None)
            values = [v / best if v is not None and best else None for v in values]
        levels[label] = tuple(level(v, RATIO_BANDS if relative else SHARE_BANDS) for v in values)
    # In a synchronous job every rank's step takes as long as the slowest one's: the rank that holds
    # it back is the one that computes longest (the straggler measure), step time only without it.
    by = "compute" if any(r.compute_s is not None for r in ranks) else "step"
    timed = [(r, t) for r in ranks if (t := r.compute_s if by == "compute" else r.step_time_median_s) is not None]
    slow = max(timed, key=lambda rt: rt[1], default=None)
    fast = min((t for _, t in timed if t > 0), default=None)
    slowest = slow if slow is not None and len(timed) > 1 else None     # named only among several
    node, node_ratio = _slowest_node(timed)
    return HeatMap(
        ranks=tuple(r.rank for r in ranks), hosts=tuple(r.host for r in ranks), groups=groups,
        group_by="stage" if by_stage else "node", levels=levels, slowest_by=by,
        slowest_rank=slowest[0].rank if slowest else None, slowest_rank_host=slowest[0].host if slowest else None,
        slowest_ratio=slowest[1] / fast if slowest and fast else None, slowest_node=node, slowest_node_ratio=node_ratio)


def _group_label(lay: Layout, rank: int) -> str:
    """'pp1 dp0': the stage and replica a column's rank is in (its worker; tp/cp peers share it)."""
    worker = lay.worker(rank)
    return lay.worker_label(*worker) if worker is not None else "?"


def _slowest_node(timed: list[tuple[RankView, float]]) -> tuple[str | None, float | None]:
    """The node whose ranks' median time is longest, and that median over the fastest node's."""
    by_node: dict[str, list[float]] = {}
    for r, t in timed:
        if r.host:
            by_node.setdefault(r.host, []).append(t)
    if len(by_node) < 2:
        return None, None
    medians = {host: statistics.median(v) for host, v in by_node.items()}
    slow = max(medians, key=lambda h: medians[h])
    fast = min(medians.values())
    ratio = medians[slow] / fast if fast > 0 else None
    if ratio is None or ratio < RATIO_BANDS[0]:
        return None, None          # no node stands out (one slow rank does not make its node slow)
    return slow, ratio
