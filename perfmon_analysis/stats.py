"""Window statistics: per-rank numbers over the current window, then the job's.

Formulas and their sources are listed in ``perfmon_analysis.runmodel``'s docstring and next to
each function. Input: ``RankState`` buffers; output: ``RankStats`` and the view types.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Deque, Iterable

from perfmon_analysis.overhead import Overhead, overhead, worst
from perfmon_analysis.buffers import MIN_STEPS, TIMELINE_STEPS, WINDOW_SAMPLES, RankState
from perfmon_analysis.readings import (CommOp, CostReading, DeviceReading, HostReading, MemoryReading, RankTrace,
                                       SampleReading, StepReading, WhereInterval, own_gpus)
from perfmon_analysis.views import CommOpRow, MemoryMetrics, Metrics, RankView, WhereLine, WhereTable


# -- per-rank statistics ---------------------------------------------------------------------
@dataclass(frozen=True)
class RankStats:
    n: int
    span: float
    warming_up: bool
    step_median: float | None
    gap_frac: float | None           # share of the window's wall time spent between steps
    compute_median: float | None
    arrive_median: float | None      # step time minus exposed wait: when the rank reached the collective
    data_frac: float | None
    data_cpu_frac: float | None
    comm_frac: float | None
    exposed_frac: float | None
    comm_estimated: bool | None
    device_busy: float | None
    busy_source: str | None
    samples_per_s: float | None
    tokens_per_s: float | None
    flops_per_s: float | None
    mfu: float | None
    peak_flops: float | None
    peak_source: str | None
    syncs: float | None
    host_lead: float | None          # median seconds the host ran ahead of the device (CUDA events)
    loader_cpu: float | None
    loader_workers: int | None
    trace: RankTrace
    memory: MemoryMetrics
    comm_delta: dict[str, tuple[int, int, float, float | None]]   # op -> (count, bytes, s, bus bytes) in the window
    off_cpu_frac: float | None = None     # step body off CPU that no other measured loss explains (thread CPU)
    where: WhereTable | None = None       # the window's in-step stack samples (a relay's summary leaves it out)
    cpu_contention_frac: float | None = None  # active step time runnable but without a core (scheduler stats)
    overhead: Overhead | None = None      # the probe's own cost over the window's samples (wire 1.4)
    power_w: float | None = None          # the rank's GPU's mean power over the samples (NVML energy counter)
    energy_per_step_j: float | None = None    # that power times the mean step (its wall time between steps too)


def _window(nums: Deque[StepReading], max_steps: int, max_seconds: float) -> list[StepReading]:
    if not nums:
        return []
    tail = list(itertools.islice(reversed(nums), max_steps + 1))[::-1]
    if len(tail) > 1 and tail[0].step == 0:
        tail = tail[1:]        # the first step pays for lazy init
    tail = tail[-max_steps:]
    last_t = tail[-1].t
    if last_t is None:
        return tail
    recent = [s for s in tail if (s.t if s.t is not None else last_t) >= last_t - max_seconds]
    return recent if len(recent) >= MIN_STEPS else tail[-MIN_STEPS:]


def window_of(state: RankState, max_steps: int, max_seconds: float) -> list[StepReading]:
    """The rank's steps that its window statistics summarise, oldest first."""
    return _window(state.steps, max_steps, max_seconds)


# Sampled states (loader worker CPU, host RSS) are judged on the window's last 5 s of samples (each
# sample already averages its own second): they describe the job now, and a state the job has left must
# stop deciding within the 15 s the verdict is given to follow a change (with 10 s the demo tour's
# memory -> healthy switch took 13-17 s, bench/bench_tour.py). Step quantities use the window.
RECENT_SECONDS = 5.0


def _recent(records: list[Any]) -> list[Any]:
    """The records (samples, memory readings: each with its time ``t``) of the last ``RECENT_SECONDS``."""
    last = next((s.t for s in reversed(records) if s.t is not None), None)
    if last is None:
        return records
    return [s for s in records if (s.t or last) >= last - RECENT_SECONDS] or records[-1:]


# -- statistics over values that may be unknown (None) -----------------------------------------
def _known(reduce: Callable[[list[Any]], Any], values: Iterable[Any]) -> Any:
    """``reduce`` over the known values; None when none is known (unknown is never 0)."""
    known = [v for v in values if v is not None]
    return reduce(known) if known else None


def _sum(values: Iterable[float | None]) -> float | None:
    return _known(sum, values)


def _mean(values: Iterable[float | None]) -> float | None:
    return _known(statistics.fmean, values)


def _max(values: Iterable[Any]) -> Any:
    return _known(max, values)


def _min(values: Iterable[float | None]) -> float | None:
    return _known(min, values)


def rank_stats(state: RankState, max_steps: int, max_seconds: float, timeline: bool = True) -> RankStats:
    """The rank's window statistics; ``timeline=False`` leaves out the step bars of its trace (a
    relay's summary has no use for them, and they are the costliest part)."""
    win = _window(state.steps, max_steps, max_seconds)
    n = len(win)
    durs = [s.dur for s in win]
    actives = [s.active for s in win]
    data = [s.data for s in win]
    secs_known = any(s.comm_s is not None for s in win)
    comm_known = any(s.exposed is not None for s in win)    # the flowchart needs the exposed part
    world = state.info.world_size
    single = world is not None and world <= 1
    secs_sum = sum(s.comm_s or 0.0 for s in win)
    exposed = [s.exposed or 0.0 for s in win]
    active_sum = sum(actives)
    dur_sum = sum(durs)
    data_sum = sum(data)
    data_known = state.loader_seen or any(s.has_data for s in win)
    computes = [max(0.0, a - d - e) for a, d, e in zip(actives, data, exposed)]
    win_start = None
    if win:
        win_start = win[0].start if win[0].start is not None else (win[0].t or 0.0) - win[0].dur
    samples = [s for s in state.samples if win_start is None or (s.t or 0.0) >= win_start]
    samples = samples[-WINDOW_SAMPLES:] or list(state.samples)[-1:]
    hosts = [s.host for s in _recent(samples)]

    data_frac = data_sum / active_sum if n and data_known else None
    data_cpu = _sum([s.data_cpu for s in win])
    data_cpu_frac = (data_cpu / data_sum) if data_cpu is not None and data_sum > 0 else None
    none_single = 0.0 if single and n else None     # one process: no peers to communicate with
    comm_frac = secs_sum / active_sum if secs_known else none_single
    exposed_frac = sum(exposed) / active_sum if comm_known else none_single
    estimated = any(s.estimated for s in win) if comm_known else None

    device = state.device
    thread_busy, off_cpu = _thread_cpu(win)
    where = where_table(state.rank, state.where, win, win_start) if state.where else None
    contention = where.contention if where is not None else None
    busy, busy_src = None, None
    power = _power(samples, state.info.local_rank) if device.type == "cuda" and not device.status else None
    if n and device.type == "cuda":
        # measured activity only: the elapsed time between two CUDA events includes every idle gap;
        # a job device with a ``status`` has no GPU counters the probe could tie to it
        if not device.status:
            busy, busy_src = _gpu_busy(samples, state.info.local_rank)
    elif n and thread_busy is not None:
        # CPU: the CPU is the device; busy is the training thread's measured CPU time in the step,
        # plus the time it was ready to run but other processes held the cores: that time had work
        # to do (its cause, contention, is a finding of its own), so it never opens the starved gate
        busy, busy_src = min(1.0, thread_busy + (contention or 0.0)), "thread_cpu"
    elif n:
        # CPU without thread CPU times (a probe that cannot read them): busy is the step time not lost
        # to a measured cause
        busy, busy_src = sum(computes) / active_sum, "step_accounting"

    samples_sum = _sum([s.samples for s in win])
    tokens_sum = _sum([s.tokens for s in win])
    flops_sum = _sum([s.flops for s in win])
    flops_per_s = flops_sum / dur_sum if flops_sum is not None and dur_sum > 0 else None
    peak, peak_source = _peak_flops(device, state.samples)
    syncs = _sum([s.syncs for s in win])
    loader_cpus = [h.loader_cpu for h in hosts if h.loader_cpu is not None]
    workers = next((h.loader_workers for h in reversed(hosts) if h.loader_workers is not None), None)
    bars = itertools.islice(reversed(state.steps), TIMELINE_STEPS if timeline else 0)
    trace = RankTrace(
        steps=tuple(s.bar() for s in bars)[::-1],
        data_wait=tuple(s.data_share for s in itertools.islice(state.steps, max(0, len(state.steps) - TIMELINE_STEPS),
                                                               None)),
        cpu=_cpu_trace(state))

    return RankStats(
        n=n,
        span=(win[-1].t or 0.0) - win_start if n and win_start is not None else 0.0,
        warming_up=n < MIN_STEPS,
        step_median=statistics.median(durs) if n else None,
        gap_frac=(dur_sum - active_sum) / dur_sum if n and dur_sum > 0 else None,
        compute_median=statistics.median(computes) if n and (comm_known or single) else None,
        arrive_median=statistics.median(d - e for d, e in zip(durs, exposed)) if n and comm_known else None,
        data_frac=data_frac,
        data_cpu_frac=data_cpu_frac,
        comm_frac=comm_frac,
        exposed_frac=exposed_frac,
        comm_estimated=estimated,
        device_busy=busy,
        busy_source=busy_src,
        samples_per_s=samples_sum / dur_sum if samples_sum is not None and dur_sum > 0 else None,
        tokens_per_s=tokens_sum / dur_sum if tokens_sum is not None and dur_sum > 0 else None,
        flops_per_s=flops_per_s,
        mfu=flops_per_s / peak if flops_per_s is not None and peak else None,
        peak_flops=peak,
        peak_source=peak_source,
        power_w=power,
        energy_per_step_j=power * dur_sum / n if power is not None and n else None,
        syncs=syncs / n if syncs is not None and n else None,
        host_lead=_known(statistics.median, [s.lead for s in win]),
        loader_cpu=statistics.fmean(loader_cpus) if loader_cpus else None,
        loader_workers=workers,
        trace=trace,
        memory=_rank_memory(state, win_start, hosts, max_steps),
        comm_delta=_comm_delta(state, win_start),
        off_cpu_frac=off_cpu if contention is None or off_cpu is None else max(0.0, off_cpu - contention),
        where=where,
        cpu_contention_frac=contention,
        overhead=overhead(state.rank, _cost_span(state, win_start), statistics.median(durs) if n else None),
    )


def _cost_span(state: RankState, win_start: float | None) -> list[CostReading]:
    """The probe's cost totals over the window: the last sample before it (the totals only grow, so the
    window's cost runs from there) and the samples in it, at most ``WINDOW_SAMPLES``. Fast steps fit 50
    to a sample period: the window's cost then runs from the sample before it to the newest."""
    costs = [s for s in state.samples if s.cost is not None]
    first = 0
    if win_start is not None:
        first = max(0, next((i for i, s in enumerate(costs) if (s.t or 0.0) >= win_start), len(costs)) - 1)
    first = max(first, len(costs) - WINDOW_SAMPLES - 1)
    return [s.cost for s in costs[first:] if s.cost is not None]


def _thread_cpu(win: list[StepReading]) -> tuple[float | None, float | None]:
    """(CPU busy, off-CPU loss) over the window's steps whose thread CPU time was measured.

    busy = (body CPU + CPU inside the data wait) / active; the loss = the body's time off CPU
    that exposed communication does not explain: max(0, body - body CPU - exposed) / active,
    summed before it is clamped, so clock noise in one step does not count as a loss. Time the
    thread was runnable but had no core (CPU contention, from the ``where`` records) is off its CPU
    clock too; ``rank_stats`` takes it out, since its cause is measured."""
    known = [s for s in win if s.cpu is not None]
    active = sum(s.active for s in known)
    if not known or active <= 0:
        return None, None
    body_cpu = sum(s.cpu or 0.0 for s in known)
    body = sum(max(0.0, s.active - s.data) for s in known)
    exposed = sum(s.exposed or 0.0 for s in known)
    data_cpu = sum(s.data_cpu or 0.0 for s in known)
    return min(1.0, (body_cpu + data_cpu) / active), max(0.0, body - body_cpu - exposed) / active


# 95% two-sided normal quantile, for the binomial error bars of the where-table's shares.
Z95 = 1.959964


def wilson_half_width(n: int, total: int, z: float = Z95) -> float:
    """Half-width of the Wilson score interval for n successes in ``total`` trials: the binomial
    error of a sampled share. Unlike n/total ± z·sqrt(p(1-p)/total) it is not 0 at 0 or all
    samples, where a handful of samples says little."""
    if total <= 0:
        return 1.0
    p = n / total
    return z / (1.0 + z * z / total) * math.sqrt(p * (1.0 - p) / total + z * z / (4.0 * total * total))


WHERE_LINES = 20     # lines the view keeps (the probe lists at most 20 per interval)


def where_table(rank: int, intervals: Iterable[WhereInterval], win: list[StepReading],
                win_start: float | None) -> WhereTable | None:
    """The window's stack samples: the intervals that overlap the window, summed per user line and
    state (the library call below a line is the one with the most samples there). A line's share
    of the active step = its samples / all in-step samples x the share of the step the samples
    span; its error bar is the Wilson half-width of the sample proportion, scaled the same way.
    ``runq``: the intervals' run-queue shares (the thread runnable, no core free), weighted by samples."""
    if not win or win_start is None:
        return None
    end = win[-1].t if win[-1].t is not None else win_start
    active = sum(s.active for s in win)
    span = sum(s.active if s.cpu_active else max(0.0, s.active - s.data) for s in win)
    span_share = span / active if active > 0 else 1.0
    total, hz, runq, runq_samples = 0, None, 0.0, 0
    counts: dict[tuple[str, int, str, str | None], list[Any]] = {}
    for iv in intervals:
        if iv.t1 <= win_start or iv.t0 >= end:
            continue
        total += iv.samples
        hz = iv.hz if iv.hz is not None else hz
        if iv.runq is not None and iv.samples > 0:
            runq += iv.runq * iv.samples
            runq_samples += iv.samples
        for c in iv.lines:
            row = counts.setdefault((c.file, c.line, c.function, c.state), [0, c.call, {}])
            row[0] += c.n
            row[1] = row[1] or c.call
            row[2][c.lib] = row[2].get(c.lib, 0) + c.n
    total = max(total, sum(row[0] for row in counts.values()))   # never a share over 1
    lines = sorted((WhereLine(file=f, line=ln, function=fn, call=call,
                              lib=max(libs.items(), key=lambda kv: (kv[1], kv[0] is not None))[0], state=st,
                              samples=n, share=span_share * n / total,
                              err=span_share * wilson_half_width(n, total))
                    for (f, ln, fn, st), (n, call, libs) in counts.items()),
                   key=lambda x: (-x.samples, x.file, x.line, x.state or ""))
    return WhereTable(rank=rank, samples=total, hz=hz, span_share=span_share,
                      waiting=sum(x.samples for x in lines if x.state == "waiting"),
                      busy=sum(x.samples for x in lines if x.state == "busy"), lines=tuple(lines[:WHERE_LINES]),
                      runq=runq / runq_samples if runq_samples else None)




def summary_stats(state: RankState, st: RankStats) -> RankStats:
    """A summarised rank's statistics ``st`` (``perfmon_analysis.summary``), with the CPU history and the
    probe's own cost of the samples, which still come in full."""
    samples = itertools.islice(state.samples, max(0, len(state.samples) - WINDOW_SAMPLES), None)
    return dataclasses.replace(st, trace=RankTrace(steps=(), data_wait=(), cpu=_cpu_trace(state)),
                               overhead=overhead(state.rank, [s.cost for s in samples if s.cost is not None],
                                                 st.step_median))


def _cpu_trace(state: RankState) -> tuple[float | None, ...]:
    return tuple(itertools.islice(state.cpu, max(0, len(state.cpu) - WINDOW_SAMPLES), None))


def _gpu_busy(samples: list[SampleReading], local_rank: int) -> tuple[float | None, str | None]:
    """(busy, source) of this rank's GPU (index = local_rank when listed) over the samples.

    GPM SM activity where the device has it: the share of SMs busy, averaged over time, so one
    small kernel on a large GPU reads near 0. Else NVML utilization: the share of time any kernel
    ran, which reads 100% for that same small kernel (``nvidia-smi``'s number). ``losses.BUSY_SOURCES``
    names both; neither is ever replaced by the time between two CUDA events."""
    own = [g for s in samples for g in own_gpus(s.gpus, local_rank)[:1]]
    for source, values in (("sm_active", [g.sm_active for g in own]), ("nvml_util", [g.util for g in own])):
        known = [v for v in values if v is not None]
        if known:
            return statistics.fmean(known), source
    return None, None


def _power(samples: list[SampleReading], local_rank: int) -> float | None:
    """Mean power of the rank's GPU over the samples, W: the total-energy counter's rise between the
    first and the last reading over the time between them (a power reading is one instant's)."""
    points = [(s.t, g.energy_mj) for s in samples for g in own_gpus(s.gpus, local_rank)[:1]
              if s.t is not None and g.energy_mj is not None]
    if len(points) < 2:
        return None
    (t0, e0), (t1, e1) = points[0], points[-1]
    if t1 <= t0 or e1 < e0:           # one reading, or the counter restarted with the driver
        return None
    return (e1 - e0) / 1000.0 / (t1 - t0)


def _per(power: float | None, rate: float | None) -> float | None:
    """Joules per item: watts over items per second (unknown when either is, or nothing was done)."""
    return power / rate if power is not None and rate else None


def _all_sum(values: list[float | None]) -> float | None:
    """The sum when every value is known: a job's energy is unknown while one rank's is."""
    return sum(v for v in values if v is not None) if values and None not in values else None


def _peak_flops(device: DeviceReading, samples: Deque[SampleReading]) -> tuple[float | None, str | None]:
    """(peak FLOP/s, where it came from) for the dtype in use: the sampler's ``compute.peak_flops``
    (after watch(): the user's, $PERFMON_PEAK_TFLOPS, or the table), else hello ``device.peak_flops``
    for the compute dtype. No peak for the dtype in use means no MFU: another dtype's peak would
    make the MFU a wrong number, not a rough one."""
    compute = next((s.compute for s in reversed(samples) if s.compute is not None), None)
    if compute is not None and compute.peak_flops:
        return compute.peak_flops, compute.peak_source or "table"
    dtype = (compute.dtype if compute is not None else None) or device.dtype
    peak = device.peak(dtype) if dtype is not None else None
    if not peak:
        return None, None
    return peak, f"device table, {dtype}"


def _rank_memory(state: RankState, win_start: float | None, hosts: list[HostReading],
                 max_steps: int) -> MemoryMetrics:
    """Memory against its limit. ``peak_bytes`` is the number compared with the limit, over the window
    only (a peak from before the window describes a job that has moved on): CUDA the allocator's
    reserved bytes, CPU the RSS."""
    ooms = sum(1 for e in state.events if e.name == "oom" and (win_start is None or (e.t or 0.0) >= win_start))
    device = state.device
    host_rss = [h.rss for h in hosts]
    host_limit = next((h.mem_limit for h in reversed(hosts) if h.mem_limit), None)
    host_limit_source = next((h.mem_limit_source for h in reversed(hosts) if h.mem_limit_source), None)
    mem = state.memory[-1] if state.memory else None
    if mem is not None:
        in_win = [m for m in state.memory if win_start is None or (m.t or 0.0) >= win_start]
        first = in_win[0] if in_win else mem
        retries = mem.alloc_retries
        rising = retries is not None and (first.alloc_retries or 0) < retries and len(in_win) > 1
        alloc_ooms = (mem.ooms or 0) - (first.ooms or 0) if len(in_win) > 1 else 0
        if mem.on_host:
            used = max((r for r in [m.rss for m in _recent(in_win)] + host_rss if r is not None),
                       default=mem.rss or mem.peak)
            limit = mem.limit or host_limit
            limit_source = mem.limit_source or host_limit_source
        else:
            used = _window_reserved(state.memory, in_win or [mem], win_start)
            limit = mem.limit or device.memory_total
            limit_source = "device"
        return MemoryMetrics(
            source="host" if mem.on_host else "device", rank=state.rank, limit_bytes=limit, limit_source=limit_source,
            peak_bytes=used, peak_frac=used / limit if used is not None and limit else None,
            params_bytes=mem.params, grads_bytes=mem.grads, optimizer_bytes=mem.optimizer,
            activations_bytes=mem.activations, cache_bytes=mem.cache, other_bytes=mem.other,
            fragmentation_bytes=mem.fragmentation, reserved_bytes=mem.reserved, allocated_bytes=mem.allocated,
            alloc_retries=retries, alloc_retries_rising=rising, ooms=ooms + max(0, alloc_ooms))
    if device.type == "cuda":
        recent = itertools.islice(reversed(state.steps), max_steps)   # the current window, not the default
        limit = device.memory_total
        peak = max((s.mem_peak for s in recent if s.mem_peak is not None), default=None)
        return MemoryMetrics(source="device" if peak is not None else None, rank=state.rank, limit_bytes=limit,
                             limit_source="device" if limit else None, peak_bytes=peak,
                             peak_frac=peak / limit if peak is not None and limit else None, ooms=ooms)
    rss = max((r for r in host_rss if r is not None), default=None)
    return MemoryMetrics(source="host" if rss is not None else None, rank=state.rank, limit_bytes=host_limit,
                         limit_source=host_limit_source, peak_bytes=rss,
                         peak_frac=rss / host_limit if rss is not None and host_limit else None, ooms=ooms)


def _window_reserved(records: Deque[MemoryReading], in_win: list[MemoryReading],
                     win_start: float | None) -> int | None:
    """The most the CUDA allocator held during the window: the highest sampled ``reserved``, and the
    allocator's lifetime ``peak_reserved`` when it rose inside the window (a spike between two
    samples). A spike from before the window has left it and no longer counts."""
    used = max((m.reserved for m in in_win if m.reserved is not None), default=None)
    before = [m for m in records if win_start is not None and (m.t or 0.0) < win_start]
    base = before[-1].peak_reserved if before else None
    peak_now = in_win[-1].peak_reserved if in_win else None
    if peak_now is not None and (base is None or peak_now > base):
        used = max(used or 0, peak_now)
    if used is None and in_win:
        used = in_win[-1].peak
    return used


def _comm_delta(state: RankState, win_start: float | None) -> dict[str, tuple[int, int, float, float | None]]:
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


def rank_view(state: RankState, st: RankStats, now: float, silent_s: float | None = None) -> RankView:
    h = state.info
    host = state.samples[-1].host if state.samples else None
    last = state.steps[-1] if state.steps else None
    steps = state.summary_steps if state.summary_steps is not None else (last.step + 1) if last is not None else 0
    return RankView(
        rank=state.rank, stream=state.stream, host=h.host, pid=h.pid, restart=h.restart or 0,
        generation=state.generation, steps=steps, window_steps=st.n, warming_up=st.warming_up,
        step_time_median_s=st.step_median, compute_s=st.compute_median, device_busy=st.device_busy,
        data_wait_frac=st.data_frac, comm_frac=st.comm_frac, comm_exposed_frac=st.exposed_frac,
        samples_per_s=st.samples_per_s, tokens_per_s=st.tokens_per_s, syncs_per_step=st.syncs, mfu=st.mfu,
        ettr=_ettr(state, now, st.step_median), loader_cpu=st.loader_cpu, loader_workers=st.loader_workers,
        cpu=host.cpu if host else None, rss=host.rss if host else None, ended=state.ended,
        since_last_step_s=max(0.0, now - state.last_end) if state.last_end is not None and not state.ended else None,
        drops=state.drops, stall=state.stall, stalled_s=state.stall.lasted(now) if state.stall else None,
        silent_s=silent_s, answered=h.answered,
        overhead_step_frac=st.overhead.step_frac if st.overhead is not None else None,
        overhead_cpu_frac=st.overhead.cpu_frac if st.overhead is not None else None)


def _ettr(state: RankState, now: float, step_median: float | None) -> float | None:
    """Time inside steps / wall time since the first step (Meta ETTR, Google goodput).

    While the rank is live, wall time runs to ``now`` less one typical step: the
    step in progress is not lost time, but a stall longer than a step lowers
    ETTR as it happens. Once the rank ended, wall time stops at its last step;
    spans of steps lost to drops are excluded.
    """
    seen = state.summary_steps if state.summary_steps is not None else len(state.steps)
    if state.first_start is None or state.last_end is None or seen < 2:
        return None
    end = state.last_end if state.ended else max(state.last_end, now - (step_median or 0.0))
    wall = end - state.first_start - state.unseen
    if wall <= 0:
        return None
    return max(0.0, min(1.0, state.inside / wall))


# -- job level -------------------------------------------------------------------------------
# Straggler rule, shared with perfmon_analysis.verdict (which cites it): NVIDIA Resiliency Extension relative
# score = best rank / this rank, default threshold gpu_relative_perf_threshold = 0.7.
STRAGGLER_RATIO = 0.7


def _straggler(ready: list[tuple[RankState, RankStats]]) -> tuple[float | None, float | None, int | None,
                                                                       str | None]:
    """(compute ratio, arrival ratio, straggler rank, rule) over ranks with comm measured.

    Rule "compute" (NVRx relative score, fastest / slowest < STRAGGLER_RATIO):
    the rank with the slowest median compute. Rule "arrival" (HTA: "a straggler
    is the trainer which starts later than others"), the same score applied to
    each rank's time to reach the collective (step time minus its exposed wait,
    so time lost between steps or in its own data wait counts): the last rank to
    arrive, when compute alone does not explain it.
    """
    computes = [(s.rank, x.compute_median) for s, x in ready if x.compute_median is not None]
    if len(computes) < 2:
        return None, None, None, None
    ratio, slow_rank = _relative(computes)
    arrivals = [(s.rank, x.arrive_median) for s, x in ready if x.arrive_median is not None]
    arrival_ratio, late_rank = _relative(arrivals) if len(arrivals) >= 2 else (None, None)
    if ratio < STRAGGLER_RATIO:
        return ratio, arrival_ratio, slow_rank, "compute"
    if arrival_ratio is not None and arrival_ratio < STRAGGLER_RATIO:
        return ratio, arrival_ratio, late_rank, "arrival"
    return ratio, arrival_ratio, None, None


def _relative(times: list[tuple[int, float]]) -> tuple[float, int]:
    """(fastest / slowest, slowest rank)."""
    fast = min(t for _, t in times)
    slow_rank, slow = max(times, key=lambda rt: rt[1])
    return (fast / slow if slow > 0 else 1.0), slow_rank




def job_metrics(ready: list[tuple[RankState, RankStats]], ranks: list[RankView], states: list[RankState],
                 stats: list[RankStats]) -> tuple[Metrics, int | None]:
    steps = max((r.steps for r in ranks), default=0)
    cost = worst(x.overhead for x in stats)
    cost_step = cost.step_frac if cost is not None else None
    cost_cpu = cost.cpu_frac if cost is not None else None
    if not ready:
        return Metrics(steps=steps, ettr=_min([r.ettr for r in ranks]), memory=_job_memory(states, stats),
                       overhead_step_frac=cost_step, overhead_cpu_frac=cost_cpu), None
    st = [x[1] for x in ready]
    ratio, arrival_ratio, straggler, straggler_by = _straggler(ready)
    rows = comm_rows(ready)
    top = max(rows, key=lambda r: r.seconds, default=None)
    memory = _job_memory(states, stats)
    samples = [x.samples_per_s for x in st]
    tokens = [x.tokens_per_s for x in st]
    where = job_where(st)
    power = _all_sum([x.power_w for x in st])
    metrics = Metrics(
        steps=steps,
        step_time_median_s=_max([x.step_median for x in st]),
        samples_per_s=_sum(samples),
        tokens_per_s=_sum(tokens),
        device_busy=_min([x.device_busy for x in st]),
        device_busy_source=st[0].busy_source,
        data_wait_frac=_max([x.data_frac for x in st]),
        data_cpu_frac=_max([x.data_cpu_frac for x in st]),
        comm_frac=_max([x.comm_frac for x in st]),
        comm_exposed_frac=_max([x.exposed_frac for x in st]),
        comm_estimated=any(x.comm_estimated for x in st) if any(x.comm_estimated is not None for x in st) else None,
        comm_op=top.op if top else None,
        busbw=top.busbw if top else None,
        syncs_per_step=_mean([x.syncs for x in st]),
        host_lead_s=_min([x.host_lead for x in st]),
        off_cpu_frac=_max([x.off_cpu_frac for x in st]),
        cpu_contention_frac=_max([x.cpu_contention_frac for x in st]),
        host_wait_frac=where.wait_frac if where is not None else None,
        mfu=_mean([x.mfu for x in st]),
        peak_flops=next((x.peak_flops for x in st if x.peak_flops), None),
        peak_source=next((x.peak_source for x in st if x.peak_flops), None),
        flops_per_s=_mean([x.flops_per_s for x in st]),
        ettr=_min([r.ettr for r in ranks]),
        gap_frac=_max([x.gap_frac for x in st]),
        loader_cpu=_max([x.loader_cpu for x in st]),
        loader_workers=_max([x.loader_workers for x in st]),
        compute_ratio=ratio,
        arrival_ratio=arrival_ratio,
        straggler_by=straggler_by,
        memory_headroom=1.0 - memory.peak_frac if memory.peak_frac is not None else None,
        overhead_step_frac=cost_step,
        overhead_cpu_frac=cost_cpu,
        power_w=power,
        energy_per_step_j=_all_sum([x.energy_per_step_j for x in st]),
        energy_per_sample_j=_per(power, _all_sum(samples)),
        energy_per_token_j=_per(power, _all_sum(tokens)),
        memory=memory,
    )
    return metrics, straggler




def job_where(stats: list[RankStats]) -> WhereTable | None:
    """The stack samples shown for the job: the rank with the most unexplained off-CPU time (in a
    synchronous job the others wait for it), else the one with the most samples."""
    tables = [x for x in stats if x.where is not None]
    best = max(tables, key=lambda x: (x.off_cpu_frac if x.off_cpu_frac is not None else -1.0, x.where.samples),
               default=None)   # type: ignore[union-attr]
    return best.where if best is not None else None


def _job_memory(states: list[RankState], stats: list[RankStats]) -> MemoryMetrics:
    """The fullest rank's memory (highest peak/limit), OOMs summed over ranks."""
    mems = [st.memory for st in stats]
    if not mems:
        return MemoryMetrics()
    best = max(mems, key=lambda m: (m.peak_frac if m.peak_frac is not None else -1.0,
                                    m.peak_bytes if m.peak_bytes is not None else -1))
    ooms = sum(m.ooms for m in mems)
    rising = any(m.alloc_retries_rising for m in mems)
    if ooms != best.ooms or rising != best.alloc_retries_rising:
        best = MemoryMetrics(**{**best.__dict__, "ooms": ooms, "alloc_retries_rising": rising})
    return best


def comm_rows(pairs: list[tuple[RankState, RankStats]]) -> list[CommOpRow]:
    """The window's collectives summed over ranks; busbw from the bus bytes each call's own group
    size gave (nccl-tests definition), never from the job's world size."""
    acc: dict[str, list[Any]] = {}
    for _, st in pairs:
        for op, (count, nbytes, secs, bus) in st.comm_delta.items():
            row = acc.setdefault(op, [0, 0, 0.0, [], []])
            row[0] += count
            row[1] += nbytes
            row[2] += secs
            if secs > 0 and nbytes > 0:
                row[3].append(nbytes / secs)
                if bus is not None and bus > 0:
                    row[4].append(bus / secs)
    rows = [CommOpRow(op=op, count=c, bytes=b, seconds=s, algbw=_mean(alg), busbw=_mean(bus), ranks=len(pairs))
            for op, (c, b, s, alg, bus) in acc.items()]
    return sorted(rows, key=lambda r: -r.seconds)
