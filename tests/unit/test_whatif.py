"""The what-if's dependency model (perfmon_analysis.whatif) and the straggler kinds told apart by it
(perfmon_analysis.stragglers), on synthetic jobs whose answer is known by construction."""

from __future__ import annotations

import random

import pytest

from perfmon_analysis.readings.layout import Op, StepOps, step_ops
from perfmon_analysis.stragglers import ROTATING, SLOW_STAGE, SLOW_WORKER, analyse
from perfmon_analysis.whatif import Model, compile_step, run
from tests.helpers.ops_jobs import even, pipeline


def test_gpipe_step_is_fill_plus_drain() -> None:
    """2 stages, 4 micro-batches, forward 1 s, backward 2 s, free transfers: GPipe's step is
    (micro-batches + stages - 1) x (f + b) = 5 x 3 s."""
    _, steps = pipeline(pp=2, dp=1, steps=1, compute=even(1.0, 2.0))
    graph = compile_step(0, steps[0])
    assert run(graph, [s.dur for s in graph.slots]) == pytest.approx(15.0)
    assert graph.forced == 0


def test_a_pair_waits_only_for_its_transfer() -> None:
    """The receiver posted long before the sender: its measured 5 s are waiting; the pair's transfer is
    the sender's 0.2 s, so the step is the sender's 3 s of work plus 0.2 s."""
    sender = StepOps(0, (Op("compute", 0.0, 3.0), Op("send", 3.0, 0.2, peer=1)), "device", (0.0, 3.2))
    receiver = StepOps(0, (Op("recv", 0.0, 5.0, peer=0),), "device", (0.0, 5.0))
    graph = compile_step(0, {0: sender, 1: receiver})
    assert run(graph, [s.dur for s in graph.slots]) == pytest.approx(3.2)


def test_host_clock_time_between_ops_is_the_threads_work() -> None:
    """On the host clock the thread's own time between recorded ops is work: one rank's step replays
    to its measured body (0.5 s of data wait before it left out)."""
    rec = {"k": "step", "t": 10.0, "step": 3, "start": 8.0, "dur": 2.0, "gap": 0.0, "phases": {"data": 0.5},
           "ops_clock": "host", "ops": [["all_reduce", 0.9, 0.3, -1, "world"], ["send", 1.5, 0.1, -1, 1]]}
    ops = step_ops(rec)
    assert ops is not None and ops.body == (0.5, 2.0)
    graph = compile_step(3, {0: ops})
    assert run(graph, [s.dur for s in graph.slots]) == pytest.approx(1.5)


def test_ideal_is_the_mean_work_and_the_median_transfer() -> None:
    lay, steps = pipeline(pp=2, dp=2, steps=3, compute=lambda st, s, d: (1.0 + st, 2.0))
    model = Model([compile_step(s, ops) for s, ops in steps.items()], lay.stage, lay.replica)
    assert model.ideal[("work", "fwd")] == pytest.approx(2.0)
    assert model.ideal[("work", "bwd")] == pytest.approx(2.0)


def test_slow_worker_is_named_with_its_replica_and_what_removing_it_buys() -> None:
    """Worker (stage 1, replica 2) computes twice as long on every step: a chronic slow worker; at its
    peers' speed the job is faster by about what it costs."""
    lay, steps = pipeline(pp=2, dp=4, steps=6, compute=lambda st, s, d: (2.0, 4.0) if (s, d) == (1, 2) else (1.0, 2.0))
    result = analyse(lay, steps)
    assert (result.cause, result.worker, result.rank, result.chronic) == (SLOW_WORKER, (1, 2), 6, True)
    assert result.slowdown is not None and result.slowdown > 1.5
    assert result.gain is not None and result.gain > 1.5


def test_rotating_imbalance_blames_no_single_worker() -> None:
    """A different replica is slow on each step (DDP with uneven batches): rotating, no worker named."""
    rng = random.Random(7)
    slow = [d for _ in range(3) for d in rng.sample(range(4), 4)]     # each replica slow on 3 of the 12 steps
    lay, steps = pipeline(pp=1, dp=4, steps=12, compute=lambda st, s, d: (2.0, 4.0) if d == slow[st] else (1.0, 2.0))
    result = analyse(lay, steps)
    assert result.cause == ROTATING and result.worker is None and result.rank is None
    assert result.workers_standing_out == len(set(slow)) and result.gain is not None and result.gain > 1.2


def test_slow_stage_is_partitioning() -> None:
    """Stage 1 holds 3x the layers on every replica: a slow stage, and no worker stands out."""
    lay, steps = pipeline(pp=2, dp=2, steps=4, compute=lambda st, s, d: (3.0, 6.0) if s == 1 else (1.0, 2.0))
    result = analyse(lay, steps)
    assert (result.cause, result.stage, result.worker) == (SLOW_STAGE, 1, None)
    assert result.standout_steps == 0 and result.by_stage[1] > result.by_stage[0]
    assert [round(s.compute_frac, 2) > round(t.compute_frac, 2) for s, t in [result.stages[::-1]]] == [True]


def test_one_stall_is_a_one_off_not_a_straggler() -> None:
    lay, steps = pipeline(pp=1, dp=4, steps=10,
                          compute=lambda st, s, d: (5.0, 5.0) if (st, d) == (4, 3) else (1.0, 2.0))
    result = analyse(lay, steps)
    assert result.cause is None and result.one_off == (4, 3) and result.standout_steps == 1


def test_a_balanced_job_names_nothing() -> None:
    lay, steps = pipeline(pp=2, dp=2, steps=5, compute=even())
    result = analyse(lay, steps)
    assert (result.cause, result.one_off, result.why) == (None, None, None)
    assert result.whole == pytest.approx(1.0)


def test_too_few_steps_say_why() -> None:
    lay, steps = pipeline(pp=1, dp=2, steps=2, compute=even())
    assert analyse(lay, steps).why == "fewer than 3 steps with every rank's operations"


def test_rotating_standouts_within_the_measured_cpu_contention_are_not_blamed_on_the_data():
    """A contended host slows a random rank each step: a standout no larger than the share of the step
    the ranks waited for a core is not rotating imbalance; the same standouts beyond it are."""
    rotation = [0, 2, 1, 3] * 3
    lay, steps = pipeline(pp=1, dp=4, steps=12,
                          compute=lambda st, s, d: (1.3, 2.6) if d == rotation[st] else (1.0, 2.0))
    assert analyse(lay, steps, noise=0.02).cause == ROTATING
    contended = analyse(lay, steps, noise=0.5)
    assert contended.cause is None and contended.standout_steps == 12
