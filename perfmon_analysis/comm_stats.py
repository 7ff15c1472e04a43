"""Communication over the window: each collective's share of a rank's totals, the job's table of
collectives, and the straggler rules that compare ranks' compute and arrival."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from perfmon_analysis.known import mean_known
from perfmon_analysis.readings import CommOp
from perfmon_analysis.views import CommOpRow

if TYPE_CHECKING:
    from perfmon_analysis.buffers import RankState

def comm_delta(state: RankState, win_start: float | None) -> dict[str, tuple[int, int, float, float | None]]:
    """Per-op (count, bytes, seconds, bus bytes) during the window from the cumulative ``comm`` records.

    Bus bytes carry each call's own group size (``CommOp.busbytes``). None: busbw unknown."""
    if not state.comm:
        return {}
    last = state.comm[-1]
    base = None
    for rec in itertools.islice(state.comm, len(state.comm) - 1):
        if win_start is None or (rec.t or 0.0) <= win_start:
            base = rec      # the newest record from before the window
    if base is None and len(state.comm) > 1:
        base = state.comm[-2]   # window shorter than the record period: the latest period stands in
    out = {}
    for op in last.ops:
        prev = (base.op(op.op) if base is not None else None) or CommOp(op.op, 0, 0, 0.0, 0.0)
        count = (op.count or 0) - (prev.count or 0)
        nbytes = (op.bytes or 0) - (prev.bytes or 0)
        secs = (op.seconds or 0.0) - (prev.seconds or 0.0)
        bus = op.busbytes - prev.busbytes if op.busbytes is not None and prev.busbytes is not None else None
        if count > 0 or secs > 0:
            out[op.op] = (count, nbytes, secs, bus)
    return out



# -- job level -------------------------------------------------------------------------------
# Straggler rule, shared with perfmon_analysis.verdict (which cites it): NVIDIA Resiliency Extension relative
# score = best rank / this rank, default threshold gpu_relative_perf_threshold = 0.7.
STRAGGLER_RATIO = 0.7


def find_straggler(ready: list[tuple[int, float | None, float | None]]) -> tuple[float | None, float | None, int | None,
                                                                       str | None]:
    """(compute ratio, arrival ratio, straggler rank, rule) over ranks with comm measured.

    Rule "compute" (NVRx relative score, fastest / slowest < STRAGGLER_RATIO):
    the rank with the slowest median compute. Rule "arrival" (HTA: "a straggler
    is the trainer which starts later than others"), the same score applied to
    each rank's time to reach the collective (step time minus its exposed wait,
    so time lost between steps or in its own data wait counts): the last rank to
    arrive, when compute alone does not explain it.
    """
    computes = [(rank, compute) for rank, compute, _ in ready if compute is not None]
    if len(computes) < 2:
        return None, None, None, None
    ratio, slow_rank = relative(computes)
    arrivals = [(rank, arrive) for rank, _, arrive in ready if arrive is not None]
    arrival_ratio, late_rank = relative(arrivals) if len(arrivals) >= 2 else (None, None)
    if ratio < STRAGGLER_RATIO:
        return ratio, arrival_ratio, slow_rank, "compute"
    if arrival_ratio is not None and arrival_ratio < STRAGGLER_RATIO:
        return ratio, arrival_ratio, late_rank, "arrival"
    return ratio, arrival_ratio, None, None


def relative(times: list[tuple[int, float]]) -> tuple[float, int]:
    """(fastest / slowest, slowest rank)."""
    fast = min(t for _, t in times)
    slow_rank, slow = max(times, key=lambda rt: rt[1])
    return (fast / slow if slow > 0 else 1.0), slow_rank





def comm_rows(deltas: list[dict[str, tuple[int, int, float, float | None]]]) -> list[CommOpRow]:
    """The window's collectives summed over ranks; busbw from the bus bytes each call's own group
    size gave (nccl-tests definition), never from the job's world size."""
    acc: dict[str, list[Any]] = {}
    for delta in deltas:
        for op, (count, nbytes, secs, bus) in delta.items():
            row = acc.setdefault(op, [0, 0, 0.0, [], []])
            row[0] += count
            row[1] += nbytes
            row[2] += secs
            if secs > 0 and nbytes > 0:
                row[3].append(nbytes / secs)
                if bus is not None and bus > 0:
                    row[4].append(bus / secs)
    rows = [CommOpRow(op=op, count=c, bytes=b, seconds=s, algbw=mean_known(alg), busbw=mean_known(bus),
                      ranks=len(deltas))
            for op, (c, b, s, alg, bus) in acc.items()]
    return sorted(rows, key=lambda r: -r.seconds)
