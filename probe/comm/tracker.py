"""Communication bookkeeping: finished collectives in, per-step seconds/exposed and the
cumulative ``comm`` record out. Pure Python: no torch, no hooks (those live beside it)."""

from __future__ import annotations

import collections
import os
import time
from typing import Any

from probe.wire import MAX_OPS, busbw_factor

P2P_OPS = frozenset({"send", "recv"})
COMM_PERIOD = 2.0      # seconds between ``comm`` records (when something changed); one more at close


class CollectiveCall:
    """One finished (or partly known) collective. ``group`` (its process group's name) and ``peer``
    (a point-to-point call's other rank) are set on host-timed calls only: those become the step's
    ``ops`` (wire 1.5), whose times must be the host's."""

    __slots__ = ("op", "count", "nbytes", "n", "seconds", "exposed", "estimated", "pass_id", "launch", "done",
                 "last", "group", "peer", "waited")

    def __init__(self, op: str, count: int, nbytes: int, n: int, seconds: float | None, exposed: float | None,
                 estimated: bool = False, pass_id: int | None = None, launch: float = 0.0, done: float = 0.0,
                 last: bool = False, group: str | None = None, peer: int | None = None) -> None:
        self.op = op
        self.count = count
        self.nbytes = nbytes
        self.n = n
        self.seconds = seconds
        self.exposed = exposed
        self.estimated = estimated
        self.pass_id = pass_id
        self.launch = launch
        self.done = done
        self.last = last
        self.group = group
        self.peer = peer
        self.waited: float | None = None     # a send's: when the host began waiting for it (Work.wait)


class CommTracker:
    """Collects finished collectives from any thread; the step end drains them."""

    def __init__(self) -> None:
        self.done: collections.deque = collections.deque(maxlen=100_000)
        self.totals: dict[str, tuple[int, int, float, float, int]] = {}   # op -> count, bytes, s, busbytes, timed
        self.backend: str | None = None
        self.world_size: int | None = None
        self.errors = 0
        self.nccl_timing = _env_on("PERFMON_NCCL_TIMING") or _env_on("TORCH_NCCL_ENABLE_TIMING")
        self._ddp_pending: dict[int, list[CollectiveCall]] = {}
        self._covered = float("-inf")   # host time up to which collectives were already charged
        self.ops: list[tuple] = []   # this step's operations (take_ops): (kind, t0, dur, mb, peer[, waited])
        self.ops_dropped = 0

    def add(self, item: CollectiveCall) -> None:
        self.done.append(item)

    def error(self) -> None:
        self.errors += 1

    def add_op(self, kind: str, t0: float, dur: float, mb: int, peer: int | str, waited: float | None = None) -> None:
        """One operation of the step in course (perf_counter ``t0``; ``waited``: when the host began to
        wait for a send): at most ``MAX_OPS`` a step."""
        if len(self.ops) < MAX_OPS:
            self.ops.append((kind, t0, dur, mb, peer) if waited is None else (kind, t0, dur, mb, peer, waited))
        else:
            self.ops_dropped += 1

    def take_ops(self) -> tuple[list[tuple], int] | None:
        """The step's operations and how many the bound dropped, since the last take; None when none."""
        if not self.ops and not self.ops_dropped:
            return None
        ops, dropped = self.ops, self.ops_dropped
        self.ops, self.ops_dropped = [], 0
        return ops, dropped

    def drain(self) -> dict[str, Any] | None:
        """The step record's ``comm`` map for everything finished since the last drain.

        ``seconds`` is the time at least one collective was in flight: host-timed
        collectives queue behind each other (DDP launches many buckets at once), so
        each one is charged only the part of its launch-to-done interval not already
        covered by earlier ones (also its duration for bus bandwidth). Device-timed
        durations (NCCL events) are kernel times and are summed.
        """
        if not self.done:
            return None
        items: list[CollectiveCall] = []
        q = self.done
        while q:
            try:
                items.append(q.popleft())
            except IndexError:
                break
        self._charge_host_intervals([i for i in items if i.done and i.seconds is not None])
        ops = nbytes = 0
        seconds = exposed = p2p_exposed = 0.0
        timed = exposed_known = estimated = False
        passes: dict[int, list[CollectiveCall]] = {}
        totals = self.totals
        for item in items:
            ops += item.count
            nbytes += item.nbytes
            if item.count and item.done and (item.group is not None or item.peer is not None):
                self.add_op(item.op, item.launch, item.done - item.launch, -1,
                            item.peer if item.peer is not None else item.group,   # type: ignore[arg-type]
                            item.waited)
            if item.seconds is not None:
                seconds += item.seconds
                timed = True
            if item.op in P2P_OPS and item.exposed is not None:
                p2p_exposed += item.exposed
            if item.pass_id is not None:
                passes.setdefault(item.pass_id, []).append(item)
            elif item.exposed is not None:
                exposed += item.exposed
                exposed_known = True
            elif item.count:
                estimated = True
            if item.count:
                c, b, s, bb, tb = totals.get(item.op, (0, 0, 0.0, 0.0, 0))
                if item.seconds is not None:
                    factor = busbw_factor(item.op, item.n) or 0.0
                    totals[item.op] = (c + item.count, b + item.nbytes, s + item.seconds,
                                       bb + item.nbytes * factor, tb + item.nbytes)
                else:
                    totals[item.op] = (c + item.count, b + item.nbytes, s, bb, tb)
        for pass_id, group in passes.items():
            value, is_estimate = self._pass_exposed(pass_id, group)
            if value is not None:
                exposed += value
                exposed_known = True
            estimated = estimated or is_estimate
        if timed and exposed_known:
            exposed = min(exposed, seconds)
        out = {"seconds": seconds if timed else None, "exposed": exposed if exposed_known else None,
               "bytes": nbytes, "ops": ops, "estimated": estimated}
        if p2p_exposed:
            out["p2p_exposed"] = p2p_exposed
        return out

    def _charge_host_intervals(self, items: list[CollectiveCall]) -> None:
        items.sort(key=lambda i: i.launch)
        covered = self._covered
        for item in items:
            start = max(item.launch, covered)
            item.seconds = max(0.0, item.done - start)
            covered = max(covered, item.done)
        self._covered = covered

    def _pass_exposed(self, pass_id: int, items: list[CollectiveCall]) -> tuple[float | None, bool]:
        """Exposed time of one DDP backward pass (its buckets may arrive over several drains).

        Host-timed buckets: the backward returns only when every bucket is done, and the
        last bucket is launched when the last gradient is ready, so the step is blocked
        from that launch to the last completion. Device-timed buckets (NCCL): the last
        bucket's duration, an estimate (no common clock with compute).
        """
        items = self._ddp_pending.pop(pass_id, []) + items
        last = [i for i in items if i.last]
        if not last:
            self._ddp_pending[pass_id] = items
            if len(self._ddp_pending) > 64:
                self._ddp_pending.pop(next(iter(self._ddp_pending)))
            return None, False
        last_item = last[0]
        if last_item.exposed is not None:     # host-timed (gloo)
            end = max(i.done for i in items)
            return max(0.0, end - last_item.launch), False
        if last_item.seconds is not None:
            return last_item.seconds, True
        return None, True

    def record(self) -> dict[str, Any] | None:
        """A ``comm`` record: cumulative per-op totals with bus bandwidth."""
        totals = dict(self.totals)
        if not totals:
            return None
        ops = []
        for op, (count, nbytes, seconds, busbytes, timed_bytes) in sorted(totals.items()):
            entry: dict[str, Any] = {"op": op, "count": count, "bytes": nbytes,
                                     "seconds": seconds if timed_bytes or seconds else None, "busbw": None}
            if seconds > 0 and busbytes > 0:
                entry["busbw"] = busbytes / seconds
                entry["busbytes"] = busbytes      # timed bytes x each call's group factor: windows of busbw
            ops.append(entry)
        return {"k": "comm", "t": time.time(), "backend": self.backend, "world_size": self.world_size, "ops": ops,
                "nccl_timing": self.nccl_timing}


class Ledger:
    """Collectives this rank issued per process group, and the ones not yet returned.

    The per-group count is each call's sequence number (the n-th call on a group is the same
    collective on every rank of it), so a stall record can say "rank 0 waits in all_reduce #20
    of group world" and a viewer can name the rank that issued only 19. The training thread
    writes; the stall watch reads ``snapshot()`` from its own thread (``dict(...)`` and
    ``list(d.values())`` copy under the GIL without running Python code in between).
    """

    MAX_OPEN = 256      # async works never waited for must not grow this without bound

    def __init__(self) -> None:
        self.issued: dict[str, int] = {}
        self.open: dict[int, tuple[str, str, int | None, int, int, int, float]] = {}
        self._token = 0

    def begin(self, op: str, group: str, group_rank: int | None, group_size: int, nbytes: int) -> int:
        seq = self.issued[group] = self.issued.get(group, 0) + 1
        self._token += 1
        if len(self.open) >= self.MAX_OPEN:
            self.open.pop(next(iter(self.open)), None)
        self.open[self._token] = (op, group, group_rank, group_size, seq, nbytes, time.time())
        return self._token

    def end(self, token: int) -> None:
        self.open.pop(token, None)

    def snapshot(self) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """(calls in flight, oldest first, as the stall record's ``inflight``; calls issued per group)."""
        open_calls = sorted(list(self.open.values()), key=lambda c: c[6])
        issued = dict(self.issued)
        return [{"op": op, "group": group, "group_rank": rank, "group_size": n, "seq": seq, "bytes": nbytes,
                 "since": since} for op, group, rank, n, seq, nbytes, since in open_calls], issued


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
