"""The what-if's dependency model (perfmon_analysis.whatif) and the straggler kinds told apart by it
(perfmon_analysis.stragglers), on synthetic jobs whose answer is known by construction."""

from __future__ import annotations

import random

import pytest

from perfmon_analysis.readings.layout import Op, StepOps, step_ops
from perfmon_analysis.stragglers import ROTATING, SLOW_STAGE, SLOW_WORKER, analyse
from perfmon_analysis.whatif import JOIN, LEAVE, POST, RECV, SENT, WORK, Model, Slot, StepGraph, compile_step, run
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


# -- the dependency model of one step, golden (durations are dyadic, so every sum is exact) -----------------
def _ops(clock: str, body: float, *ops: Op, p2p_wait: float | None = None) -> StepOps:
    return StepOps(0, tuple(ops), clock, (0.0, body), p2p_wait=p2p_wait)


def test_the_kth_send_pairs_with_the_kth_receive_and_the_kth_call_on_a_group_with_the_kth() -> None:
    """Rank 1 waits 2 s in its first receive: the pair's transfer is the sender's 0.25 s. The second pair
    and the calls each take their shortest member's time: 1 s of work, two transfers, 0.5 s of work, two
    calls make 2.25 s."""
    graph = compile_step(0, {
        0: _ops("device", 2.5, Op("compute", 0.0, 1.0), Op("send", 1.0, 0.25, peer=1), Op("send", 1.25, 0.5, peer=1),
                Op("all_reduce", 1.75, 0.25, group="world"), Op("all_reduce", 2.0, 0.5, group="world")),
        1: _ops("device", 3.5, Op("recv", 0.0, 2.0, peer=0), Op("recv", 2.0, 0.125, peer=0), Op("compute", 2.125, 0.5),
                Op("all_reduce", 2.625, 0.75, group="world"), Op("all_reduce", 3.375, 0.125, group="world"))})
    assert graph.slots == (Slot(1.0, ("work", "compute"), (0,), 0, True),
                           Slot(0.25, ("call", "all_reduce", "world"), (0, 1), 0, False),
                           Slot(0.125, ("call", "all_reduce", "world"), (0, 1), 1, False),
                           Slot(0.25, ("p2p",), (0, 1), 0, False), Slot(0.125, ("p2p",), (0, 1), 0, False),
                           Slot(0.5, ("work", "compute"), (1,), 0, True))
    assert graph.program == ((WORK, 0, 0, 0), (POST, 0, 0, 0), (POST, 0, 0, 1), (JOIN, 0, 0, 2), (RECV, 1, 3, 0),
                             (RECV, 1, 4, 1), (WORK, 1, 5, 0), (JOIN, 1, 0, 2), (LEAVE, 1, 1, 2), (JOIN, 1, 0, 3),
                             (LEAVE, 0, 1, 2), (JOIN, 0, 0, 3), (LEAVE, 0, 2, 3), (LEAVE, 1, 2, 3))
    assert (graph.links, graph.forced, graph.clock) == (4, 0, "device")
    assert run(graph, [s.dur for s in graph.slots]) == 2.25
    assert run(graph, [1.0, 0.0, 0.0, 0.0, 0.0, 0.5]) == 1.5        # free transfers: the two works back to back


def test_on_the_host_clock_the_time_between_operations_is_work_named_after_the_operation_it_leads_to() -> None:
    """Rank 1 issues its send and its receive at the same instant: the send is posted first, so rank 0's
    receive of it ends at 1.25 + 0.0625 s, not after rank 1's receive."""
    graph = compile_step(0, {
        0: _ops("host", 3.0, Op("send", 0.5, 0.125, peer=1), Op("recv", 0.625, 1.0, peer=1),
                Op("compute", 1.625, 0.875)),
        1: _ops("host", 2.0, Op("compute", 0.0, 1.25), Op("recv", 1.25, 0.25, peer=0), Op("send", 1.25, 0.0625, peer=0),
                Op("compute", 1.5, 0.5))})
    assert graph.slots == (Slot(0.5, ("gap", "send"), (0,), 0, True), Slot(0.125, ("gap", "recv"), (0,), 0, True),
                           Slot(0.0625, ("p2p",), (1, 0), 0, False), Slot(0.875, ("work", "compute"), (0,), 0, True),
                           Slot(0.5, ("gap", "end"), (0,), 0, True), Slot(1.25, ("work", "compute"), (1,), 0, True),
                           Slot(0.125, ("p2p",), (0, 1), 0, False), Slot(0.5, ("work", "compute"), (1,), 1, True))
    assert (graph.links, graph.forced, graph.clock) == (2, 0, "host")
    assert run(graph, [s.dur for s in graph.slots]) == 2.6875


def test_a_send_the_host_waited_for_holds_it_until_the_receiver_took_it() -> None:
    """Rank 0 blocks on its send from 0.625 s until rank 1 receives it at 1.5 s: its last second of work
    and the tail end at 3 s; without that dependency it would end at 2.125 s."""
    graph = compile_step(0, {
        0: _ops("host", 3.0, Op("send", 0.5, 1.0, peer=1, waited=0.625), Op("compute", 1.5, 1.0)),
        1: _ops("device", 2.5, Op("compute", 0.0, 1.25), Op("recv", 1.25, 0.25, peer=0), Op("compute", 1.5, 1.0))})
    assert graph.slots == (Slot(0.5, ("gap", "send"), (0,), 0, True), Slot(0.125, ("gap", "wait"), (0,), 0, True),
                           Slot(1.0, ("work", "compute"), (0,), 0, True), Slot(0.5, ("gap", "end"), (0,), 0, True),
                           Slot(1.25, ("work", "compute"), (1,), 0, True), Slot(0.25, ("p2p",), (0, 1), 0, False),
                           Slot(1.0, ("work", "compute"), (1,), 1, True))
    assert graph.program == ((WORK, 0, 0, 0), (POST, 0, 0, 0), (WORK, 0, 1, 0), (WORK, 1, 4, 0), (RECV, 1, 5, 0),
                             (WORK, 1, 6, 0), (SENT, 0, 0, 0), (WORK, 0, 2, 0), (WORK, 0, 3, 0))
    assert (graph.links, graph.clock) == (1, "host")        # one host-clock rank makes the step's clock the host's
    assert run(graph, [s.dur for s in graph.slots]) == 3.0


def test_operations_without_their_other_side_are_work_or_hold_nobody_up() -> None:
    """A receive with no matching send is the rank's own time; a send nobody receives, and the host's
    wait for it, are not dependencies."""
    graph = compile_step(0, {
        0: _ops("host", 1.0, Op("send", 0.0, 0.25, peer=1, waited=0.0), Op("recv", 0.25, 0.5, peer=1),
                Op("compute", 0.75, 0.25)),
        1: _ops("host", 0.5, Op("compute", 0.0, 0.5))})
    assert graph.slots == (Slot(0.5, ("work", "recv"), (0,), 0, True), Slot(0.25, ("work", "compute"), (0,), 0, True),
                           Slot(0.5, ("work", "compute"), (1,), 0, True))
    assert graph.program == ((WORK, 0, 0, 0), (WORK, 0, 1, 0), (WORK, 1, 2, 0))
    assert (graph.links, graph.forced) == (1, 0) and run(graph, [s.dur for s in graph.slots]) == 0.75


def test_collectives_called_in_opposite_orders_are_released_once_and_the_step_still_ends() -> None:
    graph = compile_step(0, {
        0: _ops("device", 0.3125, Op("compute", 0.0, 0.125), Op("all_reduce", 0.125, 0.0625, group="a"),
                Op("all_gather", 0.1875, 0.125, group="b")),
        1: _ops("device", 0.375, Op("compute", 0.0, 0.25), Op("all_gather", 0.25, 0.0625, group="b"),
                Op("all_reduce", 0.3125, 0.125, group="a"))})
    assert graph.program == ((WORK, 0, 0, 0), (JOIN, 0, 0, 0), (WORK, 1, 3, 0), (JOIN, 1, 0, 1), (LEAVE, 0, 1, 0),
                             (JOIN, 0, 0, 1), (LEAVE, 0, 2, 1), (LEAVE, 1, 2, 1), (JOIN, 1, 0, 0), (LEAVE, 1, 1, 0))
    assert graph.forced == 1
    assert run(graph, [s.dur for s in graph.slots]) == 0.375


def test_two_hosts_each_waiting_for_its_send_before_receiving_the_others_are_released_once() -> None:
    graph = compile_step(0, {
        0: _ops("host", 0.3125, Op("send", 0.0, 0.25, peer=1, waited=0.0), Op("recv", 0.25, 0.0625, peer=1)),
        1: _ops("host", 0.375, Op("send", 0.0, 0.25, peer=0, waited=0.0), Op("recv", 0.25, 0.125, peer=0))})
    assert graph.slots == (Slot(0.0625, ("p2p",), (1, 0), 0, False), Slot(0.125, ("p2p",), (0, 1), 0, False))
    assert graph.program == ((POST, 0, 0, 0), (POST, 1, 0, 1), (SENT, 0, 0, 0), (RECV, 0, 0, 1), (SENT, 1, 0, 1),
                             (RECV, 1, 1, 0))
    assert graph.forced == 1
    assert run(graph, [s.dur for s in graph.slots]) == 0.1875     # the released wait waits for nothing


def test_two_ranks_each_receiving_before_sending_are_released_once() -> None:
    graph = compile_step(0, {
        0: _ops("device", 0.625, Op("recv", 0.0, 0.5, peer=1), Op("send", 0.5, 0.125, peer=1)),
        1: _ops("device", 0.5, Op("recv", 0.0, 0.25, peer=0), Op("send", 0.25, 0.25, peer=0))})
    assert graph.program == ((RECV, 0, 0, 1), (POST, 0, 0, 0), (RECV, 1, 1, 0), (POST, 1, 0, 1))
    assert (graph.forced, run(graph, [s.dur for s in graph.slots])) == (1, 0.375)


def test_a_step_without_ranks_takes_no_time() -> None:
    graph = compile_step(0, {})
    assert (graph.slots, graph.program, graph.links, run(graph, [])) == ((), (), 0, 0.0)


# -- the variants' durations ---------------------------------------------------------------------------------
def _pair(step: int, send: float, recv: float, call: float, clock: str) -> StepGraph:
    """Rank 0 computes 1 s, sends to rank 1 and joins an all-reduce; rank 1 receives, computes 0.5 s, joins."""
    return compile_step(step, {
        0: _ops(clock, 1.0 + send + call, Op("compute", 0.0, 1.0), Op("send", 1.0, send, peer=1),
                Op("all_reduce", 1.0 + send, call, group="world")),
        1: _ops(clock, recv + 1.0, Op("recv", 0.0, recv, peer=0), Op("compute", recv, 0.5),
                Op("all_reduce", recv + 0.5, 0.5, group="world"))})


def test_a_transfers_ideal_is_its_median_and_on_the_host_clock_a_pair_takes_its_channels_floor() -> None:
    """The pair's transfer is 0.25 s in step 0 and 0.5 s in step 1, the call's 0.125 s and 0.375 s. On the
    device clock they are as measured, ideally their medians; on the host clock a send's completion is
    seen late, so the channel's floor over the window (0.25 s) is the pair's transfer in both."""
    device = Model([_pair(0, 0.25, 1.5, 0.125, "device"), _pair(1, 0.5, 2.0, 0.375, "device")],
                   lambda r: r, lambda r: 0)
    assert (device.floor, device.durations("measured"), device.durations("ideal")) == (
        {}, [[1.0, 0.125, 0.25, 0.5], [1.0, 0.375, 0.5, 0.5]], [[0.75, 0.25, 0.375, 0.75], [0.75, 0.25, 0.375, 0.75]])
    host = Model([_pair(0, 0.25, 1.5, 0.125, "host"), _pair(1, 0.5, 2.0, 0.375, "host")], lambda r: r, lambda r: 0)
    assert [s.key for s in host.graphs[0].slots] == [("work", "compute"), ("gap", "all_reduce"),
                                                    ("call", "all_reduce", "world"), ("p2p",), ("work", "compute")]
    assert (host.floor, host.durations("measured"), host.durations("ideal")) == (
        {(0, 1): 0.25}, [[1.0, 0.25, 0.125, 0.25, 0.5], [1.0, 0.5, 0.375, 0.25, 0.5]],
        [[0.75, 0.375, 0.25, 0.25, 0.75], [0.75, 0.375, 0.25, 0.25, 0.75]])


def _stage_model() -> Model:
    """2 stages x 2 replicas, 2 steps of one micro-batch: stage 0 has no forward, stage 1's forward is
    0.25 s on replica 0 and 0.5 s on replica 1; the backward is 0.125 s x (step + 1) x (stage + 1)."""
    lay, steps = pipeline(pp=2, dp=2, steps=2, mbs=1,
                          compute=lambda st, s, d: (0.0 if s == 0 else 0.25 * (1 + d), 0.125 * (1 + st) * (1 + s)))
    return Model([compile_step(s, ops) for s, ops in steps.items()], lay.stage, lay.replica)


def _work(model: Model, source: str) -> dict[tuple[str, int], float]:
    """Step 1's forward and backward durations under ``source``, by (kind, rank)."""
    graph = model.graphs[1]
    return {(s.key[1], s.owners[0]): d for s, d in zip(graph.slots, model.durations(source)[1])
            if s.key in (("work", "fwd"), ("work", "bwd"))}


def test_each_variant_gives_the_work_its_own_durations() -> None:
    model = _stage_model()
    assert (model.peer, model.level) == (
        {(("work", "fwd"), 0): 0.0, (("work", "bwd"), 0): 0.1875, (("work", "opt"), 0): 0.0,
         (("work", "fwd"), 1): 0.375, (("work", "bwd"), 1): 0.375, (("work", "opt"), 1): 0.0},
        {("work", "fwd"): 0.1875, ("work", "bwd"): 0.28125, ("work", "opt"): 0.0})
    assert _work(model, "measured") == {("fwd", 0): 0.0, ("bwd", 0): 0.25, ("fwd", 1): 0.0, ("bwd", 1): 0.25,
                                        ("fwd", 2): 0.25, ("bwd", 2): 0.5, ("fwd", 3): 0.5, ("bwd", 3): 0.5}
    assert _work(model, "ideal") == {("fwd", r): 0.1875 for r in range(4)} | {("bwd", r): 0.28125 for r in range(4)}
    assert _work(model, "peers") == {("fwd", 0): 0.0, ("bwd", 0): 0.1875, ("fwd", 1): 0.0, ("bwd", 1): 0.1875,
                                     ("fwd", 2): 0.375, ("bwd", 2): 0.375, ("fwd", 3): 0.375, ("bwd", 3): 0.375}
    # balanced: a stage's compute scaled by the stages' mean over its own median (a stage without forward stays 0)
    assert _work(model, "balanced") == {("fwd", 0): 0.0, ("bwd", 0): 0.375, ("fwd", 1): 0.0, ("bwd", 1): 0.375,
                                        ("fwd", 2): 0.125, ("bwd", 2): 0.375, ("fwd", 3): 0.25, ("bwd", 3): 0.375}
    assert _work(model, "evened") == {("fwd", 0): 0.0, ("bwd", 0): 0.25, ("fwd", 1): 0.0, ("bwd", 1): 0.25,
                                      ("fwd", 2): 0.375, ("bwd", 2): 0.5, ("fwd", 3): 0.375, ("bwd", 3): 0.5}
    assert {src: model.times(src) for src in ("measured", "ideal", "peers", "balanced", "evened")} == {
        "measured": [0.875, 1.25], "ideal": [0.9375, 0.9375], "peers": [0.9375, 0.9375], "balanced": [0.625, 1.0],
        "evened": [0.75, 1.125]}


def test_a_variant_taken_for_some_slots_keeps_the_base_for_the_rest() -> None:
    model = _stage_model()
    assert model.times("ideal", "measured") == model.times("measured") == [0.875, 1.25]
    assert model.times("ideal", "measured", model.of_stage(1)) == [1.21875, 1.46875]
    assert model.times("ideal", "measured", model.of_replica(1)) == [0.9375, 1.25]
    slots = [(s.key[0], s.owners) for s in model.graphs[0].slots]
    assert [o for (_, o), on in zip(slots, model.of_replica(1)[0]) if on] == [
        (0, 1), (1,), (3, 1), (1,), (1,), (2, 3), (1, 3), (3,), (3,), (3,)]       # ranks 1 and 3, and their transfers
    assert [o for (_, o), on in zip(slots, model.of_worker(1, 1)[0]) if on] == [
        (3, 1), (2, 3), (1, 3), (3,), (3,), (3,)]
