"""Memory against its limit over the window: a rank's, and the job's fullest rank."""

from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING

from perfmon_analysis.buffers import recent_records
from perfmon_analysis.readings import HostReading, MemoryReading
from perfmon_analysis.views import MemoryMetrics

if TYPE_CHECKING:
    from perfmon_analysis.buffers import RankState

def rank_memory(state: RankState, win_start: float | None, hosts: list[HostReading],
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
            used = max((r for r in [m.rss for m in recent_records(in_win)] + host_rss if r is not None),
                       default=mem.rss or mem.peak)
            limit = mem.limit or host_limit
            limit_source = mem.limit_source or host_limit_source
        else:
            used = window_reserved(state.memory, in_win or [mem], win_start)
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


def window_reserved(records: deque[MemoryReading], in_win: list[MemoryReading],
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



def job_memory(mems: list[MemoryMetrics]) -> MemoryMetrics:
    """The fullest rank's memory (highest peak/limit) of each rank's ``mems``, OOMs summed over ranks."""
    if not mems:
        return MemoryMetrics()
    best = max(mems, key=lambda m: (m.peak_frac if m.peak_frac is not None else -1.0,
                                    m.peak_bytes if m.peak_bytes is not None else -1))
    ooms = sum(m.ooms for m in mems)
    rising = any(m.alloc_retries_rising for m in mems)
    if ooms != best.ooms or rising != best.alloc_retries_rising:
        best = MemoryMetrics(**{**best.__dict__, "ooms": ooms, "alloc_retries_rising": rising})
    return best
