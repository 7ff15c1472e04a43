"""In-loop work or a pause (perfmon_analysis/pauses.py, docs/verdict.md "Between steps"): time between
steps that recurs on (nearly) every step is the loop's; occasional gaps far above that level, and the
seconds of blocking events, are pauses."""

from __future__ import annotations

import random

import pytest

from perfmon_analysis.buffers import StepParser
from perfmon_analysis.pauses import Pauses
from perfmon_analysis.readings import event_reading


def _pauses(gaps: list[float], active: float = 0.1) -> list[float]:
    rule = Pauses()
    return [rule.pause(g, active + g) for g in gaps]


def test_a_checkpoint_every_five_steps_is_a_pause_and_the_loops_own_gap_is_not():
    gaps = [0.02, 0.02, 0.02, 0.02, 0.02 + 0.1] * 10      # 20 ms of work between every two steps, a checkpoint
    paused = _pauses(gaps)
    assert all(p == pytest.approx(0.1) for p in paused[4::5])     # the level: from the 5th gap on
    assert all(p == 0.0 for i, p in enumerate(paused) if i % 5 != 4)
    assert _pauses([0.5] + [0.0] * 4)[0] == 0.0                   # before it, only events make pauses


def test_work_that_varies_around_its_level_stays_the_loops():
    """A lock another thread holds for a varying time: gaps of 0 to 20 ms around a 10 ms median."""
    rng = random.Random(7)
    assert sum(_pauses([rng.uniform(0.0, 0.02) for _ in range(200)], active=0.01)) == 0.0


def test_a_pause_must_be_half_a_step_over_the_level():
    """Gaps of 1 ms with a 30 ms one: three times the level, but a small part of a 100 ms step."""
    assert _pauses([0.001] * 10 + [0.03])[-1] == 0.0
    assert _pauses([0.001] * 10 + [0.06])[-1] == pytest.approx(0.059)


def test_long_gaps_on_many_steps_are_the_loops_work_a_new_level_after_two():
    """The loop begins waiting 15 ms on a lock after 10 steps without: the median takes 25 steps to catch
    up, but long gaps on 3 of the last 8 steps are the loop's work, not pauses (the first two read as
    pauses); a wait on every third step (3 of 8) too, while a checkpoint every 4 steps stays a pause."""
    began = _pauses([0.0002] * 10 + [0.015] * 30, active=0.02)
    assert sum(1 for p in began[10:] if p > 0) == 2
    assert sum(1 for p in _pauses([0.0002, 0.0002, 0.03] * 20, active=0.02) if p > 0) == 2   # before it is seen
    every4 = _pauses([0.0002, 0.0002, 0.0002, 0.03] * 20, active=0.02)
    assert all(p == pytest.approx(0.03 - 0.0002) for p in every4[7::4])


def test_an_evaluation_among_a_loaded_machines_scheduling_delays_is_still_a_pause():
    """A sub-ms loop on a busy machine: preemptions leave gaps of a few ms on 3 of the last 8 steps; the
    evaluation's 300 ms gap after them is a pause, not the loop's work (they are far shorter)."""
    noisy = [0.0001] * 40 + [0.007, 0.0001, 0.006, 0.0001, 0.0001, 0.0065, 0.0001, 0.3]
    paused = _pauses(noisy, active=0.0007)
    assert paused[-1] == pytest.approx(0.3 - 0.0001)
    assert sum(1 for p in paused[:-1] if p > 0) == 2          # the first two delays; the third is their kind


def test_a_blocking_events_seconds_are_a_pause_whatever_their_size():
    """An ``eval`` event (the probe marking an evaluation pass) inside a gap the size rule keeps: its seconds
    are a pause, the rest of the gap the loop's."""
    parser = StepParser()
    steps = []
    for i in range(8):
        if i == 6:
            parser.event(event_reading({"k": "event", "t": 0.0, "name": "eval", "seconds": 0.015}))
        gap = 0.025 if i == 6 else 0.01
        steps.append(parser.step({"k": "step", "step": i, "t": 1.0 + i, "dur": 0.1 + gap, "gap": gap}))
    assert steps[6].pause == pytest.approx(0.015) and steps[6].loop == pytest.approx(0.01)
    assert all(s.pause == 0.0 for s in steps[:6] + steps[7:])


def test_the_level_is_the_median_of_an_even_count_of_gaps():
    """Four gaps known (0, 2, 8 and 10 ms): the level is 5 ms, so a 30 ms gap is 25 ms of pause."""
    assert _pauses([0.0, 0.002, 0.008, 0.01, 0.03], active=0.02)[-1] == pytest.approx(0.025)


def test_the_level_forgets_gaps_older_than_its_history():
    """49 gaps make the level: the 50th back (of 1 ms) no longer pulls the median below 1.5 ms."""
    gaps = [0.001] * 25 + [0.0015] * 25 + [0.01]
    assert _pauses(gaps, active=0.001)[-1] == pytest.approx(0.01 - 0.0015)


def test_a_gap_exactly_three_times_the_level_and_half_an_iteration_over_it_is_a_pause():
    """Binary fractions, so the bounds are met exactly: over the level by twice it, and by half the
    median iteration."""
    assert _pauses([0.25] * 10 + [0.75], active=0.25)[-1] == 0.5
    assert _pauses([0.25] * 10 + [1.25], active=1.75)[-1] == 1.0


def test_gaps_over_the_level_but_not_far_over_it_do_not_make_a_pause_recur():
    """Three gaps 1.5 ms over a 1 ms level (under twice it) before a 5 ms one: still a pause."""
    gaps = [0.001] * 20 + [0.0025, 0.001, 0.0025, 0.0025, 0.005]
    assert _pauses(gaps, active=0.001)[-1] == pytest.approx(0.004)


def test_a_recent_gap_exactly_a_quarter_of_this_ones_excess_is_of_its_kind():
    """Two gaps 1 s over the level, then one 4 s over it: the third of its kind in 8 is the loop's."""
    paused = _pauses([0.125] * 10 + [1.125, 0.125, 1.125, 0.125, 4.125], active=0.125)
    assert (paused[10], paused[12], paused[14]) == (1.0, 1.0, 0.0)
