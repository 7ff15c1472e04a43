"""A rank's GPU over the window's samples: busy, power and the peak FLOP/s its MFU divides by."""

from __future__ import annotations

import statistics
from typing import Deque

from perfmon_analysis.readings import DeviceReading, SampleReading, own_gpus

def gpu_busy(samples: list[SampleReading], local_rank: int) -> tuple[float | None, str | None]:
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



def peak_flops_of(device: DeviceReading, samples: Deque[SampleReading]) -> tuple[float | None, str | None]:
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


