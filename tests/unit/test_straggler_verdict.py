"""The verdict's straggler outcomes (perfmon_analysis.straggler_verdict): reached from the what-if over
synthetic jobs' operations (tests/helpers/ops_jobs.py), priced by the simulation, and a data-parallel
job that has none of them reading as before they existed."""

from __future__ import annotations

import dataclasses

import pytest

from perfmon_analysis import verdict as V
from perfmon_analysis.report import build, render_text
from perfmon_analysis.stragglers import StageTime, Straggling
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


# -- the questions' answers, the outcomes' evidence, and the words of each branch ----------------------
SKIPPED = {"memory": "memory limit or peak not reported",
           "data_wait": "loader wait not measured (wrap the loader: mon.loader(...))"}
# leaf -> (each question's (answer, value, reason, decided_by, applies, silent), the verdict's whole evidence)
JUDGED = {
    "slow_worker": (
        {"worker_slow": ("yes", 1.0, "over 5 steps", "", True, False),
         "rotating": ("no", 1.0, "1 worker(s) stood out", "the what-if names slow worker first", True, False),
         "stage_heavy": ("no", 1.0, "", "", True, False)},
        {"device_busy": 0.4444, "notes": {"device_busy": "step_accounting", "worker_slow": "over 5 steps"},
         "comm_exposed_frac": 0.5556, "worker_standout_frac": 1.0, "skipped": SKIPPED, "step_time_median_s": 27.0,
         "data_wait_frac": None, "straggler_rank": 6, "worker": "dp2 pp1", "slowdown": 1.6222, "gain": 1.8}),
    "slow_stage": (
        {"worker_slow": ("no", 0.0, "over 5 steps", "", True, False),
         "rotating": ("no", 0.0, "0 worker(s) stood out", "", True, False),
         "stage_heavy": ("yes", 1.5, "", "", True, False)},
        {"device_busy": 0.3077, "notes": {"device_busy": "step_accounting", "worker_slow": "over 5 steps",
                                          "rotating": "0 worker(s) stood out"},
         "comm_exposed_frac": 0.6923, "worker_standout_frac": 0.0, "standout_frac": 0.0, "stage_work_ratio": 1.5,
         "skipped": SKIPPED, "step_time_median_s": 39.0, "data_wait_frac": None, "stage": 1, "slowdown": 1.4,
         "gain": 1.3}),
    "rotating_imbalance": (
        {"worker_slow": (None, None, "a data-parallel job: a chronic slow rank is the per-rank comparison's", "",
                         False, True),
         "rotating": ("yes", 1.0, "4 worker(s) stood out", "", True, False),
         "stage_heavy": (None, None, "a data-parallel job: a chronic slow rank is the per-rank comparison's", "",
                         False, True)},
        {"device_busy": 0.6, "notes": {"device_busy": "step_accounting", "rotating": "4 worker(s) stood out"},
         "comm_exposed_frac": 0.4, "standout_frac": 1.0, "skipped": SKIPPED, "step_time_median_s": 24.0,
         "data_wait_frac": None, "slowdown": 1.6, "gain": 1.6}),
}
QUESTION_IDS = ("worker_slow", "rotating", "stage_heavy")


def _answers(verdict: V.Verdict) -> dict[str, tuple]:
    return {q: (a.answer, a.value, a.reason, a.decided_by, a.applies, a.silent)
            for q, a in verdict.answers.items() if q in QUESTION_IDS}


@pytest.mark.parametrize("name,kw,leaf,path,rank", LEAVES, ids=[x[0].split(":")[0] for x in LEAVES])
def test_each_straggler_question_answers_with_the_quantity_the_what_if_judged_and_the_evidence_is_whole(
        name, kw, leaf, path, rank):
    verdict = V.evaluate(view(**kw))
    assert (_answers(verdict), verdict.evidence) == JUDGED[leaf]


def _stage_job(**changes):
    """The slow-stage job (LEAVES[1]) with its analysis changed (``Straggling`` fields)."""
    v = view(**LEAVES[1][1])
    return dataclasses.replace(v, straggling=dataclasses.replace(v.straggling, **changes))


NO_OPS = ("no rank sent its operations (wire 1.5; CUDA jobs: not timed on the device yet): stragglers not "
          "simulated")
SILENCED = [
    # (name, view, each question's (answer, value, reason, decided_by, applies, silent), the path)
    ("no operations", lambda: job(Rank(0, comm=0.052, exposed=0.050), Rank(1, comm=0.002, exposed=0.0)).view(),
     {q: (None, None, NO_OPS, "", False, True) for q in QUESTION_IDS},
     ["memory", "device_busy", "data_wait", "comm_exposed", "straggler"]),
    ("too few steps", lambda: _stage_job(why="fewer than 3 steps with every rank's operations"),
     {q: (None, None, "fewer than 3 steps with every rank's operations", "", True, False) for q in QUESTION_IDS},
     ["memory", "device_busy", "data_wait", "comm_exposed", "worker_slow", "straggler"]),
    ("one replica", lambda: _stage_job(replicas=1),
     {"worker_slow": (None, None, "one replica: a worker has no peers doing the same work", "", False, True),
      "rotating": (None, None, "one replica: no peers to take turns with", "", False, True),
      "stage_heavy": ("yes", 1.5, "", "", True, False)},
     ["memory", "device_busy", "data_wait", "comm_exposed", "stage_heavy"]),
    ("one stage", lambda: _stage_job(stages_seen=1),
     {"worker_slow": ("no", 0.0, "over 5 steps", "", True, False),
      "rotating": ("no", 0.0, "0 worker(s) stood out", "", True, False),
      "stage_heavy": (None, None, "one stage: no pipeline", "", False, True)},
     ["memory", "device_busy", "data_wait", "comm_exposed", "worker_slow", "rotating", "straggler"]),
    ("nothing named although one worker stands out on most steps", lambda: _stage_job(cause=None, top_share=0.6),
     {"worker_slow": ("no", 0.6, "over 5 steps",
                      "it would cost under 1.05×, or another worker stands out as often", True, False),
      "rotating": ("no", 0.0, "0 worker(s) stood out", "", True, False),
      "stage_heavy": ("no", 1.5, "", "it would cost under 1.05×, or another worker stands out as often", True,
                      False)},
     ["memory", "device_busy", "data_wait", "comm_exposed", "worker_slow", "rotating", "stage_heavy", "straggler"]),
    ("quantities unknown", lambda: dataclasses.replace(view(**LEAVES[1][1]), straggling=Straggling(
        cause=None, steps=5, replicas=2, stages_seen=2)),
     {"worker_slow": ("no", None, "over 5 steps", "", True, False),
      "rotating": ("no", 0.0, "0 worker(s) stood out", "", True, False),
      "stage_heavy": ("no", None, "", "", True, False)},
     ["memory", "device_busy", "data_wait", "comm_exposed", "worker_slow", "rotating", "stage_heavy", "straggler"]),
]


@pytest.mark.parametrize("name,make,answers,path", SILENCED, ids=[x[0] for x in SILENCED])
def test_a_straggler_question_with_nothing_to_ask_passes_silently_or_says_what_decided(name, make, answers, path):
    verdict = V.evaluate(make())
    assert (_answers(verdict), verdict.path) == (answers, path)


def test_a_slow_workers_fix_names_its_own_node_and_none_when_its_host_is_unknown():
    v = view(**LEAVES[0][1])
    named = V.evaluate(dataclasses.replace(v, ranks=[dataclasses.replace(r, host=f"node{r.rank}") for r in v.ranks]))
    assert (named.suggestions[0], named.straggler_host) == (
        "replace or drain the node of rank 6 (node6): a worker slow on most steps is its host or hardware "
        "(throttling, a failing device, another process)", "node6")
    unknown = V.evaluate(dataclasses.replace(v, ranks=[dataclasses.replace(r, host=None) for r in v.ranks],
                                             straggling=dataclasses.replace(v.straggling, gain=None)))
    assert (unknown.headline, unknown.suggestions[0], unknown.evidence["gain"]) == (
        "Slow worker: dp2 pp1, rank 6, is slower than its stage's peers on 100% of steps; every other worker waits "
        "for it (56% of the step exposed); without it: not shown by the simulation",
        "replace or drain the node of rank 6: a worker slow on most steps is its host or hardware (throttling, a "
        "failing device, another process)", None)


def test_a_slow_stage_says_how_long_the_other_stages_wait_and_without_stage_times_only_what_is_known():
    waits = V.evaluate(_stage_job(stages=(StageTime(0, 12.0, 3.0, 0.3, 0.25), StageTime(1, 36.0, 0.5, 0.9, 0.0125))))
    assert waits.headline == ("Slow stage: pipeline stage 1 does the most work (36s of compute a step, 90%); the other "
                              "stages wait for it, up to 25% of their step; balancing the stages: 1.3× (simulated)")
    bare = V.evaluate(_stage_job(stages=(), gain=None))
    assert (bare.headline, bare.evidence["gain"]) == (
        "Slow stage: pipeline stage 1 does the most work; the other stages wait for it; balancing the stages: not "
        "shown by the simulation", None)


def test_a_rotating_imbalance_in_a_pipeline_names_the_stage_that_costs_the_most():
    v = view(**LEAVES[2][1])
    verdict = V.evaluate(dataclasses.replace(v, straggling=dataclasses.replace(v.straggling, stage=1, gain=None)))
    assert (verdict.headline, verdict.evidence["slowdown"], verdict.evidence["gain"]) == (
        "Rotating imbalance: on 100% of steps one worker is much slower than its peers, a different one each time "
        "(4 workers), so every step waits for one; stage 1 costs the most; evening the work over the replicas: not "
        "shown by the simulation", 1.6, None)
