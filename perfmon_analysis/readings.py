"""Typed readings: what each wire record says, parsed once.

The run model, its statistics, the panes, the verdict and the exports read these instead of
wire dicts, so a wire key is spelled in exactly two places: ``probe/wire.py``'s schema and this
module (and ``perfmon_analysis.summary``, which writes and reads its own payload). Every field is
None when the probe did not report it (unknown is never 0); utilisations are 0..1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable



def num(value: Any) -> float | None:
    """A wire number as a float; None for anything else (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


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


@dataclass(frozen=True)
class GpuReading:
    """One GPU in one ``sample`` record (NVML; ``sm_active``/``tensor_active`` on GPM devices only)."""

    index: int | None
    util: float | None
    name: str | None = None
    uuid: str | None = None          # NVML's "GPU-..." (dcgm-exporter's UUID label)
    sm_active: float | None = None
    tensor_active: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    temp_c: float | None = None
    throttle: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuRow:
    """A GPU the job uses, once per (host, index): the rank that reports it and its recent util."""

    rank: int
    gpu: GpuReading
    util_history: tuple[float | None, ...]


@dataclass(frozen=True)
class HostReading:
    """The host side of a rank's latest sample: its process CPU (cores) and the node's."""

    cpu: float | None
    cpu_count: int | None
    sys_cpu: float | None
    rss: int | None


@dataclass(frozen=True)
class RankTrace:
    """A rank's recent history for the timeline, data and device panes, oldest first."""

    steps: tuple[StepBar, ...]
    data_wait: tuple[float, ...]            # data-wait share of each step (0..1)
    cpu: tuple[float | None, ...]           # process CPU (cores) of each recent sample


@dataclass(frozen=True, slots=True)
class StepReading:
    """One ``step`` record, parsed once at ingest: what the statistics, the timeline and the trace
    export read of a step. ``gap`` is the model's: the wire's, else the seconds of the blocking
    events before the step (``gap_inferred``), clamped to [0, dur]; ``start`` is the previous
    step's end, ``t`` - ``dur`` when the probe did not send it."""

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
    sync_site: str | None       # "file:line" of the step's most frequent host-device sync
    mem_peak: int | None        # the step's allocator reserved bytes, else its peak
    cpu: float | None = None    # training thread CPU s in the step body (``step_cpu``)
    cpu_active: bool = False    # the probe's in-step span (CPU time, stack samples) was the whole active step
    gap_inferred: bool = False

    @property
    def active(self) -> float:
        return max(self.dur - self.gap, 1e-9)

    @property
    def data_share(self) -> float:
        return max(0.0, min(1.0, self.data / self.active))

    def phase(self, name: str) -> float | None:
        return next((secs for n, secs in self.phases if n == name), None)

    def bar(self) -> StepBar:
        return StepBar(step=self.step, dur=self.dur, gap=self.gap, phases=self.phases, sync_site=self.sync_site)


def step_reading(rec: dict[str, Any], pending_gap: float = 0.0) -> StepReading | None:
    """The step ``rec`` says, or None without its step number or duration. ``pending_gap``: the
    blocking-event seconds since the previous step, its gap when the record has none."""
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
    phases = rec.get("phases") if isinstance(rec.get("phases"), dict) else {}
    comm = rec.get("comm") if isinstance(rec.get("comm"), dict) else None
    mem = rec.get("mem") if isinstance(rec.get("mem"), dict) else {}
    site = rec.get("sync_site")
    cpu, cpu_active = step_cpu(rec)
    return StepReading(
        step=step, t=end, start=start, dur=dur, gap=max(0.0, min(gap, dur)),
        phases=tuple((str(n), num(v) or 0.0) for n, v in phases.items()),
        has_data="data" in phases, data=num(phases.get("data")) or 0.0,
        comm_s=_comm_value(comm, "seconds"), exposed=_comm_value(comm, "exposed"),
        estimated=bool(comm.get("estimated")) if comm else False, samples=num(rec.get("samples")),
        tokens=num(rec.get("tokens")), flops=num(rec.get("flops")), syncs=num(rec.get("syncs")),
        data_cpu=num(rec.get("data_cpu")), lead=num(rec.get("lead")),
        sync_site=site if isinstance(site, str) and site else None,
        mem_peak=_int(mem.get("reserved")) or _int(mem.get("peak")), cpu=cpu, cpu_active=cpu_active,
        gap_inferred=inferred)


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


def event_reading(rec: dict[str, Any]) -> EventReading:
    name = rec.get("name")
    return EventReading(t=num(rec.get("t")), name=name if isinstance(name, str) else "",
                        seconds=num(rec.get("seconds")), record=rec)


def _frac(value: Any) -> float | None:
    """0..1 utilisation; old probes sent percent."""
    v = num(value)
    return None if v is None else v / 100.0 if v > 1.0 else v


def _int(value: Any) -> int | None:
    v = num(value)
    return None if v is None else int(v)


def gpu_reading(g: dict[str, Any]) -> GpuReading:
    throttle = g.get("throttle") if isinstance(g.get("throttle"), list) else []
    return GpuReading(
        index=_int(g.get("index")), util=_frac(g.get("util")), name=_text(g.get("name")), uuid=_text(g.get("uuid")),
        sm_active=_frac(g.get("sm_active")),
        tensor_active=_frac(g.get("tensor_active")), mem_used=_int(g.get("mem_used")),
        mem_total=_int(g.get("mem_total")), power_w=num(g.get("power_w")), power_limit_w=num(g.get("power_limit_w")),
        sm_clock_mhz=num(g.get("sm_clock")), temp_c=num(g.get("temp_c")),
        throttle=tuple(t for t in throttle if isinstance(t, str)))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def gpu_readings(sample: dict[str, Any]) -> tuple[GpuReading, ...]:
    return tuple(gpu_reading(g) for g in (sample.get("gpus") or []) if isinstance(g, dict))


def host_reading(sample: dict[str, Any]) -> HostReading:
    host = sample.get("host") if isinstance(sample.get("host"), dict) else {}
    return HostReading(cpu=num(host.get("cpu")), cpu_count=_int(host.get("cpu_count")) or None,
                       sys_cpu=num(host.get("sys_cpu")), rss=_int(host.get("rss")))


def own_gpus(readings: tuple[GpuReading, ...], local_rank: int) -> tuple[GpuReading, ...]:
    """The GPUs a rank uses: index = its local rank when the sample lists it, else all it lists."""
    return tuple(g for g in readings if g.index == local_rank) or readings


def gpu_rows(ranks: Iterable[tuple[int, str | None, int, list[dict[str, Any]]]]) -> tuple[GpuRow, ...]:
    """One row per distinct GPU over (rank, host, local_rank, recent samples), a rank's own GPU first."""
    seen: set[tuple[str | None, int | None]] = set()
    rows = []
    for rank, host, local, samples in ranks:
        latest = gpu_readings(samples[-1]) if samples else ()
        if not latest:
            continue            # no GPU in the newest sample (a CPU job): no history to read either
        history = [gpu_readings(s) for s in samples[:-1]] + [latest]
        for gpu in own_gpus(latest, local):
            if (host, gpu.index) in seen:
                continue
            seen.add((host, gpu.index))
            util = tuple(next((g.util for g in h if g.index == gpu.index), None) for h in history)
            rows.append(GpuRow(rank=rank, gpu=gpu, util_history=util))
    return tuple(rows)


@dataclass(frozen=True)
class WhereCount:
    """One line of a ``where`` interval: the user's source line (the innermost frame outside the
    stdlib, site-packages and perfmon), the library call below it, and the in-step stack samples
    that found the training thread there in ``state`` ("waiting": off CPU, "busy": on CPU, None:
    the probe could read neither its CPU clock nor its scheduler statistics)."""

    file: str
    line: int
    function: str
    call: str | None
    lib: str | None
    state: str | None
    n: int


@dataclass(frozen=True)
class WhereInterval:
    """One ``where`` record: the training thread's in-step stack samples over [t0, t1]."""

    t0: float
    t1: float
    hz: float | None
    samples: int
    lines: tuple[WhereCount, ...]
    other: int
    runq: float | None = None    # share of the sampled in-step time the thread was runnable, waiting for a core


WHERE_STATES = ("waiting", "busy")


def where_interval(rec: dict[str, Any]) -> WhereInterval | None:
    """A ``where`` record, or None when its interval or sample count is missing (nothing to add up)."""
    t0, t1, samples = num(rec.get("t0")), num(rec.get("t1")), _int(rec.get("samples"))
    if t0 is None or t1 is None or samples is None or samples < 0:
        return None
    lines = []
    for item in rec.get("lines") if isinstance(rec.get("lines"), list) else []:
        if not isinstance(item, dict):
            continue
        file, function, line, n = _text(item.get("file")), _text(item.get("function")), _int(item.get("line")), \
            _int(item.get("n"))
        state = item.get("state")
        if file is None or line is None or n is None or n <= 0 or (state is not None and state not in WHERE_STATES):
            continue
        lines.append(WhereCount(file=file, line=line, function=function or "?", call=_text(item.get("call")),
                                lib=_text(item.get("lib")), state=state, n=n))
    runq = num(rec.get("runq"))
    return WhereInterval(t0=t0, t1=t1, hz=num(rec.get("hz")), samples=samples, lines=tuple(lines),
                         other=max(0, _int(rec.get("other")) or 0),
                         runq=None if runq is None else max(0.0, min(1.0, runq)))


def step_cpu(rec: dict[str, Any]) -> tuple[float | None, bool]:
    """(CPU seconds of work in the step's body: the training thread's, or its intra-op threads' per
    thread where more, and whether the probe's span was the whole active step). ``cpu`` covers the step body in API mode (``cpu_span`` "body": the loader
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
