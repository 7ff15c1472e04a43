"""Synthetic jobs as the operations their ranks would report (wire 1.5 ``ops``): a GPipe pipeline
replicated over data-parallel replicas, with chosen compute times per worker and step.

``pipeline(...)`` returns the layout and ``{step: {rank: StepOps}}`` that
``perfmon_analysis.stragglers.analyse`` reads, and ``records(...)`` the same job as wire records
(hello, layout, steps with ``ops``) for a run model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmon_analysis.layout import Layout
from perfmon_analysis.readings.layout import Op, StepOps
from perfmon_analysis.whatif import compile_step, run

# (step, stage, replica) -> (forward s, backward s) of one micro-batch
Compute = Callable[[int, int, int], tuple[float, float]]


def even(f: float = 1.0, b: float = 2.0) -> Compute:
    return lambda step, stage, replica: (f, b)


def layout(pp: int, dp: int) -> Layout:
    """Ranks numbered pp-major (Megatron's order): rank = stage * dp + replica."""
    coords = {s * dp + d: (s, d) for s in range(pp) for d in range(dp)}
    return Layout(dims=("pp", "dp"), sizes=(pp, dp), coords=coords, source="mesh")


def stage_ops(stage: int, replica: int, pp: int, dp: int, mbs: int, f: float, b: float) -> list[Op]:
    """One rank's GPipe step on the device clock: forwards with their receives and sends, backwards
    likewise, the stage's gradient all-reduce over its replicas, the optimizer. ``start`` only orders."""
    prev, nxt = (stage - 1) * dp + replica, (stage + 1) * dp + replica
    seq: list[tuple[str, float, int, int | None, str | None]] = []
    for mb in range(mbs):
        if stage > 0:
            seq.append(("recv", 0.0, mb, prev, None))
        seq.append(("fwd", f, mb, None, None))
        if stage < pp - 1:
            seq.append(("send", 0.0, mb, nxt, None))
    for mb in range(mbs):
        if stage < pp - 1:
            seq.append(("recv", 0.0, mb, nxt, None))
        seq.append(("bwd", b, mb, None, None))
        if stage > 0:
            seq.append(("send", 0.0, mb, prev, None))
    seq.append(("all_reduce", 0.0, -1, None, f"dp@pp{stage}"))
    seq.append(("opt", 0.0, -1, None, None))
    return [Op(kind, i * 1e-3, dur, mb if mb >= 0 else None, peer, group) for i, (kind, dur, mb, peer, group)
            in enumerate(seq)]


def pipeline(pp: int, dp: int, steps: int, compute: Compute,
             mbs: int = 4) -> tuple[Layout, dict[int, dict[int, StepOps]]]:
    out: dict[int, dict[int, StepOps]] = {}
    for step in range(steps):
        out[step] = {}
        for stage in range(pp):
            for replica in range(dp):
                f, b = compute(step, stage, replica)
                ops = stage_ops(stage, replica, pp, dp, mbs, f, b)
                out[step][stage * dp + replica] = StepOps(step, tuple(ops), "device", (0.0, ops[-1].start))
    return layout(pp, dp), out


def records(pp: int, dp: int, steps: int, compute: Compute, mbs: int = 4, t0: float = 1000.0,
            layout_record: bool = True) -> list[tuple[int, dict[str, Any]]]:
    """The job as (rank, record) pairs: hello, layout (unless ``layout_record`` is False: a job whose
    ranks say nothing is data parallel), one step record a step. Every rank's step lasts the
    simulated step (a synchronous job) and what it does not compute is exposed communication."""
    lay, by_step = pipeline(pp, dp, steps, compute, mbs)
    out: list[tuple[int, dict[str, Any]]] = []
    times = {s: run(g, [x.dur for x in g.slots]) for s, g in ((s, compile_step(s, by_step[s])) for s in by_step)}
    for rank, coord in sorted(lay.coords.items()):
        out.append((rank, {"k": "hello", "t": t0, "proto": [1, 5], "job": "ops-job", "rank": rank,
                           "world_size": pp * dp, "host": "h", "pid": 100 + rank}))
        if layout_record:
            out.append((rank, {"k": "layout", "t": t0, "dims": list(lay.dims), "sizes": list(lay.sizes),
                               "coord": list(coord), "source": "mesh"}))
        for step in range(steps):
            ops = by_step[step][rank].ops
            total = times[step]
            waited = max(0.0, total - sum(op.dur for op in ops if op.compute))
            start = t0 + step * 100.0
            out.append((rank, {"k": "step", "t": start + total, "step": step, "start": start, "dur": total,
                               "gap": 0.0, "phases": {"forward": total - waited},
                               "comm": {"seconds": waited, "exposed": waited, "bytes": 1 << 20, "ops": 1},
                               "ops_clock": "device",
                               "ops": [[op.kind, op.start, op.dur, -1 if op.mb is None else op.mb,
                                        op.peer if op.peer is not None else op.group if op.group else -1]
                                       for op in ops]}))
    return out


def view(pp: int, dp: int, steps: int, compute: Compute, **kw: Any) -> Any:
    """The ``JobView`` of the job's records, fed to a run model as a recording of every rank."""
    from perfmon_analysis.runmodel import RunModel

    model = RunModel()
    for rank, rec in sorted(records(pp, dp, steps, compute, **kw), key=lambda rr: (rr[1]["t"], rr[0])):
        model.ingest(f"ops-job/rank{rank}", rec)
    return model.view()
