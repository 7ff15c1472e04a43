"""Memory against its limit over the window (perfmon_analysis.memory_stats): a CUDA rank's reserved bytes
and breakdown from its ``memory`` records, the OOMs and allocator retries inside the window, and the
job's fullest rank with every rank's OOMs and rising retries.

A rank's records (tests/helpers/records.py) go into its buffers as the run model holds them."""

from __future__ import annotations

from typing import Any

from perfmon_analysis.buffers import RankState
from perfmon_analysis.memory_stats import job_memory, rank_memory
from perfmon_analysis.readings import event_reading, memory_reading, sample_reading, step_reading
from perfmon_analysis.views import MemoryMetrics
from tests.helpers import records as R

G = 1 << 30
M = 1 << 20
CUDA = {"type": "cuda", "name": "H100", "count": 1, "memory_total": 80 * G}


def cuda_rank(memory: list[tuple[float, dict[str, Any]]], ooms_at: tuple[float, ...] = ()) -> RankState:
    """A CUDA rank with ``memory`` records (time, values) and ``oom`` events at ``ooms_at``."""
    state = RankState(0, "r0", R.hello(0, t=0.0, device=CUDA), 0)
    for t, values in memory:
        state.memory.append(memory_reading(R.memory(t, device="cuda", **values)))
    for t in ooms_at:
        state.events.append(event_reading(R.event(t, "oom", error="OutOfMemoryError")))
    return state


BREAKDOWN = {"params": 1 * G, "grads": 1 * G, "optimizer": 2 * G, "activations": 512 * M, "cache": 256 * M,
             "other": 128 * M, "fragmentation": 64 * M}


def test_a_cuda_ranks_memory_is_the_windows_highest_reserved_with_the_newest_breakdown_golden():
    state = cuda_rank([
        (5.0, {"reserved": 7 * G, "peak_reserved": 9 * G, "alloc_retries": 0, "ooms": 0}),     # before the window
        (10.0, {"reserved": 6 * G, "peak_reserved": 9 * G, "allocated": 5 * G, "alloc_retries": 0, "ooms": 0}),
        (12.0, {"reserved": 4 * G, "peak_reserved": 9 * G, "allocated": 3 * G, "alloc_retries": 1, "ooms": 2,
                **BREAKDOWN}),
    ], ooms_at=(8.0, 11.0))
    assert rank_memory(state, 10.0, [], 50) == MemoryMetrics(
        source="device", rank=0, limit_bytes=80 * G, limit_source="device", peak_bytes=6 * G, peak_frac=0.075,
        params_bytes=1 * G, grads_bytes=1 * G, optimizer_bytes=2 * G, activations_bytes=512 * M, cache_bytes=256 * M,
        other_bytes=128 * M, fragmentation_bytes=64 * M, reserved_bytes=4 * G, allocated_bytes=3 * G,
        alloc_retries=1, alloc_retries_rising=True, ooms=1 + 2)


def test_without_new_allocator_ooms_only_the_oom_events_in_the_window_count():
    flat = cuda_rank([(10.0, {"reserved": 2 * G, "ooms": 0}), (12.0, {"reserved": 2 * G, "ooms": 0})], ooms_at=(11.0,))
    assert rank_memory(flat, 10.0, [], 50).ooms == 1
    # one reading in the window: no rise to read, whatever its running count says
    one = cuda_rank([(5.0, {"reserved": 2 * G, "ooms": 0}), (12.0, {"reserved": 2 * G, "ooms": 5})])
    assert rank_memory(one, 10.0, [], 50).ooms == 0
    assert rank_memory(one, None, [], 50).ooms == 5


def test_retries_rise_only_between_two_readings_in_the_window():
    state = cuda_rank([(10.0, {"reserved": G}), (12.0, {"reserved": G, "alloc_retries": 1})])
    m = rank_memory(state, 10.0, [], 50)
    assert (m.alloc_retries, m.alloc_retries_rising) == (1, True)
    one = cuda_rank([(5.0, {"reserved": G, "alloc_retries": 0}), (12.0, {"reserved": G, "alloc_retries": 3})])
    m = rank_memory(one, 10.0, [], 50)
    assert (m.alloc_retries, m.alloc_retries_rising) == (3, False)


def test_a_peak_that_rose_only_before_the_window_is_not_the_windows():
    state = cuda_rank([(5.0, {"reserved": 2 * G, "peak_reserved": 9 * G}),
                       (10.0, {"reserved": 3 * G, "peak_reserved": 9 * G}),
                       (12.0, {"reserved": 5 * G, "peak_reserved": 9 * G})])
    assert rank_memory(state, 10.0, [], 50).peak_bytes == 5 * G
    assert rank_memory(state, None, [], 50).peak_bytes == 9 * G       # the whole run: its peak


def test_after_a_peak_reset_the_windows_highest_reserved_still_counts():
    # the user reset the allocator's peaks (torch.cuda.reset_peak_memory_stats) between two readings
    state = cuda_rank([(5.0, {"reserved": 2 * G, "peak_reserved": 2 * G}),
                       (10.0, {"reserved": 8 * G, "peak_reserved": 8 * G}),
                       (12.0, {"reserved": 3 * G, "peak_reserved": 4 * G})])
    assert rank_memory(state, 10.0, [], 50).peak_bytes == 8 * G


def test_an_allocator_that_holds_nothing_yet_reads_zero_bytes():
    state = cuda_rank([(10.0, {"reserved": 0, "peak_reserved": 0, "allocated": 0})])
    m = rank_memory(state, 10.0, [], 50)
    assert (m.source, m.peak_bytes, m.peak_frac, m.reserved_bytes) == ("device", 0, 0.0, 0)


def test_a_reading_and_an_oom_at_time_zero_are_before_a_window_starting_after_it():
    state = cuda_rank([(0.0, {"reserved": 8 * G, "peak_reserved": 8 * G}),
                       (1.0, {"reserved": 2 * G, "peak_reserved": 8 * G})], ooms_at=(0.0,))
    m = rank_memory(state, 0.5, [], 50)
    assert (m.peak_bytes, m.ooms) == (2 * G, 0)


def test_a_cpu_ranks_memory_is_its_highest_recent_rss_against_the_limit():
    state = RankState(0, "r0", R.hello(0, t=0.0), 0)
    state.memory.append(memory_reading(R.memory(10.0, device="cpu", rss=3 * G, peak=5 * G, activations=G)))
    host = {"rss": 4 * G, "mem_limit": 16 * G, "mem_limit_source": "cgroup"}
    hosts = [sample_reading(R.sample(11.0, host=host)).host]
    assert rank_memory(state, 10.0, hosts, 50) == MemoryMetrics(
        source="host", rank=0, limit_bytes=16 * G, limit_source="cgroup", peak_bytes=4 * G, peak_frac=0.25,
        activations_bytes=G)


# -- the job's memory ------------------------------------------------------------------------------
def test_the_job_takes_the_fullest_rank_with_every_ranks_ooms_and_rising_retries():
    full = MemoryMetrics(rank=0, limit_bytes=10 * G, peak_bytes=9 * G, peak_frac=0.9, ooms=1)
    rising = MemoryMetrics(rank=1, limit_bytes=10 * G, peak_bytes=2 * G, peak_frac=0.2, alloc_retries=4,
                           alloc_retries_rising=True, ooms=0)
    assert job_memory([rising, full]) == MemoryMetrics(rank=0, limit_bytes=10 * G, peak_bytes=9 * G, peak_frac=0.9,
                                                       alloc_retries_rising=True, ooms=1)
    assert job_memory([full]) is full
    assert job_memory([]) == MemoryMetrics()


def test_without_limits_the_job_takes_the_rank_with_the_most_bytes_an_unknown_peak_last():
    none = MemoryMetrics(rank=0)
    zero = MemoryMetrics(rank=1, peak_bytes=0)
    some = MemoryMetrics(rank=2, peak_bytes=3 * G)
    assert job_memory([none, zero]) is zero
    assert job_memory([zero, some, none]) is some
    assert job_memory([some, MemoryMetrics(rank=3, peak_bytes=G, limit_bytes=2 * G, peak_frac=0.5)]).rank == 3


# -- ranks without memory records, and the edges of the window ----------------------------------------
def _cuda_steps(peaks: list[int | None]) -> RankState:
    """A CUDA rank with one step a second and no ``memory`` records: each step's ``mem`` reserved bytes."""
    state = RankState(0, "r0", R.hello(0, t=0.0, device=CUDA), 0)
    for n, peak in enumerate(peaks):
        extras = {"mem": {"reserved": peak}} if peak is not None else {}
        state.steps.append(step_reading(R.step(n, start=float(n), dur=1.0, **extras)))
    return state


def test_a_cuda_rank_without_memory_records_reads_the_peak_of_its_last_steps_against_the_device():
    state = _cuda_steps([70 * G, 8 * G, None, 20 * G])      # the first is older than the window's 3 steps
    assert rank_memory(state, None, [], 3) == MemoryMetrics(
        source="device", rank=0, limit_bytes=80 * G, limit_source="device", peak_bytes=20 * G, peak_frac=0.25)
    assert rank_memory(state, None, [], 4).peak_bytes == 70 * G


def test_a_cuda_rank_whose_steps_hold_no_memory_reads_unknown_against_the_known_limit():
    state = _cuda_steps([None, None])
    state.events.append(event_reading(R.event(1.0, "oom", error="OutOfMemoryError")))
    assert rank_memory(state, None, [], 50) == MemoryMetrics(
        source=None, rank=0, limit_bytes=80 * G, limit_source="device", ooms=1)


def test_a_cpu_rank_without_memory_records_reads_the_hosts_rss_or_nothing():
    state = RankState(0, "r0", R.hello(0, t=0.0), 0)
    hosts = [sample_reading(R.sample(t, host={"rss": rss})).host for t, rss in ((1.0, 3 * G), (2.0, 2 * G))]
    assert rank_memory(state, None, hosts, 50) == MemoryMetrics(source="host", rank=0, peak_bytes=3 * G)
    assert rank_memory(state, None, [], 50) == MemoryMetrics(rank=0)


def test_an_oom_at_the_windows_first_instant_is_in_the_window():
    state = cuda_rank([(10.0, {"reserved": G, "peak_reserved": G})], ooms_at=(10.0,))
    assert rank_memory(state, 10.0, [], 50).ooms == 1


def test_the_allocators_ooms_in_the_window_are_the_rise_from_its_first_reading():
    state = cuda_rank([(10.0, {"reserved": G, "ooms": 1}), (11.0, {"reserved": G, "ooms": 3})])
    assert rank_memory(state, 10.0, [], 50).ooms == 2


def test_a_peak_reserved_that_rose_at_the_windows_first_reading_counts():
    state = cuda_rank([(5.0, {"reserved": 6 * G, "peak_reserved": 7 * G}),
                       (10.0, {"reserved": 6 * G, "peak_reserved": 9 * G})])
    assert rank_memory(state, 10.0, [], 50).peak_bytes == 9 * G


def test_an_allocator_reporting_only_its_peak_reads_the_newest_peak():
    state = cuda_rank([(10.0, {"peak": 5 * G}), (11.0, {"peak": 3 * G}), (12.0, {"peak": 4 * G})])
    assert rank_memory(state, 10.0, [], 50).peak_bytes == 4 * G


def test_a_host_memory_record_from_before_the_window_without_host_samples_reads_its_own_rss_then_peak():
    state = RankState(0, "r0", R.hello(0, t=0.0), 0)
    state.memory.append(memory_reading(R.memory(1.0, device="cpu", rss=3 * G, peak=5 * G)))
    m = rank_memory(state, 10.0, [], 50)
    assert (m.source, m.peak_bytes, m.limit_bytes, m.peak_frac, m.alloc_retries_rising) == ("host", 3 * G, None, None,
                                                                                             False)
    state.memory.append(memory_reading(R.memory(2.0, device="cpu", peak=5 * G)))
    assert rank_memory(state, 10.0, [], 50).peak_bytes == 5 * G
    state.memory.append(memory_reading(R.memory(3.0, device="cpu")))
    m = rank_memory(state, 10.0, [], 50)
    assert (m.peak_bytes, m.peak_frac) == (None, None)
