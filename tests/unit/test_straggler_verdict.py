"""The verdict's straggler outcomes (perfmon_analysis.straggler_verdict): reached from the what-if over
synthetic jobs' operations (tests/helpers/ops_jobs.py), priced by the simulation, and a data-parallel
job that has none of them reading as before they existed."""

from __future__ import annotations

import pytest

from perfmon_analysis import verdict as V
from perfmon_analysis.report import build, render_text
from tests.helpers.ops_jobs import view
from tests.unit.verdict_synth import Rank, job

ROTATION = [0, 2, 1, 3]

# (name, job, outcome, path, straggler rank)
LEAVES = [
    ("slow_worker: worker (stage 1, replica 2) twice as slow on every step",
     dict(pp=2, dp=4, steps=8, compute=lambda st, s, d: (2.0, 4.0) if (s, d) == (1, 2) else (1.0, 2.0)),
     "slow_worker", ["memory", "device_busy", "data_wait", "comm_exposed", "worker_slow"], 6),
    ("slow_stage: stage 1 holds 3x the layers on both replicas",
     dict(pp=2, dp=2, steps=8, compute=lambda st, s, d: (3.0, 6.0) if s == 1 else (1.0, 2.0)),
     "slow_stage", ["memory", "device_busy", "data_wait", "comm_exposed", "worker_slow", "rotating", "stage_heavy"],
     None),
    ("rotating_imbalance: data parallel, a different replica slow each step",
     dict(pp=1, dp=4, steps=12, compute=lambda st, s, d: (2.0, 4.0) if d == ROTATION[st % 4] else (1.0, 2.0),
          layout_record=False),
     "rotating_imbalance", ["memory", "device_busy", "data_wait", "comm_exposed", "rotating"], None),
]
STRAGGLER_LEAVES = {leaf for _, _, leaf, _, _ in LEAVES}


@pytest.mark.parametrize("name,kw,leaf,path,rank", LEAVES, ids=[x[0].split(":")[0] for x in LEAVES])
def test_each_straggler_outcome_is_reached_and_priced_by_the_simulation(name, kw, leaf, path, rank):
    v = view(**kw)
    verdict = V.evaluate(v)
    assert (verdict.bottleneck, verdict.path, verdict.straggler_rank) == (leaf, path, rank), verdict.headline
    gain = verdict.gains.of("comm_exposed")
    assert gain.basis == "simulated" and gain.speedup_bound == pytest.approx(v.straggling.gain)
    assert verdict.gain_headline().startswith(f"fixing it: {gain.speedup_bound:.1f}× faster (simulated)")
    report = build(v, verdict)
    assert report["verdict"]["gains"][[g["loss"] for g in report["verdict"]["gains"]].index("comm_exposed")][
        "basis"] == "simulated"
    text = render_text(v, verdict)
    assert "~" in text and "Parallel layout:" in text


def test_a_data_parallel_job_with_a_chronic_slow_rank_reads_as_before():
    """No layout beyond dp and no rotating imbalance: the what-if's questions pass silently, the per-rank
    comparison names the rank as it always did, and its gain is the bound, not the simulation."""
    v = view(pp=1, dp=4, steps=12, compute=lambda st, s, d: (2.0, 4.0) if d == 1 else (1.0, 2.0), layout_record=False)
    assert v.straggling is not None and v.straggling.cause == "slow_worker"
    verdict = V.evaluate(v)
    assert (verdict.bottleneck, verdict.straggler_rank) == ("load_imbalance", 1)
    assert verdict.path == ["memory", "device_busy", "data_wait", "comm_exposed", "straggler"]
    assert "worker_slow" not in verdict.evidence.get("skipped", {})
    assert verdict.gains.of("comm_exposed").basis == "bound"
    report = build(v, verdict)
    assert report["layout"]["dims"] == ["dp"] and "Parallel layout" not in render_text(v, verdict)


def test_a_job_without_operations_walks_as_before():
    """No rank sent operations (a CUDA job, an older probe): the path and the unknowns are unchanged."""
    verdict = V.evaluate(job(Rank(0, comm=0.052, exposed=0.050), Rank(1, comm=0.002, exposed=0.0)).view())
    assert verdict.path == ["memory", "device_busy", "data_wait", "comm_exposed", "straggler"]
    assert not {"worker_standout_frac", "standout_frac", "stage_work_ratio"} & set(verdict.as_json()["unknown"])


def test_pipeline_stages_are_never_compared_as_peers():
    """A balanced pipeline waits in its fill and drain: not a straggler, and the per-rank comparison does
    not apply to stages that do different work by design, so it is communication."""
    v = view(pp=2, dp=1, steps=6, compute=lambda st, s, d: (1.0, 2.0) if s == 0 else (1.05, 2.1))
    verdict = V.evaluate(v)
    assert verdict.bottleneck == "communication" and verdict.straggler_rank is None
    assert verdict.answers["straggler"].applies is False


def test_a_replay_judges_each_window_it_is_asked_about_not_an_earlier_one():
    """``perfmon report`` judges a recording at several instants with no live clock: the analysis of
    an early instant (one rank's operations yet) must not stand for the final window."""
    from perfmon_analysis.runmodel import RunModel
    from tests.helpers.ops_jobs import records

    recs = sorted(records(pp=2, dp=2, steps=8, compute=lambda st, s, d: (3.0, 6.0) if s == 1 else (1.0, 2.0)),
                  key=lambda rr: (rr[0] != 0, rr[1]["t"]))        # rank 0's whole recording first
    model = RunModel()
    first = next(i for i, (rank, _) in enumerate(recs) if rank == 1)
    for rank, rec in recs[:first]:
        model.ingest(f"r{rank}", rec)
    assert model.view().straggling.why == "fewer than two ranks sent their operations"
    for rank, rec in recs[first:]:
        model.ingest(f"r{rank}", rec)
    assert model.view().straggling.cause == "slow_stage"


# each straggler outcome's words, golden, over the jobs above
WORDS = {
    "slow_worker": (
        "Slow worker: dp2 pp1, rank 6, is slower than its stage's peers on 100% of steps; every other worker waits "
        "for it (56% of the step exposed); without it: 1.8× (simulated)",
        ["replace or drain the node of rank 6 (h): a worker slow on most steps is its host or hardware (throttling, a "
         "failing device, another process)",
         "check that node: clocks and throttle reasons, ECC and link errors, other processes on its cores",
         "restart the job without that node (elastic training: exclude it) until it is fixed"]),
    "slow_stage": (
        "Slow stage: pipeline stage 1 does the most work (36s of compute a step, 92%); the other stages wait for it; "
        "balancing the stages: 1.3× (simulated)",
        ["move layers out of stage 1 into its neighbours (the pipeline's split points)",
         "the last stage also computes the loss and the output layer, the first the embedding: give them fewer "
         "layers than the middle stages",
         "more micro-batches shrink the fill and drain bubble, not an imbalance between stages"]),
    "rotating_imbalance": (
        "Rotating imbalance: on 100% of steps one worker is much slower than its peers, a different one each time "
        "(4 workers), so every step waits for one; evening the work over the replicas: 1.6× (simulated)",
        ["pack sequences so each micro-batch holds the same number of tokens",
         "bucket samples by length: each replica's batch then costs the same",
         "split batches by tokens (or by attention cost), not by sample count"]),
}


@pytest.mark.parametrize("name,kw,leaf,path,rank", LEAVES, ids=[x[0].split(":")[0] for x in LEAVES])
def test_each_straggler_outcome_names_its_cause_its_cost_and_its_fixes(name, kw, leaf, path, rank):
    verdict = V.evaluate(view(**kw))
    assert (verdict.headline, verdict.suggestions) == WORDS[leaf]
