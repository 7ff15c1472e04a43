"""The hello, the 1 Hz samples (GPUs, host, the probe's own cost), memory and communication records."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from perfmon_analysis.readings.base import _dicts, _frac, _int, _nonneg, _text, _whole, num, wire_dict, wire_list
from perfmon_analysis.readings.steps import StepBar


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
    why: tuple[tuple[str, str], ...] = ()   # field ("util", "sm_active") -> why NVML did not give it
    errors: int | None = None               # failed NVML calls for this GPU so far (the probe's count)
    lost: bool = False                      # NVML says the GPU is lost

    def why_not(self, field: str) -> str | None:
        """Why ``field`` is missing, in NVML's words (None: it is not, or the probe did not say)."""
        return next((why for name, why in self.why if name == field), None)


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


def gpu_reading(g: dict[str, Any]) -> GpuReading:
    throttle = wire_list(g.get("throttle"))
    why = g.get("why")
    return GpuReading(
        index=_int(g.get("index")), util=_frac(g.get("util")), name=_text(g.get("name")), uuid=_text(g.get("uuid")),
        sm_active=_frac(g.get("sm_active")),
        tensor_active=_frac(g.get("tensor_active")), mem_used=_int(g.get("mem_used")),
        mem_total=_int(g.get("mem_total")), power_w=num(g.get("power_w")), power_limit_w=num(g.get("power_limit_w")),
        energy_mj=num(g.get("energy_mj")), sm_clock_mhz=num(g.get("sm_clock")), temp_c=num(g.get("temp_c")),
        throttle=tuple(t for t in throttle if isinstance(t, str)),
        why=tuple((str(k), str(v)) for k, v in why.items() if isinstance(v, str)) if isinstance(why, dict) else (),
        errors=_whole(g.get("errors")), lost=g.get("lost") is True)


def gpu_readings(sample: dict[str, Any]) -> tuple[GpuReading, ...]:
    return tuple(gpu_reading(g) for g in (sample.get("gpus") or []) if isinstance(g, dict))


def host_reading(sample: dict[str, Any]) -> HostReading:
    host = wire_dict(sample.get("host"))
    return HostReading(cpu=num(host.get("cpu")), cpu_count=_int(host.get("cpu_count")) or None,
                       sys_cpu=num(host.get("sys_cpu")), rss=_int(host.get("rss")),
                       loader_cpu=num(host.get("loader_cpu")),
                       loader_workers=_whole(host.get("loader_workers")), mem_limit=_int(host.get("mem_limit")) or None,
                       mem_limit_source=_text(host.get("mem_limit_source")))


@dataclass(frozen=True)
class DeviceReading:
    """The job's device (``probe.gpu.job``): in the hello, then in a sample when it changes."""

    type: str | None = None              # "cuda" | "cpu" | ...
    name: str | None = None
    status: str | None = None            # why no GPU counters can be tied to it
    memory_total: int | None = None
    dtype: str | None = None             # the compute dtype
    peak_flops: tuple[tuple[str, float], ...] = ()    # dtype -> peak FLOP/s of the device's table
    offloaded: float | None = None       # CUDA job: share of its parameters' bytes held in host memory

    def peak(self, dtype: str) -> float | None:
        return next((v for d, v in self.peak_flops if d == dtype), None)


def device_reading(d: Any) -> DeviceReading | None:
    if not isinstance(d, dict):
        return None
    peaks = wire_dict(d.get("peak_flops"))
    known = tuple((str(dtype), peak) for dtype, peak in ((k, num(v)) for k, v in peaks.items()) if peak)
    return DeviceReading(type=_text(d.get("type")), name=_text(d.get("name")), status=_text(d.get("status")),
                         memory_total=_int(d.get("memory_total")), dtype=_text(d.get("dtype")), peak_flops=known,
                         offloaded=_frac(d.get("offloaded")))


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
    gpus = wire_dict(rec.get("gpus"))
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
