"""Window statistics: per-rank numbers over the current window, then the job's.

Formulas and their sources are listed in ``perfmon_analysis.runmodel``'s docstring and next to
each function. Input: ``RankState`` buffers; output: ``RankStats`` and the view types.

One whole for every share (docs/verdict.md, "One whole"): the iteration, from one step's start to
the next's, over the wall time. Pauses between steps (checkpoints, evaluation: ``perfmon_analysis.pauses``)
recur less often than a window may hold, so their share is the run's (1 − ETTR); the rest of the whole,
1 − that, is the loop, and every window quantity in seconds is a share of the whole by its part of the
window's in-loop time (its steps' durations less their pauses): share = seconds / in-loop seconds x
(1 − pauses). The shares of the whole then add up to at most 1.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections import deque
from dataclasses import dataclass

from perfmon_analysis.buffers import MIN_STEPS, TIMELINE_STEPS, WINDOW_SAMPLES, RankState, recent_records
from perfmon_analysis.comm_stats import comm_delta, comm_rows, find_straggler
from perfmon_analysis.device_stats import (
    busy_unknown_reason,
    gpu_busy,
    gpu_fill,
    gpu_power,
    lead_times,
    peak_flops_of,
    timed_steps,
    timeline_busy,
)
from perfmon_analysis.known import known, max_known, mean_known, min_known, per_item, sum_all, sum_known
from perfmon_analysis.memory_stats import job_memory, rank_memory
from perfmon_analysis.overhead import Overhead, overhead, worst
from perfmon_analysis.readings import CostReading, RankTrace, StepReading
from perfmon_analysis.views import MemoryMetrics, Metrics, RankView, WhereTable
from perfmon_analysis.where_stats import job_where, where_table


# -- per-rank statistics ---------------------------------------------------------------------
@dataclass(frozen=True)
class RankStats:
    n: int
    span: float
    warming_up: bool
    step_median: float | None
    gap_frac: float | None           # share of the window's wall time spent between steps (loop work and pauses)
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
    loop_frac: float | None = None        # the loop's own work between steps, of the iteration (the window)
    loop_wait_frac: float | None = None   # of that work, the share off CPU (its thread CPU clock, zero-code)
    pause_frac: float | None = None       # pauses between steps, of the wall time (the run: 1 - ETTR)
    busy_why: str | None = None           # CUDA: why ``device_busy`` is not measured (NVML's words)
    gpu_util: float | None = None         # NVML utilization over the window's samples, whatever busy used
    fill: float | None = None             # GPM SM activity over busy: the device the running kernels use
    sm_active: float | None = None        # GPM SM activity over the samples (idle time counting 0)
    tensor_active: float | None = None    # GPM tensor-core activity over the samples
    offloaded: float | None = None        # CUDA: share of the watched parameters' bytes in host memory
    device_time: float | None = None      # median device time of the lead-timed steps (CUDA events)
    lead_steps: float | None = None       # median lead (as read: never short) over those steps' device time
    queued_whole: float | None = None     # share of those steps the host queued whole before the device began them


def _window(nums: deque[StepReading], max_steps: int, max_seconds: float) -> list[StepReading]:
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
    hosts = [s.host for s in recent_records(samples)]

    pause_w = sum(s.pause for s in win)
    pause_frac = run_pauses(state)
    if pause_frac is None and n and dur_sum > 0:
        pause_frac = pause_w / dur_sum          # no run totals yet: the window's own
    loop_s = dur_sum - pause_w                  # the window's in-loop time: its pauses are the run's
    kept = 1.0 - (pause_frac or 0.0)
    scale = kept / loop_s if loop_s > 0 else 0.0   # share of the whole per in-loop second
    loop_frac = scale * sum(s.loop for s in win) if n else None
    data_frac = data_sum * scale if n and data_known else None
    data_cpu = sum_known([s.data_cpu for s in win])
    data_cpu_frac = (data_cpu / data_sum) if data_cpu is not None and data_sum > 0 else None
    none_single = 0.0 if single and n else None     # one process: no peers to communicate with
    comm_frac = secs_sum * scale if secs_known else none_single
    exposed_frac = sum(exposed) * scale if comm_known else none_single
    estimated = any(s.estimated for s in win) if comm_known else None

    device = state.device
    thread_busy, off_cpu = _thread_cpu(win, kept)
    between_share = (loop_frac or 0.0) + (pause_w / dur_sum if dur_sum > 0 else 0.0)
    where = where_table(state.rank, state.where, win, win_start, scale, between_share) if state.where else None
    contention = where.contention if where is not None else None
    busy, busy_src, busy_why = None, None, None
    fill = sm_active = tensor_active = util = None
    timed: list[StepReading] = []
    power = gpu_power(samples, state.info.local_rank) if device.type == "cuda" and not device.status else None
    if n and device.type == "cuda":
        # busy is time: NVML utilization, or the steps' own CUDA timeline where it proves more; a job
        # device with a ``status`` has no GPU counters the probe could tie to it
        local = state.info.local_rank
        if not device.status:
            busy, busy_src = gpu_busy(samples, local)
            util = busy
            fill, sm_active, tensor_active = gpu_fill(samples, local)
        timed = timed_steps(state.steps, win, max_seconds)
        bound, exact = timeline_busy(timed)
        if bound is not None and (bound > busy if busy is not None else exact):
            busy, busy_src = bound, "cuda_timeline"
        if busy is None:
            busy_why = busy_unknown_reason(samples, local, device.status)
    elif n and thread_busy is not None:
        # CPU: the CPU is the device; busy is the training thread's measured CPU time in the step,
        # plus the time it was ready to run but other processes held the cores: that time had work
        # to do (its cause, contention, is a finding of its own), so it never opens the starved gate
        busy, busy_src = min(1.0, thread_busy + (contention or 0.0)), "thread_cpu"
    elif n:
        # CPU without thread CPU times (a probe that cannot read them): busy is the step time not lost
        # to a measured cause
        busy, busy_src = sum(computes) * scale, "step_accounting"

    leads = lead_times(timed)
    samples_sum = sum_known([s.samples for s in win])
    tokens_sum = sum_known([s.tokens for s in win])
    flops_sum = sum_known([s.flops for s in win])
    flops_per_s = flops_sum / dur_sum if flops_sum is not None and dur_sum > 0 else None
    peak, peak_source = peak_flops_of(device, state.samples)
    syncs = sum_known([s.syncs for s in win])
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
        loop_frac=loop_frac,
        pause_frac=pause_frac,
        loop_wait_frac=_loop_wait(win, where.between_runq if where is not None else None),
        busy_why=busy_why,
        gpu_util=util,
        fill=fill,
        sm_active=sm_active,
        tensor_active=tensor_active,
        offloaded=device.offloaded if device.type == "cuda" else None,
        device_time=leads.device_time,
        lead_steps=leads.lead_steps,
        queued_whole=leads.queued_whole,
        syncs=syncs / n if syncs is not None and n else None,
        host_lead=known(statistics.median, [s.lead for s in timed]),
        loader_cpu=statistics.fmean(loader_cpus) if loader_cpus else None,
        loader_workers=workers,
        trace=trace,
        memory=rank_memory(state, win_start, hosts, max_steps),
        comm_delta=comm_delta(state, win_start),
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


def _loop_wait(win: list[StepReading], runq: float | None) -> float | None:
    """The share of the loop's work between steps the training thread spent off CPU, from its CPU time in
    the gaps without a pause: off CPU / (off CPU + on CPU), where the time it was runnable with no core
    free (``runq``, the between-step samples' share) is neither: a loaded machine turns neither work nor
    a wait into the other. None without the gaps' CPU time (API mode, an older probe)."""
    known = [s for s in win if s.gap_cpu is not None and s.pause == 0.0]
    gap = sum(s.gap for s in known)
    if not known or gap <= 0:
        return None
    cpu = min(gap, sum(s.gap_cpu or 0.0 for s in known))
    off = max(0.0, gap * (1.0 - (runq or 0.0)) - cpu)
    return off / (off + cpu) if off + cpu > 0 else None


def _thread_cpu(win: list[StepReading], kept: float) -> tuple[float | None, float | None]:
    """(CPU busy, off-CPU loss) over the window's steps whose thread CPU time was measured, as shares of
    the whole: their in-loop time (durations less pauses) is the share ``kept`` (1 - pauses).

    busy = (body CPU + CPU inside the data wait); the loss = the body's time off CPU that exposed
    communication does not explain: max(0, body - body CPU - exposed), summed before it is clamped,
    so clock noise in one step does not count as a loss. Time the thread was runnable but had no core
    (CPU contention, from the ``where`` records) is off its CPU clock too; ``rank_stats`` takes it out,
    since its cause is measured."""
    known = [s for s in win if s.cpu is not None]
    loop_s = sum(s.dur - s.pause for s in known)
    if not known or loop_s <= 0:
        return None, None
    scale = kept / loop_s
    body_cpu = sum(s.cpu or 0.0 for s in known)
    body = sum(max(0.0, s.active - s.data) for s in known)
    exposed = sum(s.exposed or 0.0 for s in known)
    data_cpu = sum(s.data_cpu or 0.0 for s in known)
    return min(1.0, (body_cpu + data_cpu) * scale), max(0.0, body - body_cpu - exposed) * scale


# 95% two-sided normal quantile, for the binomial error bars of the where-table's shares.
def summary_stats(state: RankState, st: RankStats) -> RankStats:
    """A summarised rank's statistics ``st`` (``perfmon_analysis.summary``), with the CPU history and the
    probe's own cost of the samples, which still come in full."""
    samples = itertools.islice(state.samples, max(0, len(state.samples) - WINDOW_SAMPLES), None)
    return dataclasses.replace(st, trace=RankTrace(steps=(), data_wait=(), cpu=_cpu_trace(state)),
                               overhead=overhead(state.rank, [s.cost for s in samples if s.cost is not None],
                                                 st.step_median))


def _cpu_trace(state: RankState) -> tuple[float | None, ...]:
    return tuple(itertools.islice(state.cpu, max(0, len(state.cpu) - WINDOW_SAMPLES), None))


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
        overhead_cpu_frac=st.overhead.cpu_frac if st.overhead is not None else None, device_fill=st.fill)


def _ettr(state: RankState, now: float, step_median: float | None) -> float | None:
    """Time in the training loop (inside steps, and the loop's own work between them) / wall time
    since the first step (Meta ETTR, Google goodput: the time not lost to pauses; docs/verdict.md).

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
    return max(0.0, min(1.0, (state.inside + state.loop_total) / wall))


def run_pauses(state: RankState) -> float | None:
    """Share of the run's steps (from each one's start to the next's: the time they cover) lost to pauses
    between them: 1 - ETTR once the rank has ended; a live stall lowers ETTR before it becomes a step's
    gap. None before two steps."""
    seen = state.summary_steps if state.summary_steps is not None else len(state.steps)
    covered = state.inside + state.gap_total
    if seen < 2 or covered <= 0:
        return None
    return max(0.0, min(1.0, (state.gap_total - state.loop_total) / covered))


def job_metrics(ready: list[tuple[RankState, RankStats]], ranks: list[RankView], states: list[RankState],
                 stats: list[RankStats]) -> tuple[Metrics, int | None]:
    steps = max((r.steps for r in ranks), default=0)
    cost = worst(x.overhead for x in stats)
    cost_step = cost.step_frac if cost is not None else None
    cost_cpu = cost.cpu_frac if cost is not None else None
    if not ready:
        return Metrics(steps=steps, ettr=min_known([r.ettr for r in ranks]),
                       memory=job_memory([x.memory for x in stats]),
                       overhead_step_frac=cost_step, overhead_cpu_frac=cost_cpu), None
    st = [x[1] for x in ready]
    ratio, arrival_ratio, straggler, straggler_by = find_straggler(
        [(s.rank, x.compute_median, x.arrive_median) for s, x in ready])
    rows = comm_rows([x.comm_delta for _, x in ready])
    top = max(rows, key=lambda r: r.seconds, default=None)
    memory = job_memory([x.memory for x in stats])
    samples = [x.samples_per_s for x in st]
    tokens = [x.tokens_per_s for x in st]
    where = job_where([(x.where, x.off_cpu_frac) for x in st])
    power = sum_all([x.power_w for x in st])
    # a rank whose busy is not measured makes the job's busy not measured: the least busy rank may be it
    busy_unknown = {str(s.rank): x.busy_why or "not measured" for s, x in ready if x.device_busy is None}
    least_busy = min((x for x in st if x.device_busy is not None), key=lambda x: x.device_busy or 0.0, default=None)
    metrics = Metrics(
        steps=steps,
        step_time_median_s=max_known([x.step_median for x in st]),
        samples_per_s=sum_known(samples),
        tokens_per_s=sum_known(tokens),
        device_busy=least_busy.device_busy if least_busy is not None and not busy_unknown else None,
        device_busy_source=least_busy.busy_source if least_busy is not None and not busy_unknown else None,
        device_busy_unknown=busy_unknown or None,
        device_fill=min_known([x.fill for x in st]),
        gpu_util=min_known([x.gpu_util for x in st]),
        sm_active=min_known([x.sm_active for x in st]),
        tensor_active=mean_known([x.tensor_active for x in st]),
        params_offloaded=max_known([x.offloaded for x in st]),
        data_wait_frac=max_known([x.data_frac for x in st]),
        data_cpu_frac=max_known([x.data_cpu_frac for x in st]),
        comm_frac=max_known([x.comm_frac for x in st]),
        comm_exposed_frac=max_known([x.exposed_frac for x in st]),
        comm_estimated=any(x.comm_estimated for x in st) if any(x.comm_estimated is not None for x in st) else None,
        comm_op=top.op if top else None,
        busbw=top.busbw if top else None,
        syncs_per_step=mean_known([x.syncs for x in st]),
        host_lead_s=min_known([x.host_lead for x in st]),
        host_lead_steps=min_known([x.lead_steps for x in st]),
        host_queued_whole_frac=min_known([x.queued_whole for x in st]),
        device_time_median_s=max_known([x.device_time for x in st]),
        off_cpu_frac=max_known([x.off_cpu_frac for x in st]),
        cpu_contention_frac=max_known([x.cpu_contention_frac for x in st]),
        host_wait_frac=where.wait_frac if where is not None else None,
        mfu=mean_known([x.mfu for x in st]),
        peak_flops=next((x.peak_flops for x in st if x.peak_flops), None),
        peak_source=next((x.peak_source for x in st if x.peak_flops), None),
        flops_per_s=mean_known([x.flops_per_s for x in st]),
        ettr=min_known([r.ettr for r in ranks]),
        gap_frac=max_known([x.gap_frac for x in st]),
        loop_frac=max_known([x.loop_frac for x in st]),
        pause_frac=max_known([x.pause_frac for x in st]),
        loop_wait_frac=max_known([x.loop_wait_frac for x in st]) if any(x.loop_wait_frac is not None for x in st)
        else where.between_wait_frac if where is not None else None,
        loop_prep_frac=where.between_prep_frac if where is not None else None,
        loader_cpu=max_known([x.loader_cpu for x in st]),
        loader_workers=max_known([x.loader_workers for x in st]),
        compute_ratio=ratio,
        arrival_ratio=arrival_ratio,
        straggler_by=straggler_by,
        memory_headroom=1.0 - memory.peak_frac if memory.peak_frac is not None else None,
        overhead_step_frac=cost_step,
        overhead_cpu_frac=cost_cpu,
        power_w=power,
        energy_per_step_j=sum_all([x.energy_per_step_j for x in st]),
        energy_per_sample_j=per_item(power, sum_all(samples)),
        energy_per_token_j=per_item(power, sum_all(tokens)),
        memory=memory,
    )
    return metrics, straggler




