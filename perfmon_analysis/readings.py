"""Typed readings: what each wire record says, parsed once.

The run model, its statistics, the panes, the verdict and the exports read these instead of
wire dicts, so a wire key is spelled in exactly two places: ``probe/wire.py``'s schema and this
module (and ``perfmon_analysis.summary``, which writes and reads its own payload). Every field is
None when the probe did not report it (unknown is never 0); utilisations are 0..1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    energy_mj: float | None = None      # NVML's total energy counter (mJ since the driver loaded)
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
    loader_cpu: float | None = None      # the DataLoader workers' CPU (cores)
    loader_workers: int | None = None
    mem_limit: int | None = None         # the process's memory limit (cgroup, rlimit) and where it comes from
    mem_limit_source: str | None = None


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
    record: dict[str, Any] = field(default_factory=dict, repr=False)   # as held: a relay forwards it, gap included

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
        gap_inferred=inferred, record=dict(rec, gap=gap) if inferred else rec)


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


def _frac(value: Any) -> float | None:
    """0..1 utilisation; a value over 1 is a percent."""
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
        energy_mj=num(g.get("energy_mj")), sm_clock_mhz=num(g.get("sm_clock")), temp_c=num(g.get("temp_c")),
        throttle=tuple(t for t in throttle if isinstance(t, str)))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def gpu_readings(sample: dict[str, Any]) -> tuple[GpuReading, ...]:
    return tuple(gpu_reading(g) for g in (sample.get("gpus") or []) if isinstance(g, dict))


def host_reading(sample: dict[str, Any]) -> HostReading:
    host = sample.get("host") if isinstance(sample.get("host"), dict) else {}
    return HostReading(cpu=num(host.get("cpu")), cpu_count=_int(host.get("cpu_count")) or None,
                       sys_cpu=num(host.get("sys_cpu")), rss=_int(host.get("rss")),
                       loader_cpu=num(host.get("loader_cpu")),
                       loader_workers=_whole(host.get("loader_workers")), mem_limit=_int(host.get("mem_limit")) or None,
                       mem_limit_source=_text(host.get("mem_limit_source")))


def record_time(rec: dict[str, Any]) -> float | None:
    """Any record's probe time ``t`` (unix seconds)."""
    return num(rec.get("t"))


def dropped(rec: dict[str, Any]) -> int:
    """Records a ``drops`` record says the probe dropped (0 when it says nothing usable)."""
    count = _whole(rec.get("count"))
    return count if count is not None and count > 0 else 0


@dataclass(frozen=True)
class DeviceReading:
    """The job's device (``probe.gpu.job``): in the hello, then in a sample when it changes."""

    type: str | None = None              # "cuda" | "cpu" | ...
    name: str | None = None
    status: str | None = None            # why no GPU counters can be tied to it
    memory_total: int | None = None
    dtype: str | None = None             # the compute dtype
    peak_flops: tuple[tuple[str, float], ...] = ()    # dtype -> peak FLOP/s of the device's table

    def peak(self, dtype: str) -> float | None:
        return next((v for d, v in self.peak_flops if d == dtype), None)


def device_reading(d: Any) -> DeviceReading | None:
    if not isinstance(d, dict):
        return None
    peaks = d.get("peak_flops") if isinstance(d.get("peak_flops"), dict) else {}
    known = tuple((str(dtype), peak) for dtype, peak in ((k, num(v)) for k, v in peaks.items()) if peak)
    return DeviceReading(type=_text(d.get("type")), name=_text(d.get("name")), status=_text(d.get("status")),
                         memory_total=_int(d.get("memory_total")), dtype=_text(d.get("dtype")), peak_flops=known)


@dataclass(frozen=True)
class HelloReading:
    """Who a stream is: its ``hello`` record. ``answered`` is False for the place a live stream
    holds before its hello arrives (``RunModel.expect``)."""

    job: str | None
    rank: int                            # 0 when the hello does not say
    world_size: int | None
    local_rank: int                      # 0 when the hello does not say
    pid: int | None
    host: str | None
    restart: int | None
    t: float | None
    device: DeviceReading
    gpus_status: str | None              # why the host shows no GPUs, in the probe's words
    answered: bool = True

    def same_process(self, other: HelloReading) -> bool:
        return (self.pid, self.restart, self.host) == (other.pid, other.restart, other.host)


def hello_reading(rec: dict[str, Any]) -> HelloReading:
    gpus = rec.get("gpus") if isinstance(rec.get("gpus"), dict) else {}
    status = gpus.get("status")
    return HelloReading(job=_text(rec.get("job")), rank=_whole(rec.get("rank")) or 0,
                        world_size=_whole(rec.get("world_size")), local_rank=_whole(rec.get("local_rank")) or 0,
                        pid=_whole(rec.get("pid")), host=_text(rec.get("host")), restart=_whole(rec.get("restart")),
                        t=num(rec.get("t")), device=device_reading(rec.get("device")) or DeviceReading(),
                        gpus_status=str(status) if status else None, answered=rec.get("k") == "hello")


@dataclass(frozen=True)
class ComputeReading:
    """The sampler's view of the compute: the dtype in use and the peak FLOP/s for it."""

    dtype: str | None
    peak_flops: float | None
    peak_source: str | None


@dataclass(frozen=True)
class CostReading:
    """The probe's own cost (a ``sample``'s ``cost``, wire 1.4): running totals since it started.

    ``threads`` is None when no thread CPU clock could be read; ``why`` says, per part, why it
    is not measured."""

    t: float | None
    train_s: float | None                        # training-thread s inside the probe's step calls
    train_steps: int | None                      # the steps ``train_s`` covers
    hooks: tuple[tuple[str, float], ...]         # step hook name -> its s (part of ``train_s``)
    threads: tuple[tuple[str, float], ...] | None   # perfmon thread name -> CPU s
    process_cpu: float | None                    # the process's CPU s (all threads)
    queue_items: int | None
    viewer_bytes: int | None
    backfill_bytes: int | None
    sent_bytes: int | None
    recorded_bytes: int | None
    why: tuple[tuple[str, str], ...] = ()
    # wrapper name (step, loader, phase) -> (calls so far, s a call calibrated at start-up); None:
    # not reported (an older probe, or a failed calibration: ``why``)
    wrappers: tuple[tuple[str, int, float], ...] | None = None

    def unmeasured(self, part: str, default: str) -> str:
        """Why the probe did not measure ``part`` (its own words), else ``default``."""
        return next((why for name, why in self.why if name == part), default)


def cost_reading(cost: Any, t: float | None) -> CostReading | None:
    if not isinstance(cost, dict):
        return None
    threads = cost.get("threads")
    why = cost.get("why")
    return CostReading(
        t=t, train_s=_nonneg(cost.get("train_s")), train_steps=_whole(cost.get("train_steps")),
        hooks=_seconds_by_name(cost.get("hooks")) or (),
        threads=_seconds_by_name(threads) if isinstance(threads, dict) else None,
        process_cpu=_nonneg(cost.get("process_cpu")), queue_items=_whole(cost.get("queue_items")),
        viewer_bytes=_whole(cost.get("viewer_bytes")), backfill_bytes=_whole(cost.get("backfill_bytes")),
        sent_bytes=_whole(cost.get("sent_bytes")), recorded_bytes=_whole(cost.get("recorded_bytes")),
        why=tuple((str(k), str(v)) for k, v in why.items()) if isinstance(why, dict) else (),
        wrappers=_wrappers(cost.get("wrappers")))


def _wrappers(value: Any) -> tuple[tuple[str, int, float], ...] | None:
    """``wrappers {name: [calls, s a call]}``; pairs that are not a count and a duration are left out."""
    if not isinstance(value, dict):
        return None
    out = []
    for name, pair in value.items():
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            calls, per_call = _whole(pair[0]), _nonneg(pair[1])
            if calls is not None and calls >= 0 and per_call is not None:
                out.append((str(name), calls, per_call))
    return tuple(out)


def _seconds_by_name(value: Any) -> tuple[tuple[str, float], ...] | None:
    if not isinstance(value, dict):
        return None
    return tuple((str(k), float(v)) for k, v in value.items() if num(v) is not None and v >= 0)


@dataclass(frozen=True)
class SampleReading:
    """One ``sample`` record (about one a second)."""

    t: float | None
    host: HostReading
    gpus: tuple[GpuReading, ...]
    device: DeviceReading | None         # the job's device when the sample says it
    gpu_status: str | None               # why there are no GPU readings, in the probe's words
    compute: ComputeReading | None
    cost: CostReading | None = None      # the probe's own cost (wire 1.4)


def sample_reading(rec: dict[str, Any]) -> SampleReading:
    compute = rec.get("compute")
    status = rec.get("gpu_status")
    return SampleReading(
        t=num(rec.get("t")), host=host_reading(rec), gpus=gpu_readings(rec), device=device_reading(rec.get("device")),
        gpu_status=str(status) if status else None,
        compute=ComputeReading(dtype=_text(compute.get("dtype")), peak_flops=num(compute.get("peak_flops")),
                               peak_source=_text(compute.get("peak_source")))
        if isinstance(compute, dict) else None,
        cost=cost_reading(rec.get("cost"), num(rec.get("t"))))


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """One ``memory`` record: the allocator's (or on a CPU job the process's) bytes and counters.
    ``record`` is the record as received, what a relay forwards."""

    t: float | None
    on_host: bool                        # a CPU job's memory (``device`` "cpu")
    rss: int | None
    peak: int | None
    limit: int | None
    limit_source: str | None
    reserved: int | None
    peak_reserved: int | None
    allocated: int | None
    alloc_retries: int | None
    ooms: int | None
    params: int | None
    grads: int | None
    optimizer: int | None
    activations: int | None
    cache: int | None
    other: int | None
    fragmentation: int | None
    record: dict[str, Any] = field(repr=False)


def memory_reading(rec: dict[str, Any]) -> MemoryReading:
    return MemoryReading(
        t=num(rec.get("t")), on_host=rec.get("device") == "cpu", rss=_int(rec.get("rss")), peak=_int(rec.get("peak")),
        limit=_int(rec.get("limit")), limit_source=_text(rec.get("limit_source")), reserved=_int(rec.get("reserved")),
        peak_reserved=_int(rec.get("peak_reserved")), allocated=_int(rec.get("allocated")),
        alloc_retries=_int(rec.get("alloc_retries")), ooms=_int(rec.get("ooms")), params=_int(rec.get("params")),
        grads=_int(rec.get("grads")), optimizer=_int(rec.get("optimizer")),
        activations=_int(rec.get("activations")), cache=_int(rec.get("cache")), other=_int(rec.get("other")),
        fragmentation=_int(rec.get("fragmentation")), record=rec)


@dataclass(frozen=True, slots=True)
class CommOp:
    """One collective's cumulative totals in a ``comm`` record. ``busbytes``: the bus bytes each
    call's own group size gives (the probe's), else its busbw x seconds; None: unknown."""

    op: str
    count: int | None
    bytes: int | None
    seconds: float | None
    busbytes: float | None


@dataclass(frozen=True, slots=True)
class CommReading:
    """One ``comm`` record: cumulative per-op totals. ``record``: as received, what a relay forwards."""

    t: float | None
    ops: tuple[CommOp, ...]
    record: dict[str, Any] = field(repr=False)

    def op(self, name: str) -> CommOp | None:
        return next((o for o in self.ops if o.op == name), None)


def comm_reading(rec: dict[str, Any]) -> CommReading:
    ops = []
    for o in _dicts(rec.get("ops")):
        if not isinstance(o.get("op"), str):
            continue
        seconds, busbw, busbytes = num(o.get("seconds")), num(o.get("busbw")), num(o.get("busbytes"))
        if busbytes is None and busbw is not None and seconds is not None:
            busbytes = busbw * seconds
        ops.append(CommOp(op=o["op"], count=_int(o.get("count")), bytes=_int(o.get("bytes")), seconds=seconds,
                          busbytes=busbytes))
    return CommReading(t=num(rec.get("t")), ops=tuple(ops), record=rec)


def own_gpus(readings: tuple[GpuReading, ...], local_rank: int) -> tuple[GpuReading, ...]:
    """The GPUs a rank uses: index = its local rank when the sample lists it, else all it lists."""
    return tuple(g for g in readings if g.index == local_rank) or readings


def gpu_rows(ranks: Iterable[tuple[int, str | None, int, list[SampleReading]]]) -> tuple[GpuRow, ...]:
    """One row per distinct GPU over (rank, host, local_rank, recent samples), a rank's own GPU first."""
    seen: set[tuple[str | None, int | None]] = set()
    rows = []
    for rank, host, local, samples in ranks:
        latest = samples[-1].gpus if samples else ()
        if not latest:
            continue            # no GPU in the newest sample (a CPU job): no history to read either
        history = [s.gpus for s in samples]
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


# -- stalls (``probe.stall``) ------------------------------------------------------------------
@dataclass(frozen=True)
class InFlight:
    """A collective this rank called and that has not returned."""

    op: str
    group: str
    seq: int | None
    since: float | None


@dataclass(frozen=True)
class FlightEntry:
    """A collective in a rank's flight recorder that the host has not retired."""

    op: str
    group: str
    seq: int | None
    state: str                  # "scheduled" | "started" | "completed" | "enqueued" (start not seen)
    backend: str | None


@dataclass(frozen=True)
class LoaderWorker:
    pid: int | None
    alive: bool
    cpu: float | None           # share of one core since the probe's previous look; None the first time


@dataclass(frozen=True)
class StallReading:
    """One ``stall`` record, typed. ``seconds`` is how long the stall had lasted at ``t``."""

    t: float
    seconds: float
    threshold: float | None
    step: int | None
    where: str                   # "step" | "between" | "loader"
    stack: tuple[str, ...]       # innermost last, "file:line in function"
    inflight: tuple[InFlight, ...]
    seq: dict[str, int]
    loader_waiting: bool
    awaited_pid: int | None
    workers: tuple[LoaderWorker, ...]
    device_pending: bool | None
    flight_source: str | None
    moving: bool | None = None   # its stack changed since the probe's previous look: busy, not hung
    flight: tuple[FlightEntry, ...] = ()
    flight_sources: tuple[str, ...] = ()
    flight_enqueued: dict[str, int] = field(default_factory=dict)   # group -> last enqueued, per the recorder
    flight_note: str | None = None   # why the recorder is empty

    def lasted(self, now: float) -> float:
        """How long the stall has lasted at ``now`` (the rank's probe clock)."""
        return self.seconds + max(0.0, now - self.t)

    @property
    def awaited_worker(self) -> LoaderWorker | None:
        return next((w for w in self.workers if w.pid is not None and w.pid == self.awaited_pid), None)


def stall_reading(rec: dict[str, Any]) -> StallReading | None:
    """Parse a validated ``stall`` record; None if it lacks its time or duration."""
    t, seconds = num(rec.get("t")), num(rec.get("seconds"))
    if t is None or seconds is None:
        return None
    inflight = tuple(InFlight(str(c.get("op") or "collective"), str(c.get("group") or "world"), _whole(c.get("seq")),
                              num(c.get("since")))
                     for c in _dicts(rec.get("inflight")))
    seq = {str(k): v for k, v in (rec.get("seq") or {}).items() if isinstance(v, int) and not isinstance(v, bool)} \
        if isinstance(rec.get("seq"), dict) else {}
    loader = rec.get("loader") if isinstance(rec.get("loader"), dict) else {}
    device = rec.get("device") if isinstance(rec.get("device"), dict) else {}
    flight = rec.get("flight") if isinstance(rec.get("flight"), dict) else {}
    return StallReading(
        t=t, seconds=seconds, threshold=num(rec.get("threshold")), step=_whole(rec.get("step")),
        where=str(rec.get("where") or "step"),
        stack=tuple(str(f) for f in rec.get("stack") or () if isinstance(f, str)),
        inflight=inflight, seq=seq, loader_waiting=bool(loader.get("waiting")),
        awaited_pid=_whole(loader.get("awaited_pid")),
        workers=tuple(LoaderWorker(_whole(w.get("pid")), bool(w.get("alive")), num(w.get("cpu")))
                      for w in _dicts(loader.get("workers"))),
        device_pending=device.get("pending") if isinstance(device.get("pending"), bool) else None,
        flight_source=str(flight["source"]) if flight.get("source") else None,
        moving=rec["moving"] if isinstance(rec.get("moving"), bool) else None,
        flight=tuple(FlightEntry(str(e.get("op") or "collective"), str(e.get("group") or "world"), _whole(e.get("seq")),
                                 str(e.get("state") or "enqueued"), str(e["backend"]) if e.get("backend") else None)
                     for e in _dicts(flight.get("entries"))),
        flight_sources=tuple(s for s in flight["sources"] if isinstance(s, str))
        if isinstance(flight.get("sources"), list) else (),
        flight_enqueued={str(g): n for g, st in (flight.get("groups") or {}).items() if isinstance(st, dict)
                         and (n := _whole(st.get("enqueued"))) is not None} if isinstance(flight.get("groups"), dict)
        else {},
        flight_note=str(flight["note"]) if flight.get("note") else None,
    )


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _whole(value: Any) -> int | None:
    """An int on the wire (a float or a bool is not a count or an id)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- torch.profiler captures ------------------------------------------------------------------
@dataclass(frozen=True)
class OpTime:
    name: str
    self_s: float
    calls: int


@dataclass(frozen=True)
class CaptureRecord:
    """A ``capture`` record: where the rank's trace is and what it says in brief."""

    t: float
    steps: int
    first_step: int | None
    last_step: int | None
    wall_s: float | None
    path: str | None               # on the rank's host
    top: tuple[OpTime, ...]        # by self time (device time on GPU)
    device_busy: float | None      # GPU only: kernel time over the captured wall time
    gaps: tuple[tuple[float, float], ...]   # GPU only: (idle seconds, at seconds from the first kernel)
    error: str | None = None
    thread_cpu_s: float | None = None      # CPU s of the thread that wrote it (wire 1.4 ``cost``)


def capture_record(rec: dict[str, Any]) -> CaptureRecord:
    top = tuple(OpTime(str(o.get("name"))[:120], num(o.get("self_s")) or 0.0, _whole(o.get("calls")) or 0)
                for o in _dicts(rec.get("top")))
    gaps = tuple((num(g.get("seconds")) or 0.0, num(g.get("at_s")) or 0.0) for g in _dicts(rec.get("gaps")))
    return CaptureRecord(t=num(rec.get("t")) or 0.0, steps=_whole(rec.get("steps")) or 0,
                         first_step=_whole(rec.get("first_step")), last_step=_whole(rec.get("last_step")),
                         wall_s=num(rec.get("wall_s")), path=_text(rec.get("path")), top=top,
                         device_busy=num(rec.get("device_busy")), gaps=gaps, error=_text(rec.get("error")),
                         thread_cpu_s=window_cpu(rec))


def window_cpu(rec: dict[str, Any]) -> float | None:
    """A profile's or capture's own thread CPU s (its ``cost``, wire 1.4)."""
    cost = rec.get("cost")
    return _nonneg(cost.get("thread_cpu_s")) if isinstance(cost, dict) else None


# -- module profiles (``probe.module_profile``) ---------------------------------------------
@dataclass(frozen=True)
class ModuleTimes:
    """One module of a ``profile`` record, per step; None = not measured (never negative)."""

    name: str                   # dotted path; "" is the model itself
    type: str | None
    depth: int
    params: int
    calls: float | None
    flops: float | None         # forward + backward
    fwd_flops: float | None
    fwd_s: float | None
    bwd_s: float | None


@dataclass(frozen=True)
class ProfileRecord:
    """A ``profile`` record: the modules' raw per-step seconds and FLOPs and how they were taken."""

    t: float
    steps: int
    first_step: int | None
    last_step: int | None
    depth: int
    step_s: float | None
    timer: str | None
    peak_flops: float | None
    peak_source: str | None
    modules: tuple[ModuleTimes, ...]
    flops_note: str | None
    error: str | None
    truncated: bool
    thread_cpu_s: float | None = None    # CPU s of the thread that built it (wire 1.4 ``cost``)


def profile_record(rec: dict[str, Any]) -> ProfileRecord:
    """A ``profile`` record (validated by the wire; odd values become unknown)."""
    modules = tuple(ModuleTimes(
        name=m["name"], type=_text(m.get("type")), depth=_whole(m.get("depth")) or 0,
        params=_whole(m.get("params")) or 0,
        calls=_nonneg(m.get("calls")), flops=_nonneg(m.get("flops")), fwd_flops=_nonneg(m.get("fwd_flops")),
        fwd_s=_nonneg(m.get("fwd_s")), bwd_s=_nonneg(m.get("bwd_s")))
        for m in _dicts(rec.get("modules")) if isinstance(m.get("name"), str))
    return ProfileRecord(
        t=num(rec.get("t")) or 0.0, steps=_whole(rec.get("steps")) or 0, first_step=_whole(rec.get("first_step")),
        last_step=_whole(rec.get("last_step")), depth=_whole(rec.get("depth")) or 0, step_s=_pos(rec.get("step_s")),
        timer=_text(rec.get("timer")), peak_flops=_pos(rec.get("peak_flops")),
        peak_source=_text(rec.get("peak_source")),
        modules=modules, flops_note=_text(rec.get("flops_note")), error=_text(rec.get("error")),
        truncated=rec.get("truncated") is True, thread_cpu_s=window_cpu(rec))


def _pos(value: Any) -> float | None:
    v = num(value)
    return v if v is not None and v > 0 else None


def _nonneg(value: Any) -> float | None:
    v = num(value)
    return v if v is not None and v >= 0 else None
