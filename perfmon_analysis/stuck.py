"""A job that stopped making progress: each rank's stall readings and the diagnosis naming the
rank the others wait for.

Inputs are the probes' ``stall`` records (wire 1.1, ``probe.stall``: the training thread's
stack, the collectives in flight with per-group sequence numbers, the DataLoader's state) and,
for live ranks, silence: a rank that sent nothing for ``HEARTBEAT_S`` (its sampler alone sends a
record a second) cannot run Python threads at all, the mark of a process holding the GIL in C
code or stopped. Collectives are matched across ranks by (group, sequence number): the ranks in
the same call wait; a member that issued fewer calls on that group, or went silent, never
reached it and is the culprit. Each rank's part in that call is named from its ledger and its
flight recorder (``probe.flight``), as torch's own analyzer names the ranks missing from a
collective: ``never_enqueued`` (it issued fewer calls on the group: a host/Python stall, its
stack says where) apart from a call enqueued and not completed (``scheduled``, ``started`` or,
when the recorder sees no starts, ``enqueued``: the device or the network). Pure: no I/O, no
Textual.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from perfmon_analysis import units
from perfmon_analysis.readings import InFlight, StallReading

__all__ = [
    "CALL_STATES", "HEARTBEAT_S", "NO_HELLO_S", "RankStuck", "StuckDiagnosis", "WHERE_FRAMES", "diagnose",
    "is_library", "user_frame",
]

HEARTBEAT_S = 10.0        # live rank silent this long: unresponsive (samples arrive at 1-2 Hz)
NO_HELLO_S = 3.0          # a probe's sender answers a connect within one 50 ms tick: no hello this long is silence
IDLE_CPU = 0.05           # a loader worker under 5% of a core is not working on the batch
WHERE_FRAMES = 5          # innermost frames per rank in the report's ``where``

_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/lib/python", "<frozen ", "<string>")
_PROBE_DIR = str(Path(__file__).resolve().parents[1] / "probe") + os.sep


CALL_STATES = {
    "never_enqueued": "never enqueued it: a host/Python stall (its stack below)",
    "scheduled": "enqueued it; the device has not started it",
    "started": "started it on the device; not completed",
    "enqueued": "enqueued it; not completed (whether the device started it is not recorded)",
    "completed": "completed it",
}


class RankLike(Protocol):
    """What the diagnosis reads of a rank (``perfmon_analysis.views.RankView``, frozen: read-only here)."""

    @property
    def rank(self) -> int: ...
    @property
    def host(self) -> str | None: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def stall(self) -> StallReading | None: ...
    @property
    def stalled_s(self) -> float | None: ...
    @property
    def silent_s(self) -> float | None: ...
    @property
    def answered(self) -> bool: ...


@dataclass(frozen=True)
class RankStuck:
    """One rank's part in the diagnosis, for the stuck screen."""

    rank: int
    host: str | None
    pid: int | None
    role: str                   # "culprit" | "waiting" | "unresponsive" | "other"
    seconds: float | None       # stalled (or silent) for
    doing: str                  # one line: what it is doing
    stack: tuple[str, ...]
    call: str | None = None     # its part in the awaited collective (CALL_STATES), when known
    flight: str | None = None   # what its flight recorder says, one line


@dataclass(frozen=True)
class StuckDiagnosis:
    """Which ranks hold the job, which wait, in what, since when, and where each one is."""

    kind: str                   # "collective" | "data" | "between_steps" | "in_step" | "unresponsive"
    culprit_ranks: tuple[int, ...]
    waiting_ranks: tuple[int, ...]
    op: str | None
    group: str | None
    seq: int | None
    since_s: float
    where: dict[int, tuple[str, ...]]
    headline: str
    ranks: tuple[RankStuck, ...]
    loader_pid: int | None = None
    calls: dict[int, str] = field(default_factory=dict)   # rank -> its part in the awaited call (CALL_STATES)

    def as_json(self) -> dict[str, Any]:
        """The report's ``verdict.stuck`` object."""
        return {"kind": self.kind, "culprit_ranks": list(self.culprit_ranks),
                "waiting_ranks": list(self.waiting_ranks), "op": self.op, "group": self.group, "seq": self.seq,
                "since_s": round(self.since_s, 3), "loader_pid": self.loader_pid,
                "unresponsive_ranks": [r.rank for r in self.ranks if r.role == "unresponsive"],
                "calls": {str(rank): state for rank, state in sorted(self.calls.items())},
                "where": {str(rank): list(frames[-WHERE_FRAMES:]) for rank, frames in sorted(self.where.items())}}


def diagnose(ranks: Sequence[RankLike]) -> StuckDiagnosis | None:
    """The diagnosis when some rank is stalled or unresponsive, else None."""
    stalled = {r.rank: r.stall for r in ranks if r.stall is not None}
    silent = {r.rank: r.silent_s for r in ranks
              if r.silent_s is not None and r.silent_s >= (HEARTBEAT_S if r.answered else NO_HELLO_S)}
    if not stalled and not silent:
        return None
    by_rank = {r.rank: r for r in ranks}
    lasted = {r.rank: r.stalled_s for r in ranks if r.stalled_s is not None}
    where = {rank: s.stack for rank, s in stalled.items() if s is not None}
    calls = {rank: s.inflight[0] for rank, s in stalled.items() if s is not None and s.inflight}
    if calls:
        return _collective(by_rank, stalled, silent, lasted, calls, where)
    if silent:
        unresponsive = tuple(sorted(silent))
        waiting = tuple(sorted(r for r in stalled if r not in silent))
        since = max(silent.values())
        head = f"{_ranks(unresponsive)} unresponsive: {_silence(since)}"
        if waiting:
            head += f"; {_count(waiting)} stalled for {units.age(max(lasted.get(r, 0.0) for r in waiting))}"
        return _finish("unresponsive", unresponsive, waiting, None, since, where, head, by_rank, stalled, silent,
                       lasted, {**{r: "waiting" for r in waiting}, **{r: "culprit" for r in unresponsive}})
    readings = {rank: s for rank, s in stalled.items() if s is not None and not s.moving}
    if not readings:
        return None      # long without a step, but busy (an evaluation loop, slow preprocessing): not stuck
    since = max(lasted.get(r, 0.0) for r in readings)
    in_loader = [rank for rank, s in readings.items() if s.where == "loader"]
    if in_loader and len(in_loader) == len(readings):
        culprit = min(in_loader, key=lambda r: (readings[r].awaited_pid is None, r))
        reading = readings[culprit]
        who = "all ranks wait" if len(in_loader) == len(ranks) and len(ranks) > 1 else f"{_ranks(in_loader)} waits"
        head = f"{who} in data loading for {units.age(since)}: {_loader_state(reading, culprit)}"
        return _finish("data", tuple(sorted(in_loader)), (), None, since, where, head, by_rank, stalled, silent,
                       lasted, {r: "culprit" for r in in_loader}, loader_pid=reading.awaited_pid)
    culprits = tuple(sorted(readings))
    first = readings[culprits[0]]
    if first.where == "between":
        head = f"{_ranks(culprits)} stuck between steps {_site(first.stack)} for {units.age(since)}"
        kind = "between_steps"
    else:
        step = f" {first.step + 1}" if first.step is not None else ""
        head = f"{_ranks(culprits)} stuck inside step{step} {_site(first.stack)} for {units.age(since)}"
        kind = "in_step"
    return _finish(kind, culprits, (), None, since, where, head, by_rank, stalled, silent, lasted,
                   {r: "culprit" for r in culprits})


def _collective(by_rank: dict[int, RankLike], stalled: dict[int, StallReading], silent: dict[int, float],
                lasted: dict[int, float], calls: dict[int, InFlight],
                where: dict[int, tuple[str, ...]]) -> StuckDiagnosis:
    """Ranks wait in a collective: the call most of them are in, and the members that never reached it."""
    (group, seq), _ = Counter((c.group, c.seq) for c in calls.values()).most_common(1)[0]
    waiting = tuple(sorted(r for r, c in calls.items() if (c.group, c.seq) == (group, seq) and r not in silent))
    op = next(c.op for r, c in calls.items() if (c.group, c.seq) == (group, seq))
    members = sorted(by_rank) if group == "world" else \
        sorted({r for r, s in stalled.items() if s is not None and group in s.seq} | set(waiting))
    others = [r for r in members if r not in waiting]
    definite = [r for r in others if r in silent or _issued(stalled.get(r), group, seq)]
    culprits = tuple(definite or others)
    since = max((lasted.get(r, 0.0) for r in waiting), default=0.0)
    states = {r: state for r in sorted(set(members) | set(waiting))
              if (state := call_state(stalled.get(r), group, seq)) is not None}
    call = f"{op} #{seq}" if seq is not None else op
    if group != "world":
        call += f" of group {group}"
    if culprits:
        parts = [f"{_rank_on(culprits[0], by_rank)} never reached {call} "
                 f"({_doing(culprits[0], stalled.get(culprits[0]), silent)})"
                 if len(culprits) == 1 else f"{_ranks(culprits)} never reached {call}"]
    else:
        parts = [f"every rank enqueued {call}, none completed it ({_device_or_network(states)})"]
    parts.append(f"{_count(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in it for {units.age(since)}")
    roles = {r: "waiting" for r in waiting}
    roles.update({r: "unresponsive" if r in silent else "culprit" for r in culprits})
    return _finish("collective", culprits, waiting, (op, group, seq), since, where, "; ".join(parts), by_rank,
                   stalled, silent, lasted, roles, calls=states)


def _finish(kind: str, culprits: tuple[int, ...], waiting: tuple[int, ...], call: tuple[str, str, int | None] | None,
            since: float, where: dict[int, tuple[str, ...]], headline: str, by_rank: dict[int, RankLike],
            stalled: dict[int, StallReading], silent: dict[int, float], lasted: dict[int, float],
            roles: dict[int, str], loader_pid: int | None = None,
            calls: dict[int, str] | None = None) -> StuckDiagnosis:
    calls = calls or {}
    rows = []
    for rank in sorted(by_rank):
        r = by_rank[rank]
        reading = stalled.get(rank)
        role = roles.get(rank, "unresponsive" if rank in silent else "other")
        rows.append(RankStuck(rank, r.host, r.pid, role, silent.get(rank, lasted.get(rank)),
                              _doing(rank, reading, silent), reading.stack if reading is not None else (),
                              CALL_STATES.get(calls.get(rank, "")), _flight_line(reading)))
    op, group, seq = call if call is not None else (None, None, None)
    return StuckDiagnosis(kind, culprits, waiting, op, group, seq, since, where, headline, tuple(rows), loader_pid,
                          calls)


def call_state(reading: StallReading | None, group: str, seq: int | None) -> str | None:
    """This rank's part in collective ``seq`` of ``group`` (a CALL_STATES key), None when unknown.
    The recorder's entry counts only when the recorder numbers the group's calls as the record's
    ``seq`` does (torch also counts calls the probe's ledger does not wrap)."""
    if reading is None or seq is None:
        return None
    entry = next((e for e in reading.flight if (e.group, e.seq) == (group, seq)), None)
    if entry is not None and reading.flight_enqueued.get(group) == reading.seq.get(group):
        return entry.state
    if any((c.group, c.seq) == (group, seq) for c in reading.inflight):
        return "enqueued"
    if _issued(reading, group, seq):
        return "never_enqueued"
    return None


# -- wording -----------------------------------------------------------------------------------
def is_library(frame: str) -> bool:
    """A frame of Python itself, an installed package or perfmon's probe, not the user's code."""
    path = frame.rpartition(" in ")[0]
    return any(mark in path for mark in _LIBRARY_MARKS) or path.startswith(_PROBE_DIR)


def user_frame(stack: tuple[str, ...]) -> tuple[str | None, str | None]:
    """(innermost frame of the user's code shortened to ``file:line in function``, the function
    it is inside of below that, e.g. ``save``), from a stack innermost last."""
    for i in range(len(stack) - 1, -1, -1):
        if not is_library(stack[i]):
            callee = stack[i + 1].rpartition(" in ")[2] if i + 1 < len(stack) else None
            return _short(stack[i]), callee
    return (_short(stack[-1]) if stack else None), None


def _site(stack: tuple[str, ...]) -> str:
    frame, callee = user_frame(stack)
    if frame is None:
        return "(no stack)"
    return f"in {callee} called at {frame}" if callee else f"at {frame}"


def _short(frame: str) -> str:
    path, _, function = frame.rpartition(" in ")
    file, _, line = path.rpartition(":")
    return f"{os.path.basename(file)}:{line} in {function}"


def _doing(rank: int, reading: StallReading | None, silent: dict[int, float]) -> str:
    if rank in silent:
        return _silence(silent[rank])
    if reading is None:
        return "no stall reported"
    if reading.inflight:
        call = reading.inflight[0]
        return f"in {call.op} #{call.seq}" if call.seq is not None else f"in {call.op}"
    if reading.moving:
        frame, _ = user_frame(reading.stack)
        return f"busy{' between steps' if reading.where == 'between' else ''}, now at {frame or 'n/a'}"
    if reading.where == "loader":
        return _loader_state(reading, rank)
    frame, callee = user_frame(reading.stack)
    if frame is None:
        return "stalled (no stack)"
    inside = f"in {callee} from " if callee else ""
    return ("between steps, " if reading.where == "between" else "") + f"{inside}{frame}"


def _loader_state(reading: StallReading, rank: int) -> str:
    worker = reading.awaited_worker
    if worker is None:
        pids = ", ".join(str(w.pid) for w in reading.workers if w.pid is not None)
        return f"rank {rank} waits in DataLoader next()" + (f" (workers {pids})" if pids else "")
    if not worker.alive:
        return f"worker {worker.pid} of rank {rank} is gone (its batch never comes)"
    if worker.cpu is None:
        return f"rank {rank} waits for worker {worker.pid}"
    state = "idle" if worker.cpu < IDLE_CPU else "busy"
    return f"worker {worker.pid} of rank {rank} is {state} at {units.pct(worker.cpu)} CPU"


def _device_or_network(states: dict[int, str]) -> str:
    """Every rank called it: the device or the network holds it; the recorders' states say which
    ranks' devices never started it, when they see starts."""
    unstarted = sorted(r for r, s in states.items() if s == "scheduled")
    if unstarted and any(s == "started" for s in states.values()):
        return f"the device of {_ranks(unstarted)} never started it"
    return "the device or the network"


def _flight_line(reading: StallReading | None) -> str | None:
    """One line on what this rank's flight recorders hold, or why they hold nothing."""
    if reading is None or not reading.flight_sources:
        return None
    where = "+".join(reading.flight_sources)
    if not reading.flight:
        return f"flight recorder ({where}): {reading.flight_note or 'no collective in flight'}"
    calls = ", ".join(f"{e.op} #{e.seq}" + (f" of group {e.group}" if e.group != "world" else "")
                      + f" {e.state}" + (f" ({e.backend})" if e.backend else "") for e in reading.flight[-3:])
    return f"flight recorder ({where}): {calls}"


def _silence(seconds: float) -> str:
    return (f"no record for {units.age(seconds)} (a process holding the GIL in C code, "
            "or stopped)")


def _issued(reading: StallReading | None, group: str, seq: int | None) -> bool:
    """Did this rank issue fewer calls on ``group`` than the awaited sequence number?"""
    if reading is None or seq is None:
        return False
    issued = reading.seq.get(group)
    return issued is not None and issued < seq


def _ranks(ranks: Any) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)


def _rank_on(rank: int, by_rank: dict[int, RankLike]) -> str:
    """'rank 3', or 'rank 3 on n02' when the ranks run on more than one node."""
    hosts = {r.host for r in by_rank.values() if r.host}
    host = by_rank[rank].host if rank in by_rank else None
    return f"rank {rank} on {host}" if host and len(hosts) > 1 else f"rank {rank}"


def _count(ranks: tuple[int, ...]) -> str:
    return f"{len(ranks)} rank" + ("" if len(ranks) == 1 else "s")
