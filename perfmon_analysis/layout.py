"""The job's parallel layout: each rank's coordinates along the mesh's dims (dp, tp, pp, cp, ep ...).

Every rank reports its own place (wire 1.5 ``layout``, learned by the probe from torch's own objects:
a ``DeviceMesh``'s dims and names, a pipeline stage's index and count, its process groups' ranks);
``assemble`` puts the ranks' places together. A job whose ranks said nothing is data parallel over the
world: one dim, ``dp``, and each rank its own replica, which is how perfmon read every job before.

What the straggler analysis needs of a layout is three roles (docs/layout.md):
* the **stage** dim (``pp``): ranks of different stages do different work by design;
* the **replica** dims (``dp`` and its sharded kinds): ranks of the same stage in different replicas
  do the same work, so they are each other's peers;
* every other dim (``tp``, ``cp``, ``ep`` ...) splits one *worker*'s work across ranks that run in
  lockstep: the ranks sharing a stage and a replica are one worker.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perfmon_analysis.readings.layout import LayoutReading

STAGE_DIMS = frozenset({"pp", "pipe", "pipeline", "stage"})
REPLICA_DIMS = frozenset({"dp", "ddp", "fsdp", "hsdp", "dp_replicate", "dp_shard", "replicate", "shard", "data",
                          "dp_shard_cp", "dp_cp"})
WORLD = "world"          # source of the layout no rank reported: data parallel over the world


@dataclass(frozen=True)
class Layout:
    """``coords[rank]`` is the rank's coordinate along each of ``dims`` (outer to inner); a rank that
    did not report its place is absent."""

    dims: tuple[str, ...]
    sizes: tuple[int, ...]
    coords: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    source: str = WORLD

    def role(self, dim: str) -> str:
        """"stage" | "replica" | "worker" (a dim that splits one worker across ranks). A mesh of one
        dim with a name perfmon does not know is read as data parallel."""
        name = dim.lower()
        if name in STAGE_DIMS:
            return "stage"
        if name in REPLICA_DIMS or len(self.dims) == 1:
            return "replica"
        return "worker"

    @property
    def beyond_dp(self) -> bool:
        """The layout says more than "every rank a replica of the others"."""
        return any(self.role(d) != "replica" for d in self.dims) or sum(
            1 for d in self.dims if self.role(d) == "replica") > 1

    @property
    def stages(self) -> int:
        return self._extent("stage")

    @property
    def replicas(self) -> int:
        return self._extent("replica")

    def stage(self, rank: int) -> int | None:
        """The rank's pipeline stage (0 in a job without one); None when its place is unknown."""
        return self._index(rank, "stage")

    def replica(self, rank: int) -> int | None:
        """The rank's replica: its coordinates along the replica dims, as one number (row-major)."""
        return self._index(rank, "replica")

    def worker(self, rank: int) -> tuple[int, int] | None:
        """(stage, replica): the ranks that share them split one worker's work in lockstep."""
        stage, replica = self.stage(rank), self.replica(rank)
        return None if stage is None or replica is None else (stage, replica)

    def label(self, rank: int) -> str:
        """'dp1 pp0 tp1': the rank's coordinates by dim name ('' when unknown)."""
        at = self.coords.get(rank)
        return "" if at is None else " ".join(f"{d}{c}" for d, c in zip(self.dims, at))

    def worker_label(self, stage: int, replica: int) -> str:
        """'stage 1, replica 3' in the job's own dim names ('dp3 pp1'), for the verdict's headline."""
        parts = []
        for role, value in (("replica", replica), ("stage", stage)):
            names = [d for d in self.dims if self.role(d) == role]
            if names:
                parts.append(f"{'·'.join(names)}{value}")
        return " ".join(parts) or f"replica {replica}"

    def as_json(self) -> dict[str, Any]:
        """The report's ``layout``: dims, sizes, where they came from, and each rank's coordinates."""
        return {"dims": list(self.dims), "sizes": list(self.sizes), "source": self.source,
                "coords": {str(r): list(c) for r, c in sorted(self.coords.items())}}

    def _extent(self, role: str) -> int:
        n = 1
        for dim, size in zip(self.dims, self.sizes):
            if self.role(dim) == role:
                n *= size
        return n

    def _index(self, rank: int, role: str) -> int | None:
        at = self.coords.get(rank)
        if at is None:
            return None
        index = 0
        for dim, size, c in zip(self.dims, self.sizes, at):
            if self.role(dim) == role:
                index = index * size + c
        return index


def world_layout(ranks: int) -> Layout:
    """Data parallel over ``ranks``: what a job whose ranks reported no place is."""
    n = max(1, ranks)
    return Layout(dims=("dp",), sizes=(n,), coords={r: (r,) for r in range(n)}, source=WORLD)


def assemble(readings: Mapping[int, LayoutReading], world: int) -> Layout:
    """The job's layout from its ranks' readings: the dims and sizes most ranks report (they agree
    in a healthy job), with the coordinates of the ranks that report them; the world's layout when
    no rank reported one."""
    if not readings:
        return world_layout(world)
    shapes = collections.Counter((r.dims, r.sizes) for r in readings.values())
    (dims, sizes), _ = shapes.most_common(1)[0]
    coords = {rank: r.coord for rank, r in readings.items() if (r.dims, r.sizes) == (dims, sizes)}
    source = collections.Counter(r.source for r in readings.values() if (r.dims, r.sizes) == (dims, sizes))
    return Layout(dims=dims, sizes=sizes, coords=coords, source=source.most_common(1)[0][0])
