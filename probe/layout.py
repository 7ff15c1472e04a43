"""The rank's place in the job's parallel layout, from torch's own objects (wire 1.5 ``layout``), and a
pipeline stage's compute per micro-batch (the step record's ``ops``; docs/layout.md).

Where the place comes from, in this order:
* a ``DeviceMesh``: its dim names, sizes and this rank's coordinate (``DeviceMesh.__init__`` is
  wrapped from ``install()`` on; a mesh built before is found by its process groups, which torch
  describes as ``mesh_<dim name>``: this rank's group along each dim, its size and this rank's
  rank in it, the coordinate along that dim);
* a ``torch.distributed.pipelining`` stage: the rank's place in the pipeline is its rank in the
  stage's process group (the stage index, for a schedule with one stage per rank), the pipeline's
  depth that group's size; replicas of the pipeline are the other groups of the same shape, and the
  replica's index is read from the group's ranks (contiguous blocks: first rank ÷ depth; strided:
  the first rank);
* nothing: the job is data parallel over the world, and no record is sent (the viewer's default).

A stage's ``forward_one_chunk`` / ``backward_one_chunk`` are wrapped (by class attribute, when the
pipelining module is loaded: it is heavy, never imported here) to time each micro-batch on the host
clock; on a device other than the CPU they are not timed (the host's time there is launch time, not
the device's compute: the what-if needs device timings, not measured yet). Every wrapper swallows
its own errors.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from probe.comm.guards import as_wrapper

STAGE_CLASS = "torch.distributed.pipelining.stage"


class LayoutWatch:
    """What this process knows of its place; ``record()`` is the ``layout`` record it makes."""

    def __init__(self) -> None:
        self.mesh: tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]] | None = None
        self.pipeline: tuple[int, int, tuple[int, ...]] | None = None    # (place, depth, the group's ranks)
        self.sent: dict[str, Any] | None = None
        self.stages: set[int] = set()          # ids of the stage objects read (one per stage this rank holds)

    def from_mesh(self, mesh: Any) -> None:
        root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
        coord = root.get_coordinate()
        if coord is None:
            return
        sizes = tuple(int(n) for n in root.mesh.shape)
        names = tuple(root.mesh_dim_names or (f"dim{i}" for i in range(len(sizes))))
        if self.mesh is None or len(sizes) >= len(self.mesh[1]):
            self.mesh = (names, sizes, tuple(int(c) for c in coord))

    def from_groups(self) -> None:
        """A mesh built before ``install()``: its dims' process groups (``group_desc`` ``mesh_<name>``)."""
        import torch.distributed as dist

        if self.mesh is not None or not dist.is_initialized():
            return
        me = dist.get_rank()
        dims = []
        for pg, ranks in list(dist.distributed_c10d._world.pg_group_ranks.items()):
            desc = str(getattr(pg, "group_desc", "") or "")
            if desc.startswith("mesh_") and desc != "mesh_default" and me in ranks:
                dims.append((desc[len("mesh_"):], len(ranks), int(ranks[me])))
        total = 1
        for _, size, _ in dims:
            total *= size
        if dims and total == dist.get_world_size():
            self.mesh = (tuple(d[0] for d in dims), tuple(d[1] for d in dims), tuple(d[2] for d in dims))

    def from_stage(self, stage: Any) -> None:
        if id(stage) in self.stages:
            return
        self.stages.add(id(stage))
        import torch.distributed as dist

        group = getattr(stage, "group", None)
        ranks = tuple(sorted(dist.get_process_group_ranks(group))) if group is not None else \
            tuple(range(dist.get_world_size()))
        self.pipeline = (int(stage.group_rank), int(stage.group_size), ranks)

    def record(self, world: int) -> dict[str, Any] | None:
        """The ``layout`` record (without its time), or None when nothing beyond data parallel is known."""
        mesh, pipe = self.mesh, self.pipeline
        if mesh is not None:
            names, sizes, coord = mesh
            if pipe is not None and not any(n.lower() in ("pp", "pipe", "pipeline") for n in names) \
                    and pipe[1] * _product(sizes) == world:
                names, sizes, coord = ("pp", *names), (pipe[1], *sizes), (pipe[0], *coord)
            return {"k": "layout", "dims": list(names), "sizes": list(sizes), "coord": list(coord), "source": "mesh"}
        if pipe is None:
            return None
        place, depth, ranks = pipe
        replicas = world // depth if depth else 1
        if replicas <= 1:
            return {"k": "layout", "dims": ["pp"], "sizes": [depth], "coord": [place], "source": "pipeline"}
        first = ranks[0]
        replica = first // depth if len(ranks) < 2 or ranks[1] - ranks[0] == 1 else first
        return {"k": "layout", "dims": ["pp", "dp"], "sizes": [depth, replicas], "coord": [place, replica],
                "source": "pipeline"}

    def publish(self, probe: Any) -> None:
        """Send the record when it is new or changed (the probe's server keeps the latest for backfill)."""
        try:
            world = int(getattr(probe, "world_size", 1) or 1)
            rec = self.record(world)
            if rec is not None and rec != self.sent:
                self.sent = rec
                probe.emit(dict(rec, t=time.time()))
        except Exception as exc:
            probe.report_error("layout", exc)


def _product(values: tuple[int, ...]) -> int:
    n = 1
    for v in values:
        n *= v
    return n


_watch = LayoutWatch()
_originals: dict[tuple[Any, str], Callable[..., Any]] = {}
_lock = threading.Lock()
_stage_wrapped = False
_state: Any = None          # the comm patch state (probe.comm) this was installed for


def install(state: Any) -> None:
    """Wrap ``DeviceMesh.__init__`` and, when the pipelining module is loaded, its stage's chunk
    methods; read a mesh built before. ``state`` is the comm patch state (``probe.comm``): its
    tracker collects the stage's operations and its probe gets the record. Idempotent."""
    global _state
    _state = state
    with _lock:
        try:
            from torch.distributed import device_mesh

            cls = getattr(device_mesh, "DeviceMesh", None)
            if cls is not None:
                _wrap(cls, "__init__", _mesh_init)
        except Exception as exc:
            state.probe.report_error("layout", exc)
        _wrap_stage()
    try:
        _watch.from_groups()
    except Exception as exc:
        state.probe.report_error("layout", exc)
    _watch.publish(state.probe)


def step_end(state: Any) -> None:
    """At each step's end: wrap a pipelining module loaded since, and send a place that changed."""
    if not _stage_wrapped and STAGE_CLASS in sys.modules:
        with _lock:
            _wrap_stage()
    _watch.publish(state.probe)


def _wrap_stage() -> None:
    global _stage_wrapped
    cls = getattr(sys.modules.get(STAGE_CLASS), "_PipelineStageBase", None)
    if cls is None:
        return
    _wrap(cls, "forward_one_chunk", _chunk("fwd"))
    _wrap(cls, "backward_one_chunk", _chunk("bwd"))
    _stage_wrapped = True


def _wrap(cls: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    orig = cls.__dict__.get(name)
    if orig is None or getattr(orig, "_perfmon", False):
        return
    _originals[(cls, name)] = orig
    setattr(cls, name, as_wrapper(make(orig), orig, name))


def _mesh_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        try:
            _watch.from_mesh(self)
        except Exception:
            pass
    return __init__


def _chunk(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def chunk(self: Any, chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            _poll()
            t0 = time.perf_counter()
            try:
                return orig(self, chunk_id, *args, **kwargs)
            finally:
                _timed(kind, self, chunk_id, t0, time.perf_counter())
        return chunk
    return make


def _poll() -> None:
    """Stamp the point-to-point works that completed while the host was elsewhere (probe.comm.p2p)."""
    state = _state
    if state is not None:
        state.pending.poll()


def _timed(kind: str, stage: Any, chunk_id: Any, t0: float, t1: float) -> None:
    state = _state
    if state is None or state.probe.closed:
        return
    try:
        state.pending.poll()
        _watch.from_stage(stage)
        if getattr(getattr(stage, "device", None), "type", "cpu") == "cpu":
            state.tracker.add_op(kind, t0, t1 - t0, int(chunk_id), -1)
    except Exception:
        state.tracker.error()


def uninstall() -> None:
    """Restore every wrapped method (tests, ``perfmon detach``) and forget what was learned."""
    global _watch, _stage_wrapped, _state
    _state = None
    with _lock:
        for (cls, name), orig in _originals.items():
            if getattr(cls.__dict__.get(name), "_perfmon", False):
                setattr(cls, name, orig)
        _originals.clear()
        _watch = LayoutWatch()
        _stage_wrapped = False
