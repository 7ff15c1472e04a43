"""Step and event records: the step's phases, communication, CPU clock and the time lost before it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from perfmon_analysis.readings.base import _int, num, wire_dict


@dataclass(frozen=True)
class StepBar:
    """One step as the timeline draws it: phases + gap = dur (wire contract), in wire order."""

    step: int
    dur: float
    gap: float
    phases: tuple[tuple[str, float], ...]
    sync_site: str | None = None     # "file:line" of the step's most frequent host-device sync

    def phase(self, name: str) -> float | None:
        return next((secs for n, secs in self.phases if n == name), None)


@dataclass(frozen=True, slots=True)
class StepReading:
    """One ``step`` record, parsed once at ingest: what the statistics, the timeline and the trace
    export read of a step. ``gap`` is the model's: the wire's, else the seconds of the blocking
    events before the step (``gap_inferred``), clamped to [0, dur]; ``pause``: the part of the gap
    that is an occasional pause (``perfmon_analysis.pauses``), the rest (``loop``) the loop's own
    work between steps; ``start`` is the previous step's end, ``t`` - ``dur`` when the probe did not
    send it."""

    step: int
    t: float | None
    start: float | None
    dur: float
    gap: float
    phases: tuple[tuple[str, float], ...]     # wire order; an unknown phase reads 0
    has_data: bool                            # the step reported a data phase
    data: float
    comm_s: float | None                      # collective seconds (0: the comm hooks saw none)
    exposed: float | None                     # of which not overlapped with compute
    estimated: bool
    samples: float | None
    tokens: float | None
    flops: float | None
    syncs: float | None
    data_cpu: float | None
    lead: float | None          # seconds the host finished ahead of the device (CUDA events)
    gpu_time: float | None      # the device's time from the step's first event to its last, idle included
    whole: bool | None          # the host queued the step whole before the device began it (wire 1.5)
    sync_site: str | None       # "file:line" of the step's most frequent host-device sync
    mem_peak: int | None        # the step's allocator reserved bytes, else its peak
    cpu: float | None = None    # training thread CPU s in the step body (``step_cpu``)
    cpu_active: bool = False    # the probe's in-step span (CPU time, stack samples) was the whole active step
    gap_inferred: bool = False
    record: dict[str, Any] = field(default_factory=dict, repr=False)   # as held: a relay forwards it, gap included
    pause: float = 0.0
    gap_cpu: float | None = None    # the training thread's CPU s in the gap (zero-code mode, wire 1.5)

    @property
    def active(self) -> float:
        return max(self.dur - self.gap, 1e-9)

    @property
    def loop(self) -> float:
        """The gap's in-loop part: time between steps that recurs with the loop."""
        return max(0.0, self.gap - self.pause)

    @property
    def data_share(self) -> float:
        return max(0.0, min(1.0, self.data / self.active))

    def phase(self, name: str) -> float | None:
        return next((secs for n, secs in self.phases if n == name), None)

    def bar(self) -> StepBar:
        return StepBar(step=self.step, dur=self.dur, gap=self.gap, phases=self.phases, sync_site=self.sync_site)


def step_reading(rec: dict[str, Any], pending_gap: float = 0.0,
                 pauses: Callable[[float, float, float], float] | None = None) -> StepReading | None:
    """The step ``rec`` says, or None without its step number or duration. ``pending_gap``: the
    blocking-event seconds since the previous step, its gap when the record has none and a pause in it
    either way; ``pauses(gap, dur, marked)``: the pause in the gap (``perfmon_analysis.pauses``), else
    the events' seconds alone."""
    step, dur = rec.get("step"), num(rec.get("dur"))
    if not isinstance(step, int) or isinstance(step, bool) or dur is None:
        return None
    end = num(rec.get("t"))
    start = num(rec.get("start"))
    if start is None and end is not None:
        start = end - dur
    gap = num(rec.get("gap"))
    inferred = gap is None and min(pending_gap, dur) > 0
    if gap is None:
        gap = min(pending_gap, dur)
    phases = wire_dict(rec.get("phases"))
    comm = c if isinstance(c := rec.get("comm"), dict) else None
    mem = wire_dict(rec.get("mem"))
    site = rec.get("sync_site")
    cpu, cpu_active = step_cpu(rec)
    gap = max(0.0, min(gap, dur))
    marked = min(pending_gap, gap)
    return StepReading(
        step=step, t=end, start=start, dur=dur, gap=gap, pause=pauses(gap, dur, marked) if pauses else marked,
        phases=tuple((str(n), num(v) or 0.0) for n, v in phases.items()),
        has_data="data" in phases, data=num(phases.get("data")) or 0.0,
        comm_s=_comm_value(comm, "seconds"), exposed=_comm_value(comm, "exposed"),
        estimated=bool(comm.get("estimated")) if comm else False, samples=num(rec.get("samples")),
        tokens=num(rec.get("tokens")), flops=num(rec.get("flops")), syncs=num(rec.get("syncs")),
        data_cpu=num(rec.get("data_cpu")), lead=num(rec.get("lead")), gpu_time=num(rec.get("gpu_time")),
        whole=rec["whole"] if isinstance(rec.get("whole"), bool) else None,
        sync_site=site if isinstance(site, str) and site else None,
        mem_peak=_int(mem.get("reserved")) or _int(mem.get("peak")), cpu=cpu, cpu_active=cpu_active,
        gap_inferred=inferred, record=dict(rec, gap=gap) if inferred else rec, gap_cpu=num(rec.get("gap_cpu")))


def _comm_value(comm: dict[str, Any] | None, key: str) -> float | None:
    """``comm[key]`` seconds; a step the comm instrumentation saw with no collective counts as 0."""
    if comm is None:
        return None
    value = num(comm.get(key))
    if value is None and comm.get("ops") == 0:
        return 0.0
    return value


@dataclass(frozen=True, slots=True)
class EventReading:
    """One ``event`` record; ``record`` is the record itself, as the log pane lists it."""

    t: float | None
    name: str
    seconds: float | None
    record: dict[str, Any]
    unmeasured: str | None = None    # the quantity a warning says the probe cannot measure ("comm")
    message: str = ""


def event_reading(rec: dict[str, Any]) -> EventReading:
    name, unmeasured, message = rec.get("name"), rec.get("unmeasured"), rec.get("message")
    return EventReading(t=num(rec.get("t")), name=name if isinstance(name, str) else "",
                        seconds=num(rec.get("seconds")), record=rec,
                        unmeasured=unmeasured if isinstance(unmeasured, str) else None,
                        message=message if isinstance(message, str) else "")


def step_cpu(rec: dict[str, Any]) -> tuple[float | None, bool]:
    """(CPU seconds of work in the step's body: the training thread's, or its intra-op threads' per
    thread where more, and whether the probe's span was the whole active step). ``cpu`` covers the step
    body in API mode (``cpu_span`` "body": the loader
    wait is before it) and the active step in zero-code mode ("active": the loader wait is inside,
    so its ``data_cpu`` is taken out). None: not measured."""
    cpu = num(rec.get("cpu"))
    if cpu is None or cpu < 0:
        return None, False
    active = rec.get("cpu_span") == "active"
    if active:
        cpu = max(0.0, cpu - (num(rec.get("data_cpu")) or 0.0))
    # torch's intra-op threads share each CPU op with the training thread, which waits for the
    # slowest off its CPU: while they run, the step works. Their CPU per thread is the op's length.
    others, threads = num(rec.get("cpu_others")), num(rec.get("intra_threads"))
    if others is not None and threads is not None and threads > 1:
        cpu = max(cpu, others / (threads - 1))
    return cpu, active
