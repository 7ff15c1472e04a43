"""The report's "Parallel layout" section and each rank's place (perfmon_analysis.layout_report), from
the report's JSON: golden text for each straggler cause and for none."""

from __future__ import annotations

from perfmon_analysis.layout import world_layout
from perfmon_analysis.layout_report import layout_lines, rank_note, rank_place

DP = {"dims": ["dp"], "sizes": [4], "source": "world size"}
PP = {"dims": ["pp", "dp"], "sizes": [2, 2], "source": "PERFMON_LAYOUT"}
HEAD = ["", "Parallel layout: pp2 x dp2 (from the PERFMON_LAYOUT)"]


def test_a_data_parallel_job_has_no_section_unless_its_verdict_names_a_straggler():
    assert layout_lines(DP, None, "healthy") == [] and layout_lines({}, None, "data_loading") == []
    assert layout_lines(DP, None, "slow_worker") == [
        "", "Parallel layout: dp4 (from the world size)", "  no rank sent its operations: stragglers not analysed"]
    assert layout_lines(PP, {"why": "too few steps"}, "healthy") == [*HEAD, "  stragglers not analysed: too few steps"]


def test_a_slow_stage_is_named_with_each_stages_compute_bubble_and_what_it_alone_costs():
    stage = {"cause": "slow_stage", "stage": 1, "slowdown": 1.5, "gain": 1.4, "standout_steps": 12, "steps": 40,
             "stages": [{"stage": 0, "compute_s": 0.05, "compute_frac": 0.5, "bubble_s": 0.03, "bubble_frac": 0.3},
                        {"stage": 1, "compute_s": 0.08, "compute_frac": 0.8, "bubble_s": 0.01, "bubble_frac": 0.1}],
             "by_stage": {"1": 1.45}}
    assert layout_lines(PP, stage, "slow_stage") == [
        *HEAD,
        "  slow stage: stage 1; costs 1.5× over a job without stragglers, removing it",
        "    buys 1.4× (12 of 40 steps had one worker stand out)",
        "  stage   compute  share    bubble  share  attributed",
        "      0      50ms    50%      30ms    30%  n/a",
        "      1      80ms    80%      10ms    10%  1.4×",
        "  bubble = time a stage is blocked on its neighbours; attributed = the step with",
        "    only that stage as measured, over the all-typical step",
    ]


def test_a_slow_worker_a_rotating_imbalance_and_no_straggler_are_each_worded():
    worker = {"cause": "slow_worker", "worker": {"label": "pp0 dp1"}, "rank": 1, "slowdown": 1.3, "gain": 1.2,
              "standout_steps": 30, "steps": 40}
    assert layout_lines(PP, worker, "slow_worker") == [
        *HEAD,
        "  slow worker: worker pp0 dp1 (rank 1); costs 1.3× over a job without",
        "    stragglers, removing it buys 1.2× (30 of 40 steps had one worker stand out)"]
    rotating = {"cause": "rotating_imbalance", "stage": 0, "slowdown": 1.2, "gain": None, "standout_steps": 20,
                "steps": 40}
    assert layout_lines(PP, rotating, "rotating_imbalance") == [
        *HEAD,
        "  rotating imbalance, stage 0 the heavier; costs 1.2× over a job without",
        "    stragglers, removing it buys n/a (20 of 40 steps had one worker stand out)"]
    none = {"cause": None, "steps": 40, "whole_slowdown": 1.02, "one_off": {"rank": 3, "step": 17}}
    assert layout_lines(PP, none, "healthy") == [
        *HEAD,
        "  no straggler over 40 steps (all of them together cost 1.02×); a one-off: rank",
        "    3 at step 17, not a straggler"]
    assert layout_lines(PP, {**none, "one_off": None}, "healthy", width=100) == [
        *HEAD, "  no straggler over 40 steps (all of them together cost 1.02×)"]


def test_a_ranks_note_is_its_coordinates_and_a_data_parallel_rank_has_no_place():
    assert rank_note({"coord": {"pp": 1, "dp": 0}}) == "pp1 dp0" and rank_note({}) == ""
    assert rank_place(world_layout(4), 1) == {}
