"""The straggler analysis (perfmon_analysis.stragglers) at its edges: which ranks and steps it reads, each
threshold on both sides (a standout, a chronic worker, two workers taking turns, the contention), a worker
split over tensor-parallel ranks, a gain the simulation does not show, the stages' compute and bubble,
and the report's ``straggling`` JSON, golden. Jobs are the operations their ranks report: the GPipe
factory of tests/helpers/ops_jobs.py, or a step's ``StepOps`` where the case needs its own."""

from __future__ import annotations

import pytest

from perfmon_analysis.layout import Layout
from perfmon_analysis.readings.layout import Op, StepOps, step_ops
from perfmon_analysis.stragglers import NO_GAIN, ROTATING, SLOW_WORKER, StageTime, Straggling, analyse, stage_times
from tests.helpers.ops_jobs import Compute, even, layout, pipeline, records


def _window(pp: int, dp: int, steps: int, compute: Compute) -> tuple[Layout, dict[int, dict[int, StepOps]]]:
    """The job's operations as the run model reads them from its step records (each step's body is the
    step the ranks took, so the stages' shares are of the real step)."""
    out: dict[int, dict[int, StepOps]] = {}
    for rank, rec in records(pp, dp, steps, compute):
        if rec["k"] == "step":
            ops = step_ops(rec)
            assert ops is not None
            out.setdefault(rec["step"], {})[rank] = ops
    return layout(pp, dp), out


def _one(st: int, d: int, at: dict[tuple[int, int], tuple[float, float]]) -> tuple[float, float]:
    return at.get((st, d), (1.0, 1.0))


def _dp(dp: int, steps: int, at: dict[tuple[int, int], tuple[float, float]], mbs: int = 1):
    """A data-parallel job of one micro-batch a step: (forward, backward) 1 s each, except ``at[(step, replica)]``."""
    return pipeline(pp=1, dp=dp, steps=steps, mbs=mbs, compute=lambda st, s, d: _one(st, d, at))


# -- the report's JSON --------------------------------------------------------------------------
def test_a_slow_workers_json_names_it_in_the_jobs_dim_names_with_every_figure_to_four_places():
    lay, steps = _window(2, 4, 6, lambda st, s, d: (2.0, 4.0) if (s, d) == (1, 2) else (1.0, 2.0))
    result = analyse(lay, steps)
    assert result.as_json(lay) == {
        "cause": "slow_worker", "chronic": True, "steps": 6, "slowdown": 1.6222, "gain": 1.8, "whole_slowdown": 1.6,
        "rank": 6, "stage": None, "stage_slowdown": None, "standout_steps": 6, "workers_standing_out": 1,
        "worker": {"stage": 1, "replica": 2, "label": "dp2 pp1"}, "one_off": None,
        "by_stage": {"0": 0.9778, "1": 1.6222},
        "stages": [{"stage": 0, "compute_s": 12.0, "bubble_s": 0.0, "compute_frac": 0.4444, "bubble_frac": 0.0},
                   {"stage": 1, "compute_s": 12.0, "bubble_s": 0.0, "compute_frac": 0.4444, "bubble_frac": 0.0}],
        "forced": 0}
    assert result.as_json()["worker"] == {"stage": 1, "replica": 2, "label": None}     # no layout to name it by
    assert (result.top_share, result.stage_ratio, result.replicas, result.stages_seen) == (1.0, 1.0, 4, 2)


def test_a_slow_stages_json_gives_each_stages_compute_as_a_share_of_the_step():
    lay, steps = _window(2, 2, 4, lambda st, s, d: (3.0, 6.0) if s == 1 else (1.0, 2.0))
    result = analyse(lay, steps)
    assert result.as_json(lay) == {
        "cause": "slow_stage", "chronic": True, "steps": 4, "slowdown": 1.4, "gain": 1.3, "whole_slowdown": 1.3,
        "rank": None, "stage": 1, "stage_slowdown": 1.4, "standout_steps": 0, "workers_standing_out": 0,
        "worker": None, "one_off": None, "by_stage": {"0": 0.9, "1": 1.4},
        "stages": [{"stage": 0, "compute_s": 12.0, "bubble_s": 0.0, "compute_frac": 0.3077, "bubble_frac": 0.0},
                   {"stage": 1, "compute_s": 36.0, "bubble_s": 0.0, "compute_frac": 0.9231, "bubble_frac": 0.0}],
        "forced": 0}
    assert (result.top_share, result.stage_ratio, result.replicas, result.stages_seen) == (0.0, 1.5, 2, 2)


def test_a_one_off_and_the_reasons_are_in_the_json_only_when_there_are_some():
    lay, steps = _dp(4, 10, {(4, 3): (5.0, 5.0)})
    out = analyse(lay, steps).as_json(lay)
    assert (out["one_off"], out["cause"], "why" in out, "why_no_gain" in out) == ({"step": 4, "rank": 3}, None,
                                                                                    False, False)
    short = analyse(*pipeline(pp=1, dp=2, steps=2, compute=even())).as_json()
    assert short == {"cause": None, "chronic": False, "steps": 2, "slowdown": None, "gain": None,
                     "whole_slowdown": None, "rank": None, "stage": None, "stage_slowdown": None, "standout_steps": 0,
                     "workers_standing_out": 0, "worker": None, "one_off": None, "by_stage": {}, "stages": [],
                     "forced": 0, "why": "fewer than 3 steps with every rank's operations"}


def test_the_share_of_steps_with_a_standout_is_unknown_without_steps():
    assert Straggling(cause=None, steps=0).standout_share is None
    assert Straggling(cause=None, steps=8, standout_steps=2).standout_share == 0.25


# -- which ranks and steps are read -------------------------------------------------------------
def test_a_rank_reporting_half_the_steps_is_read_and_one_reporting_fewer_is_left_out():
    lay, steps = pipeline(pp=1, dp=4, steps=4, compute=even())
    half = {s: {r: ops for r, ops in by_rank.items() if r != 3 or s < 2} for s, by_rank in steps.items()}
    read = analyse(lay, half)          # rank 3 counts, so only the two steps it sent are whole
    assert (read.steps, read.why) == (2, "fewer than 3 steps with every rank's operations")
    once = {s: {r: ops for r, ops in by_rank.items() if r != 3 or s < 1} for s, by_rank in steps.items()}
    left = analyse(lay, once)          # rank 3 is left out: every step is whole without it
    assert (left.steps, left.why, left.replicas) == (4, None, 3)


def test_a_step_with_operations_dropped_is_not_simulated():
    lay, steps = pipeline(pp=1, dp=2, steps=4, compute=even())
    torn = StepOps(1, steps[1][0].ops, "device", steps[1][0].body, dropped=3)
    result = analyse(lay, {**steps, 1: {**steps[1], 0: torn}})
    assert (result.steps, result.why) == (3, None)


def test_two_ranks_over_three_whole_steps_are_enough_and_one_rank_is_not():
    lay, steps = pipeline(pp=1, dp=2, steps=3, compute=even())
    result = analyse(lay, steps)
    assert (result.cause, result.why, result.steps, result.whole) == (None, None, 3, pytest.approx(1.0))
    alone = {s: {0: by_rank[0]} for s, by_rank in steps.items()}
    assert analyse(lay, alone) == Straggling(cause=None, steps=3, why="fewer than two ranks sent their operations")


def test_a_window_of_zero_length_operations_names_nothing_and_divides_by_nothing():
    lay, steps = pipeline(pp=2, dp=2, steps=4, compute=even(0.0, 0.0))
    result = analyse(lay, steps)
    assert (result.cause, result.whole, result.by_stage, result.stage_ratio, result.standout_steps,
            result.one_off) == (None, None, {}, None, 0, None)
    assert result.stages == (StageTime(0, 0.0, 0.0, 0.0, 0.0), StageTime(1, 0.0, 0.0, 0.0, 0.0))


# -- a worker standing out ------------------------------------------------------------------------
def test_a_worker_standing_out_by_exactly_a_tenth_of_the_step_is_a_slow_worker_and_just_under_is_nothing():
    """Three replicas of 9 s of work, one doing 10 s: 1 s over the median is 10% of the 10 s step."""
    at = {(st, 0): (4.0, 6.0) for st in range(4)}
    lay, steps = pipeline(pp=1, dp=3, steps=4, mbs=1, compute=lambda st, s, d: at.get((st, d), (3.0, 6.0)))
    slow = analyse(lay, steps)
    assert (slow.cause, slow.worker, slow.rank, slow.standout_steps, slow.workers_standing_out) == (
        SLOW_WORKER, (0, 0), 0, 4, 1)
    assert (slow.slowdown, slow.gain) == (pytest.approx(10 / (28 / 3)), pytest.approx(10 / 9))
    at = {(st, 0): (3.9, 6.0) for st in range(4)}
    lay, steps = pipeline(pp=1, dp=3, steps=4, mbs=1, compute=lambda st, s, d: at.get((st, d), (3.0, 6.0)))
    under = analyse(lay, steps)
    assert (under.cause, under.standout_steps, under.one_off, under.top_share) == (None, 0, None, 0.0)


def test_a_slow_worker_of_milliseconds_is_found_as_one_of_seconds():
    lay, steps = pipeline(pp=1, dp=2, steps=4, mbs=1,
                          compute=lambda st, s, d: (0.004, 0.008) if d == 1 else (0.002, 0.004))
    result = analyse(lay, steps)
    assert (result.cause, result.worker, result.rank, result.standout_steps) == (SLOW_WORKER, (0, 1), 1, 4)
    # the peers' median of two workers is their mean: 9 ms against the measured 12 ms
    assert (result.whole, result.slowdown, result.gain) == (pytest.approx(4 / 3),) * 3


def test_a_worker_standing_out_on_exactly_half_the_steps_is_chronic():
    lay, steps = _dp(4, 4, {(0, 2): (3.0, 3.0), (1, 2): (3.0, 3.0)})
    result = analyse(lay, steps)
    assert (result.cause, result.worker, result.chronic, result.top_share) == (SLOW_WORKER, (0, 2), True, 0.5)


def test_a_worker_standing_out_twice_as_often_as_the_next_is_chronic():
    at = {(st, 0): (2.0, 2.0) for st in range(4)} | {(st, 1): (2.0, 2.0) for st in (4, 5)}
    result = analyse(*_dp(4, 6, at))
    assert (result.cause, result.worker, result.standout_steps, result.workers_standing_out) == (
        SLOW_WORKER, (0, 0), 6, 2)
    assert (result.slowdown, result.gain) == (pytest.approx(1.4), pytest.approx(1.5))


def test_two_workers_taking_turns_on_half_the_steps_are_rotating_imbalance_not_a_slow_worker():
    result = analyse(*_dp(4, 4, {(0, 0): (2.0, 2.0), (1, 1): (2.0, 2.0)}))
    assert (result.cause, result.chronic, result.worker, result.rank, result.stage) == (
        ROTATING, True, None, None, None)
    assert (result.standout_steps, result.workers_standing_out, result.top_share) == (2, 2, 0.25)
    assert (result.slowdown, result.gain, result.whole) == (pytest.approx(4 / 3),) * 3


def test_taking_turns_with_only_one_worker_beyond_the_contention_is_a_one_off():
    """Worker 0 stands out by 67% of the step, worker 1 by 23%: with 30% of the step lost to contention
    only worker 0 counts, and one worker is no rotation; without contention both count."""
    at = {(0, 0): (3.0, 3.0), (1, 0): (3.0, 3.0), (2, 1): (1.3, 1.3), (3, 1): (1.3, 1.3)}
    lay, steps = _dp(4, 4, at)
    contended = analyse(lay, steps, noise=0.3)
    assert (contended.cause, contended.one_off, contended.standout_steps, contended.workers_standing_out) == (
        None, (0, 0), 4, 2)
    assert analyse(lay, steps).cause == ROTATING


def test_the_one_off_named_is_the_largest_stall():
    lay, steps = _dp(4, 10, {(2, 1): (3.0, 3.0), (6, 3): (5.0, 5.0)})
    result = analyse(lay, steps)
    assert (result.cause, result.one_off, result.standout_steps, result.workers_standing_out) == (None, (6, 3), 2, 2)


def test_a_worker_slow_only_on_light_steps_shows_no_gain_at_its_peers_speed():
    """Worker 0 doubles the light steps (2 of 4), while the heavy steps take 6 s on every worker: at its
    peers' typical speed (the median over the window, 2.5 s a pass) the heavy steps would be slower, so
    the simulation shows no gain, and says why instead of a speedup under 1."""
    at = {(0, 0): (2.0, 2.0), (1, 0): (2.0, 2.0)} | {(st, d): (3.0, 3.0) for st in (2, 3) for d in range(3)}
    lay, steps = _dp(3, 4, at)
    result = analyse(lay, steps)
    assert (result.cause, result.worker, result.slowdown, result.gain, result.why_no_gain) == (
        SLOW_WORKER, (0, 0), pytest.approx(31 / 26), None, NO_GAIN)
    assert result.as_json(lay)["why_no_gain"] == NO_GAIN


# -- a worker of several ranks (tensor parallel) --------------------------------------------------
def _tp(work) -> tuple[Layout, dict[int, dict[int, StepOps]]]:
    """Three replicas of two tensor-parallel ranks (ranks 2r and 2r + 1 are replica r), 4 steps of one
    compute and one all-reduce over the world; ``work(step, rank)`` its seconds."""
    lay = Layout(dims=("dp", "tp"), sizes=(3, 2), coords={r: (r // 2, r % 2) for r in range(6)}, source="mesh")
    steps = {st: {r: StepOps(st, (Op("compute", 0.0, work(st, r)), Op("all_reduce", work(st, r), 0.0, group="world")),
                             "device", (0.0, work(st, r))) for r in range(6)} for st in range(4)}
    return lay, steps


def test_a_slow_tensor_parallel_worker_is_named_by_the_rank_slowest_on_most_steps_the_first_of_a_tie():
    slow = {(0, 2): 0.02, (0, 3): 0.02, (1, 2): 0.02, (1, 3): 0.02, (2, 2): 0.02, (2, 3): 0.02,
            (3, 2): 0.019, (3, 3): 0.02}
    result = analyse(*_tp(lambda st, r: slow.get((st, r), 0.01)))
    assert (result.cause, result.worker, result.rank, result.standout_steps) == (SLOW_WORKER, (0, 1), 2, 4)
    assert result.gain == pytest.approx(2.0)


def test_a_tensor_parallel_one_off_names_the_rank_slowest_on_that_step():
    """Rank 3 is a little slower than rank 2 on every step but step 1, where rank 2 stalls."""
    def work(st: int, r: int) -> float:
        if st == 1 and r in (2, 3):
            return 0.03 if r == 2 else 0.011
        return 0.0105 if r == 3 else 0.01
    result = analyse(*_tp(work))
    assert (result.cause, result.one_off, result.standout_steps) == (None, (1, 2), 1)


# -- the stages' compute and bubble -------------------------------------------------------------------
def _stage(step: int, rank: int) -> StepOps:
    """Two pipeline stages on the host clock: stage 0 computes 3, 4, 5 s over steps 0-2 and waits 0.5 s in a
    receive; stage 1 waits 2 s in its receive, or 1.5 s where the probe timed its point-to-point waits."""
    if rank == 0:
        return StepOps(step, (Op("fwd", 0.0, 2.0, 0), Op("send", 2.0, 0.1, 0, peer=1), Op("recv", 2.1, 0.5, 0, peer=1),
                              Op("bwd", 2.6, 1.0 + step, 0)), "host", (0.0, 4.0 + step))
    return StepOps(step, (Op("recv", 0.0, 2.0, 0, peer=0), Op("fwd", 2.0, 0.5, 0), Op("send", 2.5, 0.1, 0, peer=0)),
                   "host", (0.0, 4.0), p2p_wait=1.5 if step else None)


def test_each_stages_compute_and_bubble_are_its_medians_over_the_steps_and_shares_of_its_step():
    lay = Layout(dims=("pp",), sizes=(2,), coords={0: (0,), 1: (1,)}, source="pipeline")
    steps = [{2: _stage(i, 0), 0: _stage(i, 0), 1: _stage(i, 1)} for i in range(3)]     # rank 2 has no place
    assert stage_times(lay, steps) == (StageTime(0, 4.0, 0.5, 0.8, 0.1), StageTime(1, 0.5, 1.5, 0.125, 0.375))
    assert StageTime(1, 0.5, 1.5, 0.125, 1 / 3).as_json() == {"stage": 1, "compute_s": 0.5, "bubble_s": 1.5,
                                                              "compute_frac": 0.125, "bubble_frac": 0.3333}


def test_a_stage_with_an_empty_step_has_no_share_and_one_stage_has_no_stage_times():
    lay = Layout(dims=("pp",), sizes=(2,), coords={0: (0,), 1: (1,)}, source="pipeline")
    idle = StepOps(0, (), "host", (0.0, 0.0))
    assert stage_times(lay, [{0: idle, 1: _stage(0, 1)}]) == (StageTime(0, 0.0, 0.0, 0.0, 0.0),
                                                              StageTime(1, 0.5, 2.0, 0.125, 0.5))
    assert stage_times(layout(1, 2), [{0: _stage(0, 0), 1: _stage(0, 0)}]) == ()
