"""Memory growth over the steps (perfmon_analysis.memory_growth): which readings a rank's series holds, its
least-squares growth per step and per second, each condition of a steady growth at its boundary, the
kind of memory that grows, and the steps left to the limit.

A rank's buffers hold its records (tests/helpers/records.py) as the run model parses them: step ``n``
runs 1 s from 100 + n, so a reading at its end (101 + n) is at step count ``n``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from perfmon_analysis.buffers import RankState
from perfmon_analysis.memory_growth import MemoryGrowth, _growing_kind, _line, job_growth, rank_growth
from perfmon_analysis.readings import StepReading, memory_reading, sample_reading, step_reading
from tests.helpers import records as R

MiB = 1 << 20
GiB = 1 << 30


def end(n: float) -> float:
    """The time of step count ``n``: step n ends at 101 + n."""
    return 101.0 + n


def step(n: int) -> StepReading:
    s = step_reading(R.step(n, start=100.0 + n, dur=1.0))
    assert s is not None
    return s


def cpu_rank(steps: Sequence[int], rss: Sequence[tuple[float, int]],
             memory: Sequence[tuple[float, dict[str, Any]]] = (), extra_steps: Sequence[StepReading] = ()) -> RankState:
    """A CPU rank with ``steps``, samples of ``rss`` (time, bytes) and CPU ``memory`` records (time, values)."""
    state = RankState(0, "r0", R.hello(0, t=0.0), 0)
    for s in [*map(step, steps), *extra_steps]:
        state.add_step(s)
    for t, value in rss:
        state.samples.append(sample_reading(R.sample(t, host={"rss": value})))
    for t, values in memory:
        state.memory.append(memory_reading(R.memory(t, device="cpu", **values)))
    return state


def at_steps(xs: Sequence[float], mib: Sequence[float]) -> list[tuple[float, int]]:
    """RSS readings at step counts ``xs`` of ``mib`` MiB each."""
    return [(end(x), int(v * MiB)) for x, v in zip(xs, mib)]


ODD = [1, 3, 5, 7, 9, 11]          # six readings over ten steps: the fewest a growth is read from


def steady(mib: list[float]) -> bool | None:
    growth = rank_growth(cpu_rank(list(range(1, 13)), at_steps(ODD, mib)))
    return None if growth is None else growth.steady


# -- the whole growth -----------------------------------------------------------------------------
def test_a_linear_rss_is_a_steady_growth_named_by_the_kind_that_rose_golden():
    memory = [(end(0.5), {"activations": 50 * MiB}),           # before the first step's end: not in the span
              (end(1), {"rss": 100 * MiB}),                     # no breakdown
              (end(5), {"params": MiB}),
              (end(21), {"params": MiB, "grads": 2 * MiB, "activations": 16 * MiB})]
    state = cpu_rank(list(range(1, 22)), at_steps(list(range(1, 22)), [100 + 2 * x for x in range(1, 22)]), memory)
    growth = rank_growth(state, GiB)
    assert growth is not None and growth.fit == pytest.approx(1.0, abs=1e-12)
    assert dataclasses.replace(growth, fit=1.0) == MemoryGrowth(
        rank=0, series="rss", per_step=2 * MiB, per_s=2 * MiB, steps=20, points=21, first=102 * MiB, last=142 * MiB,
        fit=1.0, steady=True, kind="activations", kind_per_step=MiB, limit=GiB, steps_to_limit=(1024 - 142) // 2)
    assert rank_growth(state) == dataclasses.replace(growth, limit=None, steps_to_limit=None)


def test_a_buffer_not_starting_at_step_zero_counts_from_its_first_step_at_its_own_pace():
    # steps 5..25 (older ones left the ring): a reading half-way through step 6 is in; 20 steps in 20 s
    rss = [(end(5.5), 111 * MiB), *at_steps(list(range(6, 26)), [100 + 2 * x for x in range(6, 26)])]
    growth = rank_growth(cpu_rank(list(range(5, 26)), rss))
    assert growth is not None and (growth.points, growth.first, growth.per_s) == (21, 111 * MiB, growth.per_step)
    assert growth.per_step == pytest.approx(2 * MiB)


def test_the_first_step_counted_is_step_one_when_the_buffer_starts_there_step_zero_left_out():
    rss = at_steps(list(range(0, 12)), [100 + x for x in range(0, 12)])
    from_one = rank_growth(cpu_rank(list(range(1, 12)), rss[1:]))
    from_zero = rank_growth(cpu_rank(list(range(0, 12)), rss))
    assert from_one is not None and from_zero is not None
    assert (from_one.points, from_one.first, from_zero.points, from_zero.first) == (11, 101 * MiB, 11, 101 * MiB)


def test_two_steps_far_apart_still_span_the_readings_between_them():
    # steps 1 and 31 only (the ones between dropped): readings every 3 s are every 3 steps
    state = cpu_rank([1, 31], at_steps([1 + 3 * k for k in range(11)], [100 + 6 * k for k in range(11)]))
    growth = rank_growth(state)
    assert growth is not None and (growth.steps, growth.points, growth.steady) == (30, 11, True)
    assert growth.per_step == pytest.approx(2 * MiB) and growth.per_s == pytest.approx(2 * MiB)


def test_too_few_steps_readings_or_steps_spanned_is_no_growth():
    assert rank_growth(cpu_rank([1], at_steps([1], [100]))) is None
    assert rank_growth(cpu_rank(list(range(1, 13)), at_steps(ODD[:5], [100, 102, 104, 106, 108]))) is None
    assert rank_growth(cpu_rank(list(range(1, 13)), at_steps([1, 2, 3, 4, 5, 10], [100, 102, 104, 106, 108, 118]))) \
        is None


def test_six_readings_over_exactly_ten_steps_are_a_growth_read_from_the_newest_half_too():
    # the late half is the last three readings, [4, 5, 11]: rising as fast, so steady
    growth = rank_growth(cpu_rank(list(range(1, 13)), at_steps([1, 2, 3, 4, 5, 11], [100, 102, 104, 106, 108, 120])))
    assert growth is not None and (growth.steps, growth.points, growth.steady) == (10, 6, True)
    assert growth.per_step == pytest.approx(2 * MiB)


def test_readings_after_the_last_step_are_at_its_count_and_the_late_half_still_rises():
    rss = [*at_steps([1, 2, 3, 4], [100, 102, 104, 106]), (end(11), 120 * MiB), (end(11) + 5.0, 120 * MiB)]
    growth = rank_growth(cpu_rank(list(range(1, 12)), rss))
    assert growth is not None and (growth.steps, growth.points, growth.steady) == (10, 6, True)


def test_two_readings_at_one_instant_are_at_one_step_count():
    rss = [*at_steps([1, 2, 3], [100, 102, 104]), (end(6), 110 * MiB), (end(6), 110 * MiB), (end(11), 120 * MiB)]
    growth = rank_growth(cpu_rank(list(range(1, 13)), rss))
    assert growth is not None and (growth.points, growth.steady) == (6, True)


def test_a_last_step_without_its_time_is_no_growth_and_a_first_one_no_rate():
    rss = at_steps(list(range(1, 13)), [100 + 2 * x for x in range(1, 13)])
    untimed = step_reading({"k": "step", "step": 13, "dur": 1.0})
    assert untimed is not None and untimed.t is None
    assert rank_growth(cpu_rank(list(range(1, 13)), rss, extra_steps=[untimed])) is None
    state = RankState(0, "r0", R.hello(0, t=0.0), 0)
    first = step_reading({"k": "step", "step": 0, "dur": 1.0})
    assert first is not None
    for s in [first, *map(step, range(1, 13))]:
        state.add_step(s)
    for t, value in rss:
        state.samples.append(sample_reading(R.sample(t, host={"rss": value})))
    growth = rank_growth(state)
    assert growth is not None and growth.per_step == pytest.approx(2 * MiB) and growth.per_s is None


# -- steady: each condition at its boundary --------------------------------------------------------
def test_a_fit_of_exactly_the_minimum_is_steady_under_it_is_not():
    assert steady([100, 100, 100, 106, 126, 128]) is True        # R² exactly 0.8
    assert steady([100, 130, 100, 130, 110, 150]) is False       # R² 0.35, however much it grew


def test_a_late_half_rising_at_exactly_half_the_rate_is_steady_slower_is_not():
    assert steady([100, 100, 100, 112, 116, 116]) is True        # late 1 MiB/step, overall 2
    assert steady([100, 108, 116, 124, 126, 128]) is False       # late at a third of the rate: levelling off


def test_growing_by_exactly_16_mib_is_steady_and_by_less_than_a_twentieth_of_a_large_start_is_not():
    sixteen = rank_growth(cpu_rank(list(range(1, 18)), at_steps(list(range(1, 18)), [100 + x for x in range(1, 18)])))
    assert sixteen is not None and sixteen.per_step == MiB and (sixteen.steps, sixteen.steady) == (16, True)
    big = rank_growth(cpu_rank(list(range(1, 18)), at_steps(list(range(1, 18)), [1024 + 2 * x for x in range(1, 18)])))
    assert big is not None and big.per_step == 2 * MiB and big.steady is False       # 32 MiB < 5% of 1 GiB


# -- the limit ---------------------------------------------------------------------------------------
def test_the_steps_to_the_limit_are_at_any_growth_and_none_past_it():
    one_byte = rank_growth(cpu_rank(list(range(1, 13)), [(end(x), 100 * MiB + x) for x in range(1, 13)]), 101 * MiB)
    assert one_byte is not None and one_byte.per_step == pytest.approx(1.0) and one_byte.steady is False
    assert one_byte.steps_to_limit == MiB - 12
    past = rank_growth(cpu_rank(list(range(1, 13)), at_steps(list(range(1, 13)), [100 + 2 * x for x in range(1, 13)])),
                       100 * MiB)
    assert past is not None and past.steps_to_limit == 0
    flat = rank_growth(cpu_rank(list(range(1, 13)), at_steps(list(range(1, 13)), [100] * 12)), GiB)
    assert flat is not None and (flat.per_step, flat.fit, flat.steady, flat.steps_to_limit) == (0.0, 1.0, False, None)


# -- what grows ----------------------------------------------------------------------------------------
def _readings(*at: tuple[float, dict[str, Any]]) -> list[Any]:
    return [memory_reading(R.memory(t, device="cpu", **values)) for t, values in at]


def test_the_kind_is_read_from_the_first_breakdown_at_the_first_counted_step():
    memory = [(end(1), {"activations": 4 * MiB}), (end(11), {"activations": 24 * MiB})]
    growth = rank_growth(cpu_rank(list(range(1, 13)), at_steps(list(range(1, 13)), [100 + 2 * x for x in range(1, 13)]),
                                  memory))
    assert growth is not None and (growth.kind, growth.kind_per_step) == ("activations", 2 * MiB)


def test_a_breakdown_with_every_kind_counts_and_a_rise_of_one_byte_names_its_kind():
    steps = [step(n) for n in range(1, 13)]
    full = {"params": 10, "grads": 10, "optimizer": 10, "activations": 10, "cache": 10, "other": 10}
    assert _growing_kind(_readings((end(1), full), (end(11), dict(full, cache=30))), steps) == ("cache", 2.0)
    assert _growing_kind(_readings((end(2), {"grads": 7}), (end(6), {"grads": 8})), steps) == ("grads", 0.25)


def test_no_kind_without_two_breakdowns_a_step_span_between_them_or_a_rise():
    steps = [step(n) for n in range(1, 13)]
    assert _growing_kind(_readings((end(2), {"grads": 7})), steps) == (None, None)
    # before the first step ended, and both after the last: no step span between them
    assert _growing_kind(_readings((end(0.5), {"grads": 7}), (end(6), {"grads": 9})), steps) == (None, None)
    assert _growing_kind(_readings((end(12), {"grads": 7}), (end(12) + 3.0, {"grads": 9})), steps) == (None, None)
    assert _growing_kind(_readings((end(2), {"grads": 7}), (end(6), {"grads": 7})), steps) == (None, None)


def test_a_breakdown_at_time_zero_is_before_the_first_step_of_a_clock_starting_at_zero():
    # 0.25 s steps from 0 s: step n ends at n / 4; the reading at 0 s comes before any step ended
    steps = [s for s in (step_reading(R.step(n, start=0.25 * (n - 1), dur=0.25)) for n in range(1, 13))
             if s is not None]
    state = RankState(0, "r0", R.hello(0, t=0.0), 0)
    for s in steps:
        state.add_step(s)
    for n in range(1, 13):
        state.samples.append(sample_reading(R.sample(0.25 * n, host={"rss": (100 + 2 * n) * MiB})))
    for t, values in [(0.0, {"activations": 64 * MiB}), (0.5, {"activations": MiB}), (2.75, {"activations": 10 * MiB})]:
        state.memory.append(memory_reading(R.memory(t, device="cpu", **values)))
    growth = rank_growth(state)
    assert growth is not None and (growth.kind, growth.kind_per_step) == ("activations", MiB)
    assert _growing_kind(list(state.memory)[::2], steps) == (None, None)


def test_the_line_fits_step_counts_closer_than_one_and_bytes_closer_than_one():
    assert _line([(0.0, 0.0), (0.5, 1.0), (1.0, 2.0)]) == (2.0, 1.0)
    assert _line([(0.0, 0.0), (1.0, 1.0), (2.0, 0.0)]) == (0.0, 0.0)


def test_the_jobs_growth_is_a_steady_one_first_then_the_fastest():
    def growth(rank: int, per_step: float, is_steady: bool) -> MemoryGrowth:
        return MemoryGrowth(rank, "rss", per_step, None, 20, 10, 0, 0, 1.0, is_steady)

    fast, slow_steady = growth(0, 9.0, False), growth(1, 2.0, True)
    assert job_growth([fast, None, slow_steady]) is slow_steady
    assert job_growth([fast, growth(2, 3.0, False)]) is fast
    assert job_growth([None]) is None
