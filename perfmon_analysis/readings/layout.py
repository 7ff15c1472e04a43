"""Wire 1.5: where a rank sits in the job's parallel layout (``layout`` records) and the operations of
its steps (the step record's ``ops``), the input of the what-if (docs/layout.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmon_analysis.readings.base import _text, _whole, num, wire_dict

P2P_KINDS = frozenset({"send", "recv"})
COMPUTE_KINDS = frozenset({"fwd", "bwd", "opt", "compute"})     # work on the rank itself, no peer involved
CLOCKS = ("host", "device")


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a step on one rank: ``start`` (s after the step record's ``start``) and ``dur``.

    ``kind``: "fwd" | "bwd" (a pipeline stage's compute of micro-batch ``mb``), "opt", "compute" (work
    on the rank), "send" | "recv" (point-to-point; ``peer`` the other side's global rank; a send the host
    later blocked on until it completed has ``waited``), or a collective's name (``group``: the process
    group's name, the same on every member)."""

    kind: str
    start: float
    dur: float
    mb: int | None = None
    peer: int | None = None
    group: str | None = None
    waited: float | None = None     # a send's: when the host began to wait for it (s after the step's start)

    @property
    def p2p(self) -> bool:
        return self.kind in P2P_KINDS

    @property
    def collective(self) -> bool:
        return self.group is not None and not self.p2p

    @property
    def compute(self) -> bool:
        return not self.p2p and self.group is None


@dataclass(frozen=True, slots=True)
class StepOps:
    """The ``ops`` of one step record. ``clock``: "host" when the times are the training thread's (the
    time between two ops is its own work), "device" when they are the device's (that time is launch
    delay, not work); ``body``: (first, last) s after ``start`` that bound the step's active body, the
    span the host clock's own work fills; ``dropped``: ops over the probe's bound, not sent (the step
    cannot be simulated whole); ``p2p_wait``: s the thread was blocked in point-to-point calls and their
    waits (None when the step says nothing: a device clock, or no such wait)."""

    step: int
    ops: tuple[Op, ...]
    clock: str
    body: tuple[float, float]
    dropped: int = 0
    p2p_wait: float | None = None


@dataclass(frozen=True)
class LayoutReading:
    """One rank's ``layout`` record: the mesh dims it knows (outer to inner), their sizes, its own
    coordinate along each, and where they came from ("mesh" | "pipeline" | "groups")."""

    dims: tuple[str, ...]
    sizes: tuple[int, ...]
    coord: tuple[int, ...]
    source: str


def layout_reading(rec: dict[str, Any]) -> LayoutReading | None:
    """A ``layout`` record, or None when its dims, sizes and coordinate do not line up."""
    dims, sizes, coord = rec.get("dims"), rec.get("sizes"), rec.get("coord")
    if not (isinstance(dims, list) and isinstance(sizes, list) and isinstance(coord, list)):
        return None
    names = tuple(d for d in dims if isinstance(d, str) and d)
    whole = tuple(v for v in sizes if _whole(v) is not None and v > 0)
    at = tuple(v for v in coord if _whole(v) is not None and v >= 0)
    if not names or not (len(names) == len(whole) == len(at) == len(dims)) or any(c >= n for c, n in zip(at, whole)):
        return None
    return LayoutReading(dims=names, sizes=whole, coord=at, source=_text(rec.get("source")) or "mesh")


def step_ops(rec: dict[str, Any]) -> StepOps | None:
    """The step record's ``ops`` (None when it has none). An entry is [kind, start, dur, mb, peer(, waited)]:
    ``mb`` -1 for none; ``peer`` a global rank (point-to-point), a group name (collectives), or -1;
    ``waited`` (sends) when the host began to wait for it."""
    raw, step = rec.get("ops"), _whole(rec.get("step"))
    if not isinstance(raw, list) or step is None:
        return None
    ops = []
    for item in raw:
        op = _op(item)
        if op is not None:
            ops.append(op)
    clock = str(rec["ops_clock"]) if rec.get("ops_clock") in CLOCKS else "host"
    dur = num(rec.get("dur")) or 0.0
    phases = wire_dict(rec.get("phases"))
    lead = (num(rec.get("gap")) or 0.0) + (num(phases.get("data")) or 0.0)     # before the body: gap, data wait
    dropped = _whole(rec.get("ops_dropped")) or 0
    comm = wire_dict(rec.get("comm"))
    return StepOps(step=step, ops=tuple(sorted(ops, key=_issue_order)), clock=clock,
                   body=(min(lead, dur), dur), dropped=max(0, dropped), p2p_wait=num(comm.get("p2p_exposed")))


def _issue_order(op: Op) -> tuple[float, int]:
    """By start; at the same instant a send first (posting one never waits: a batched send and receive
    are issued together, the send not after the receive completes)."""
    return op.start, 0 if op.kind == "send" else 1


def _op(item: Any) -> Op | None:
    if not isinstance(item, list) or len(item) < 3:
        return None
    kind, start, dur = _text(item[0]), num(item[1]), num(item[2])
    if kind is None or start is None or dur is None or dur < 0:
        return None
    mb = _whole(item[3]) if len(item) > 3 else None
    peer = item[4] if len(item) > 4 else None
    if kind in P2P_KINDS:
        rank = _whole(peer)
        if rank is None or rank < 0:
            return None
        waited = num(item[5]) if kind == "send" and len(item) > 5 else None
        return Op(kind, start, dur, mb if mb is not None and mb >= 0 else None, rank,
                  waited=waited if waited is not None and start <= waited <= start + dur else None)
    group = _text(peer)
    if group is None and kind not in COMPUTE_KINDS:
        return None
    return Op(kind, start, dur, mb if mb is not None and mb >= 0 else None, None, group)
