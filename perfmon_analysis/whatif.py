"""What-if: the step time a job would have with one cause of straggling removed, simulated over the
measured operations of every rank.

The method is the one "Understanding Stragglers in Large Model Training Using What-if Analysis"
(OSDI '25) describes: rebuild each step from its operations' durations and the dependencies between
them, then replay it with some durations changed. Written here from the paper's description and
checked against its published traces (``bench/whatif_paper.py``, docs/layout.md).

The dependency model of one step (``compile_step``), per rank in the order its operations ran:
* work (a stage's forward or backward, the optimizer, and on the host clock the thread's own time
  between two recorded operations) starts when the rank's previous operation ended;
* a ``send`` is posted when the rank gets to it and does not hold the rank up;
* a ``recv`` ends at the later of its own posting and its matching send's, plus the pair's transfer
  time (the k-th send from a to b pairs with the k-th receive at b from a);
* a collective ends on every member at the last member's arrival plus the call's transfer time (the
  k-th call on a process group is the same call on every member).
A pair's or a call's transfer time is the shortest of its members' durations: the member that came
last waited only for the transfer, and no clock is compared across hosts. Each rank starts the step
at 0; the step ends when the last rank's last operation does.

The dependencies do not change with the durations, so a step is compiled once into a program in
dependency order and every variant is one pass over it (``Model.times``).

Typical durations (the *ideal* the paper compares with): work at the mean of its kind over all
ranks and steps, transfers at the median of their kind. Variants swap a group's durations between
measured and ideal (``Model.vary``), or replace them with a stage's median (the peers' speed), or
with the mean over replicas of the same slot (the imbalance evened).
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from perfmon_analysis.readings.layout import Op, StepOps

WORK, POST, RECV, JOIN, LEAVE, SENT = range(6)
STAGE_COMPUTE = (("work", "fwd"), ("work", "bwd"))     # what moving layers between stages moves
Key = tuple[str, ...]
Ref = tuple[Any, ...]     # a transfer (src, dst, k) or a collective call (group, k)
Instr = tuple[int, ...]   # (opcode, its operands)


class Slot(NamedTuple):
    """One duration of a step: a rank's work, or a pair's or a call's transfer.

    ``owners``: the ranks whose operation it is; ``key``: what the ideal is taken over; ``nth``: its
    place among the same key's slots on its rank in the step (the same micro-batch slot across
    replicas); ``work``: True for work, False for a transfer."""

    dur: float
    key: Key
    owners: tuple[int, ...]
    nth: int
    work: bool


@dataclass(frozen=True)
class StepGraph:
    """One step compiled: ``program`` in dependency order, one duration slot per entry of ``slots``.
    ``forced``: dependencies the operations left unresolvable (a receive with no send, a call some
    member never made), released so the step still ends."""

    step: int
    ranks: tuple[int, ...]
    program: tuple[tuple[int, int, int, int], ...]
    slots: tuple[Slot, ...]
    links: int
    forced: int = 0
    clock: str = "device"


def compile_step(step: int, ops: Mapping[int, StepOps]) -> StepGraph:
    """The dependency model of one step from each rank's operations (module docstring)."""
    ranks = tuple(sorted(ops))
    lines = {r: _timeline(ops[r]) for r in ranks}
    sends: dict[Ref, tuple[int, float]] = {}         # (src, dst, k) -> (link, dur)
    recvs: dict[Ref, float] = {}
    calls: dict[Ref, list[tuple[int, float]]] = collections.defaultdict(list)   # (group, k) -> members
    refs: dict[int, list[Ref | None]] = {}
    for rank in ranks:
        counts: collections.Counter[Any] = collections.Counter()
        of_send: dict[int, Ref] = {}
        refs[rank] = []
        for what, op in lines[rank]:
            ref: Ref | None = None
            if what == "wait":
                ref = of_send.get(id(op.waited_for))
            elif what == "gap":
                pass
            elif op.kind == "send" or op.kind == "recv":
                src, dst = (rank, op.peer) if op.kind == "send" else (op.peer, rank)
                ref = (src, dst, counts[(op.kind, op.peer)])
                counts[(op.kind, op.peer)] += 1
                if op.kind == "send":
                    sends[ref] = (len(sends), op.dur)
                    of_send[id(op)] = ref
                else:
                    recvs[ref] = op.dur
            elif op.group is not None:
                ref = (op.group, counts[op.group])
                counts[op.group] += 1
                calls[ref].append((rank, op.dur))
            refs[rank].append(ref)
    call_link = {key: len(sends) + i for i, key in enumerate(calls)}
    slots: list[Slot] = []
    shared: dict[Ref, int] = {}
    seqs: list[list[Instr]] = []
    for rank in ranks:
        nth: collections.Counter[Key] = collections.Counter()
        seq: list[Instr] = []
        for (what, op), ref in zip(lines[rank], refs[rank]):
            if what == "wait":
                if ref is not None and ref in sends and ref in recvs:
                    seq.append((SENT, sends[ref][0]))      # blocked until its send was received
            elif what == "op" and op.kind == "send":
                if ref is not None and ref in recvs:
                    seq.append((POST, sends[ref][0]))       # an unmatched send holds nobody up
            elif what == "op" and op.kind == "recv" and ref is not None and ref in sends:
                if ref not in shared:
                    shared[ref] = _add(slots, Slot(min(sends[ref][1], recvs[ref]), ("p2p",), ref[:2], 0, False))
                seq.append((RECV, sends[ref][0], shared[ref]))
            elif what == "op" and op.group is not None and ref is not None:    # a collective's ref is set above
                members = calls[ref]
                if ref not in shared:
                    shared[ref] = _add(slots, Slot(min(d for _, d in members), ("call", op.kind, str(op.group)),
                                                   tuple(r for r, _ in members), ref[1], False))
                seq.append((JOIN, call_link[ref], shared[ref], len(members)))
            else:      # work: a compute op, the host's own time between ops, or a receive whose send is unknown
                key: Key = ("gap" if what == "gap" else "work", op.kind)
                seq.append((WORK, _add(slots, Slot(op.dur, key, (rank,), nth[key], True))))
                nth[key] += 1
        seqs.append(seq)
    program, forced = _order(seqs)
    clock = "host" if any(ops[r].clock == "host" for r in ranks) else "device"
    return StepGraph(step=step, ranks=ranks, program=tuple(program), slots=tuple(slots),
                     links=len(sends) + len(calls), forced=forced, clock=clock)


@dataclass(frozen=True)
class _Wait:
    """The host blocked on one of its sends (``Op.waited``) from ``start`` until it completed."""

    kind: str
    start: float
    dur: float
    waited_for: Op


def _add(slots: list[Slot], slot: Slot) -> int:
    slots.append(slot)
    return len(slots) - 1


def _timeline(step: StepOps) -> list[tuple[str, Any]]:
    """("op" | "gap" | "wait", op) in order. On the host clock the time between two recorded operations
    is the training thread's own work, kept as a gap named after the operation it leads to ("end" for
    the tail), and a send the host waited for is a wait at that point (a dependency on the receiver,
    not work); on the device clock the time between operations is launch delay and left out."""
    if step.clock != "host":
        return [("op", op) for op in step.ops]
    events: list[tuple[str, Any]] = [("op", op) for op in step.ops]
    events += [("wait", _Wait("wait", op.waited, op.start + op.dur - op.waited, op)) for op in step.ops
               if op.waited is not None]
    events.sort(key=lambda e: (e[1].start, 0 if e[1].kind == "send" else 1))
    out: list[tuple[str, Any]] = []
    cursor, end = step.body
    for what, op in events:
        if op.start > cursor:
            out.append(("gap", Op(op.kind, cursor, op.start - cursor)))
        out.append((what, op))
        cursor = max(cursor, op.start if op.kind == "send" else op.start + op.dur)
    if end > cursor:
        out.append(("gap", Op("end", cursor, end - cursor)))
    return out


def _order(seqs: list[list[Instr]]) -> tuple[list[tuple[int, int, int, int]], int]:
    """Each rank's instructions merged in an order that respects every dependency; the number of
    dependencies forced open when none was left to satisfy (inconsistent operations)."""
    n = len(seqs)
    pos = [0] * n
    joined = [False] * n
    posted: set[int] = set()
    received: set[int] = set()
    arrived: collections.Counter[int] = collections.Counter()
    waiting: dict[int, list[int]] = collections.defaultdict(list)
    ready = collections.deque(range(n))
    queued = [True] * n
    program: list[tuple[int, int, int, int]] = []
    forced = 0
    done = 0
    while done < n:
        if not ready:           # every rank left waits on something that never comes: release one
            r = next(i for i in range(n) if pos[i] < len(seqs[i]))
            inst = seqs[r][pos[r]]
            forced += 1
            if inst[0] == RECV:
                posted.add(inst[1])
            elif inst[0] == SENT:
                received.add(inst[1])
            else:
                arrived[inst[1]] = inst[3]
            ready.append(r)
            queued[r] = True
        r = ready.popleft()
        queued[r] = False
        seq = seqs[r]
        if pos[r] >= len(seq):
            continue           # woken by a stale wait after it finished
        while pos[r] < len(seq):
            inst = seq[pos[r]]
            code = inst[0]
            if code == WORK:
                program.append((WORK, r, inst[1], 0))
            elif code == POST:
                program.append((POST, r, 0, inst[1]))
                posted.add(inst[1])
                _wake(waiting.pop(inst[1], ()), ready, queued)
            elif code == RECV:
                if inst[1] not in posted:
                    waiting[inst[1]].append(r)
                    break
                program.append((RECV, r, inst[2], inst[1]))
                received.add(inst[1])
                _wake(waiting.pop(-1 - inst[1], ()), ready, queued)
            elif code == SENT:
                if inst[1] not in received:
                    waiting[-1 - inst[1]].append(r)
                    break
                program.append((SENT, r, 0, inst[1]))
            else:
                link = inst[1]
                if not joined[r]:
                    joined[r] = True
                    program.append((JOIN, r, 0, link))
                    arrived[link] += 1
                    if arrived[link] >= inst[3]:
                        _wake(waiting.pop(link, ()), ready, queued)
                if arrived[link] < inst[3]:
                    waiting[link].append(r)
                    break
                joined[r] = False
                program.append((LEAVE, r, inst[2], link))
            pos[r] += 1
        else:
            done += 1
    return program, forced


def _wake(ranks: Sequence[int], ready: collections.deque[int], queued: list[bool]) -> None:
    for r in ranks:
        if not queued[r]:
            queued[r] = True
            ready.append(r)


def run(graph: StepGraph, durations: Sequence[float]) -> float:
    """The step's time with ``durations`` (one per slot): when its last rank finishes."""
    clock = [0.0] * len(graph.ranks)
    post = [0.0] * graph.links
    done = [0.0] * graph.links
    for code, r, slot, link in graph.program:
        if code == WORK:
            clock[r] += durations[slot]
        elif code == POST:
            post[link] = clock[r]
        elif code == RECV:
            t, p = clock[r], post[link]
            clock[r] = done[link] = (t if t > p else p) + durations[slot]
        elif code == JOIN:
            if clock[r] > post[link]:
                post[link] = clock[r]
        elif code == LEAVE:
            clock[r] = post[link] + durations[slot]
        elif done[link] > clock[r]:
            clock[r] = done[link]
    return max(clock, default=0.0)


SOURCES = ("measured", "ideal", "peers", "balanced", "evened")


class Model:
    """The compiled steps of a job and the durations each variant gives their slots.

    ``stage_of`` / ``replica_of`` place a rank in the layout. Sources of a slot's duration:
    * ``measured``: as the probe timed it;
    * ``ideal``: work at the mean of its key over every rank and step, a transfer at the median;
    * ``peers``: work at the median of its key over its stage (every replica, every step): a worker
      at its peers' speed; transfers as measured;
    * ``balanced``: a stage's compute (forward, backward) scaled by the mean of the stages' medians over
      its own stage's, so every stage does the same typical compute with its step-to-step variation
      kept: layers moved until the stages balance; the rest as measured;
    * ``evened``: work at the mean over the replicas of the same slot (stage, step, key, place in
      the step): the step's data spread evenly over the replicas, its total unchanged.
    """

    def __init__(self, graphs: Sequence[StepGraph], stage_of: Callable[[int], int],
                 replica_of: Callable[[int], int]) -> None:
        self.graphs = tuple(graphs)
        self.stage_of = stage_of
        self.replica_of = replica_of
        # On the host clock a send's completion is seen late (when the host next looks), so a pair's
        # shorter duration can still hold waiting; its channel's floor over the window is the transfer.
        floor: dict[tuple[int, ...], float] = {}
        for g in self.graphs:
            if g.clock == "host":
                for s in g.slots:
                    if s.key == ("p2p",):
                        floor[s.owners] = min(s.dur, floor.get(s.owners, s.dur))
        self.floor = floor
        work: dict[Key, list[float]] = collections.defaultdict(list)
        transfer: dict[Key, list[float]] = collections.defaultdict(list)
        by_stage: dict[tuple[Key, int], list[float]] = collections.defaultdict(list)
        by_slot: dict[tuple[int, Key, int, int], list[float]] = collections.defaultdict(list)
        for g in self.graphs:
            for s in g.slots:
                if s.work:
                    stage = stage_of(s.owners[0])
                    work[s.key].append(s.dur)
                    by_stage[(s.key, stage)].append(s.dur)
                    by_slot[(g.step, s.key, stage, s.nth)].append(s.dur)
                else:
                    transfer[s.key].append(self.floor.get(s.owners, s.dur) if s.key == ("p2p",) else s.dur)
        self.ideal: dict[Key, float] = {k: statistics.fmean(v) for k, v in work.items()}
        self.ideal.update({k: statistics.median(v) for k, v in transfer.items()})
        self.peer = {k: statistics.median(v) for k, v in by_stage.items()}
        stage_medians: dict[Key, list[float]] = collections.defaultdict(list)
        for (key, _), value in self.peer.items():
            stage_medians[key].append(value)
        self.level = {k: statistics.fmean(v) for k, v in stage_medians.items()}
        self.even = {k: statistics.fmean(v) for k, v in by_slot.items()}
        self._cache: dict[str, list[list[float]]] = {}
        self._where: dict[int, list[list[frozenset[Any]]]] = {}

    def durations(self, source: str) -> list[list[float]]:
        """Every graph's slot durations under ``source`` (one of ``SOURCES``)."""
        if source not in self._cache:
            self._cache[source] = [[self._value(g.step, s, source) for s in g.slots] for g in self.graphs]
        return self._cache[source]

    def _value(self, step: int, s: Slot, source: str) -> float:
        if not s.work:
            measured = self.floor.get(s.owners, s.dur) if s.key == ("p2p",) else s.dur
            return self.ideal[s.key] if source == "ideal" else measured
        if source == "measured":
            return s.dur
        if source == "ideal":
            return self.ideal[s.key]
        stage = self.stage_of(s.owners[0])
        peer = self.peer[(s.key, stage)]
        if source == "peers":
            return peer
        if source == "balanced":
            return s.dur * self.level[s.key] / peer if peer > 0 and s.key in STAGE_COMPUTE else s.dur
        return self.even[(step, s.key, stage, s.nth)]

    def times(self, base: str, take: str | None = None, where: list[list[bool]] | None = None) -> list[float]:
        """Each step's simulated time with ``base`` durations, and ``take``'s for the slots ``where``
        selects (per graph, per slot; all of them when ``where`` is None)."""
        if take is None or where is None:
            return [run(g, d) for g, d in zip(self.graphs, self.durations(take or base))]
        return [run(g, [tv if w else bv for w, bv, tv in zip(mask, b, t)])
                for g, mask, b, t in zip(self.graphs, where, self.durations(base), self.durations(take))]

    def of_stage(self, stage: int) -> list[list[bool]]:
        """The slots of ``stage``'s ranks (a transfer: any member's)."""
        return [[stage in places for places in g] for g in self._places(0)]

    def of_replica(self, replica: int) -> list[list[bool]]:
        return [[replica in places for places in g] for g in self._places(1)]

    def of_worker(self, stage: int, replica: int) -> list[list[bool]]:
        return [[(stage, replica) in places for places in g] for g in self._places(2)]

    def _places(self, which: int) -> list[list[frozenset[Any]]]:
        """Per graph, per slot: the stages (0), replicas (1) or workers (2) of its owners."""
        if which not in self._where:
            place = (lambda r: self.stage_of(r), lambda r: self.replica_of(r),
                     lambda r: (self.stage_of(r), self.replica_of(r)))[which]
            self._where[which] = [[frozenset(place(o) for o in s.owners) for s in g.slots] for g in self.graphs]
        return self._where[which]
