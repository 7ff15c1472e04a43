"""A rank's GPU over the window: busy in time, SM fill, power and the peak FLOP/s its MFU divides by.

Busy and fill are two questions (docs/verdict.md): busy is the share of the step a kernel ran (NVML
utilization, or the step's own CUDA timeline where that proves more), fill how much of the device the
running kernels use (GPM SM activity over busy)."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Reversible
from typing import NamedTuple

from perfmon_analysis.readings import DeviceReading, SampleReading, StepReading, own_gpus

TIMELINE_MIN_STEPS = 3    # lead-timed steps a window needs before their timeline says anything
# A lead is read late, never short: the poller sees the step's last event done within about a quarter
# of the lead or 1 ms on a sleeping host (bench/RESULTS.md, "CUDA completion poller"), and a host busy in
# Python holds the GIL the poller needs for up to the interpreter's switch interval (5 ms). The true lead
# is then at least min(lead / (1 + LEAD_REL_ERR), lead - LEAD_ABS_ERR).
LEAD_REL_ERR = 0.25
LEAD_ABS_ERR = 0.005


def lead_at_least(lead: float) -> float:
    """The least the host can have been ahead, given the lead as read (late by at most the poller's error)."""
    return max(0.0, min(lead / (1.0 + LEAD_REL_ERR), lead - LEAD_ABS_ERR))


TIMED_STEPS = 10    # lead-timed steps the host lead and the timeline read, the newest in the window or before


def timed_steps(steps: Reversible[StepReading], win: list[StepReading], max_seconds: float) -> list[StepReading]:
    """The lead-timed steps the lead and the timeline read: the window's, and where the window holds fewer
    than ``TIMED_STEPS`` (a window of fast steps: about ten are timed a second), the newest before it,
    no older than ``max_seconds`` before the window's last step. Oldest first."""
    timed = [s for s in win if s.lead is not None]
    if len(timed) >= TIMED_STEPS or not win or win[-1].t is None:
        return timed
    first, oldest = win[0].step, win[-1].t - max_seconds
    earlier: list[StepReading] = []
    for s in reversed(steps):
        if len(timed) + len(earlier) >= TIMED_STEPS or (s.t is not None and s.t < oldest):
            break
        if s.step < first and s.lead is not None:
            earlier.append(s)
    return earlier[::-1] + timed


def gpu_busy(samples: list[SampleReading], local_rank: int) -> tuple[float | None, str | None]:
    """(busy, source) of this rank's GPU (index = local_rank when listed): NVML utilization, the share
    of time a kernel ran (``nvidia-smi``'s number), averaged over the samples.

    Busy is time and nothing else: GPM SM activity also counts the SMs a running kernel leaves empty
    (``gpu_fill`` reads it), so it is never busy; neither is the time between two CUDA events, which
    includes every idle gap. ``losses.BUSY_SOURCES`` names the sources."""
    own = [g for s in samples for g in own_gpus(s.gpus, local_rank)[:1]]
    known = [g.util for g in own if g.util is not None]
    return (statistics.fmean(known), "nvml_util") if known else (None, None)


def timeline_busy(steps: list[StepReading]) -> tuple[float | None, bool]:
    """(a lower bound on the share of the active step a kernel ran, from the steps' own CUDA timeline;
    whether it is exact), over at least ``TIMELINE_MIN_STEPS`` lead-timed steps, else (None, False).

    For a lead-timed step the host finished launching its work ``lead`` seconds before the device
    reached its last event, ``gpu_time`` after its first. A step the probe saw queued whole (its first
    event had not run when the host ended the step; before wire 1.5: its lead, read conservatively by
    ``lead_at_least``, at least its device time) was all queued before the device began it, and
    a stream runs its queue back to back (PyTorch, CUDA semantics: "each device executes operations in
    the order they are queued"): no kernel gap inside it, its whole device time busy. The bound counts
    those steps' device time over all the timed steps' active time (the others count nothing: a shorter
    lead proves little, and a late poller would overstate it); exact when every step was queued whole.
    Finer than NVML's sample period (1/6 s to 1 s) and confined to the steps, so where it proves more
    busy than utilization reads, it is the busy share (``rank_stats``); without utilization only an
    exact one is."""
    timed = [s for s in steps if s.lead is not None and s.gpu_time is not None and s.gpu_time > 0]
    active = sum(s.active for s in timed)
    if len(timed) < TIMELINE_MIN_STEPS or active <= 0:
        return None, False
    whole = [s for s in timed
             if (s.whole if s.whole is not None else lead_at_least(s.lead or 0.0) >= (s.gpu_time or 0.0))]
    return min(1.0, sum(s.gpu_time or 0.0 for s in whole) / active), len(whole) == len(timed)


class LeadTimes(NamedTuple):
    """The lead-timed steps of a window (CUDA events; the host rule, docs/verdict.md)."""
    device_time: float | None    # median device time, first event to last
    lead_steps: float | None     # median lead (as read: never short) over the step's device time
    queued_whole: float | None   # share of them the host queued whole before the device began them


def lead_times(steps: list[StepReading]) -> LeadTimes:
    """Under one step of lead the host was still launching a step while the device ran it, so launches
    can have idled the device. Whether a step was queued whole is the probe's exact answer (its first
    event had not run when the host finished it, wire 1.5); a recording without it falls back on the
    lead, which a poller late behind the GIL reads long, never short: a lead of a step or more as read
    may be less in truth, so the host is still not blamed on it."""
    timed = [s for s in steps if s.lead is not None and s.gpu_time is not None and s.gpu_time > 0]
    if not timed:
        return LeadTimes(None, None, None)
    ratios = [(s.lead or 0.0) / (s.gpu_time or 1.0) for s in timed]
    whole = [s.whole if s.whole is not None else ratio >= 1.0 for s, ratio in zip(timed, ratios)]
    return LeadTimes(statistics.median(s.gpu_time or 0.0 for s in timed), statistics.median(ratios),
                     sum(whole) / len(whole))


def gpu_fill(samples: list[SampleReading], local_rank: int) -> tuple[float | None, float | None, float | None]:
    """(fill, SM activity, tensor activity) of this rank's GPU over the samples; None where GPM gives none.

    SM activity (GPM SM_UTIL, DCGM's PROF_SM_ACTIVE) averages, over time, the share of SMs with a warp
    resident, idle time counting 0: "a kernel using N/5 blocks over the whole interval reads 0.2, and
    so does one using N blocks over a fifth of it" (DCGM user guide, profiling metrics). Dividing by
    the time a kernel ran (NVML utilization, over the same samples) leaves how much of the device the
    kernels fill while they run: the fill, capped at 1 (the two counters' periods differ)."""
    own = [g for s in samples for g in own_gpus(s.gpus, local_rank)[:1]]
    sm = [g.sm_active for g in own if g.sm_active is not None]
    tensor = [g.tensor_active for g in own if g.tensor_active is not None]
    pairs = [(g.sm_active, g.util) for g in own if g.sm_active is not None and g.util is not None]
    util = sum(u for _, u in pairs)
    fill = min(1.0, sum(a for a, _ in pairs) / util) if pairs and util > 0 else None
    return (fill, statistics.fmean(sm) if sm else None, statistics.fmean(tensor) if tensor else None)


def busy_unknown_reason(samples: list[SampleReading], local_rank: int, status: str | None) -> str:
    """Why this rank's GPU busy is not measured, in NVML's words where the probe gave them: the job
    device's ``status`` (no NVML, NVML not listing the job's GPU), a lost GPU, the GPU's ``why`` for
    its utilization (NotSupported, NoPermission, ...), else that no sample had a reading."""
    if status:
        return status
    own = [g for s in samples for g in own_gpus(s.gpus, local_rank)[:1]]
    if not own:
        return next((s.gpu_status for s in reversed(samples) if s.gpu_status),
                    "no GPU utilization samples for this job's GPU")
    last = own[-1]
    why = "NVML: GpuIsLost" if last.lost else last.why_not("util") or "NVML gave no utilization"
    return f"{why} ({last.errors} NVML errors)" if last.errors else why


def gpu_power(samples: list[SampleReading], local_rank: int) -> float | None:
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



def peak_flops_of(device: DeviceReading, samples: deque[SampleReading]) -> tuple[float | None, str | None]:
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


