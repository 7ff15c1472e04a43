"""The CUDA memory the window counts (perfmon_analysis.memory_stats.window_reserved): the highest sampled
``reserved``, the allocator's ``peak_reserved`` only if it rose inside the window, else the
allocated ``peak``."""

from __future__ import annotations

import collections

from perfmon_analysis.memory_stats import window_reserved as _window_reserved
from perfmon_analysis.readings import MemoryReading, memory_reading

G = 1 << 30


def _mem(t: float, **values: int) -> MemoryReading:
    return memory_reading({"k": "memory", "t": t, **values})


def test_a_spike_inside_the_window_counts_one_before_it_does_not():
    before = _mem(5.0, reserved=2 * G, peak_reserved=9 * G)
    inside = [_mem(10.0, reserved=3 * G, peak_reserved=9 * G), _mem(11.0, reserved=4 * G, peak_reserved=9 * G)]
    assert _window_reserved(collections.deque([before, *inside]), inside, 10.0) == 4 * G
    rose = [_mem(10.0, reserved=3 * G, peak_reserved=9 * G), _mem(11.0, reserved=4 * G, peak_reserved=12 * G)]
    assert _window_reserved(collections.deque([before, *rose]), rose, 10.0) == 12 * G


def test_a_record_at_the_window_start_is_inside_it():
    first = [_mem(10.0, reserved=3 * G, peak_reserved=5 * G)]
    assert _window_reserved(collections.deque(first), first, 10.0) == 5 * G


def test_without_reserved_figures_the_allocated_peak_stands_in():
    inside = [_mem(10.0, peak=7 * G)]
    assert _window_reserved(collections.deque(inside), inside, 10.0) == 7 * G
    assert _window_reserved(collections.deque(), [], 10.0) is None
