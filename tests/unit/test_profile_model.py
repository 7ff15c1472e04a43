"""The module profile as the viewer reads it (perfmon_analysis.profile): shares, rates, the marked row,
the cost measured from the rank's own steps, and the text every surface prints."""

from __future__ import annotations

import pytest

from perfmon_analysis.profile import MARK_MIN_SHARE, profile_lines, profile_reading, window_cost, with_overhead
from perfmon_analysis.runmodel import RunModel
from tests.helpers import records as R


def _module(name, depth, fwd_s, bwd_s, flops=None, fwd_flops=None, type_="Linear", params=100):
    row = {"name": name, "type": type_, "depth": depth, "params": params, "calls": 1.0, "fwd_s": fwd_s, "bwd_s": bwd_s}
    if flops is not None:
        row.update(flops=flops, fwd_flops=fwd_flops if fwd_flops is not None else flops / 3)
    return row


def _record(modules, step_s=0.010, peak=None, **extra):
    return {"k": "profile", "t": 100.0, "id": 7, "steps": 5, "first_step": 30, "last_step": 34, "depth": 2,
            "step_s": step_s, "timer": "perf_counter", "peak_flops": peak, "modules": modules, **extra}


# root 8 ms of a 10 ms step; "fast" and "slow" do the same FLOPs, "slow" at a quarter of the rate
MODULES = [_module("", 0, 0.003, 0.005, flops=9e9, fwd_flops=3e9, type_="Net", params=300),
           _module("fast", 1, 0.0005, 0.001, flops=3e9),
           _module("slow", 1, 0.002, 0.004, flops=3e9),
           _module("act", 1, 0.0002, 0.0002, flops=0.0, type_="ReLU", params=0),
           _module("head", 1, 0.0001, 0.0002, flops=0.3e9)]


def test_shares_and_rates_come_from_the_per_step_seconds_and_flops():
    p = profile_reading(_record(MODULES, peak=10e12), rank=3)
    rows = {r.name: r for r in p.rows}
    assert p.rank == 3 and rows["Net"].depth == 0          # the root is named by its class
    assert rows["slow"].time_share == pytest.approx(0.6)
    assert rows["slow"].flop_share == pytest.approx(1 / 3)
    assert rows["slow"].flops_per_s == pytest.approx(3e9 / 0.006)
    assert rows["slow"].peak_frac == pytest.approx(3e9 / 0.006 / 10e12)
    assert p.fwd_flops_per_s == pytest.approx(3e9 / 0.003)
    assert p.bwd_flops_per_s == pytest.approx(6e9 / 0.005)


def test_rows_are_a_tree_with_siblings_by_time():
    p = profile_reading(_record([*MODULES, _module("slow.inner", 2, 0.001, 0.001, flops=1e9)]), rank=0)
    assert [r.name for r in p.rows] == ["Net", "slow", "slow.inner", "fast", "act", "head"]


def test_the_block_that_wastes_the_most_time_is_marked_and_cited():
    p = profile_reading(_record(MODULES), rank=0)
    assert p.marked is not None and p.marked.name == "slow"
    assert [r.name for r in p.rows if r.marked] == ["slow"]
    assert p.citation() == "slow: 60% of the step at 500GFLOP/s"
    with_peak = profile_reading(_record(MODULES, peak=10e12), rank=0)
    assert with_peak.citation() == "slow: 60% of the step at 500GFLOP/s (5% of peak)"
    # what it would save at the best rate (fast's 2 TFLOP/s): 6 ms x (1 - 0.5/2)
    assert p.marked.own_waste_s == pytest.approx(0.0045)


def test_a_container_is_not_blamed_for_its_children_and_zero_flop_rows_are_no_candidates():
    modules = [_module("", 0, 0.004, 0.006, flops=6e9, type_="Net"),
               _module("layers", 1, 0.0035, 0.0055, flops=6e9, type_="ModuleList"),
               _module("layers.0", 2, 0.0005, 0.001, flops=3e9),
               _module("layers.1", 2, 0.003, 0.0045, flops=3e9),
               _module("norm", 1, 0.0003, 0.0003, flops=0.0, type_="LayerNorm")]
    p = profile_reading(_record(modules), rank=0)
    assert p.marked is not None and p.marked.name == "layers.1"


def test_nothing_is_marked_when_the_waste_is_under_the_floor_or_flops_are_unknown():
    even = [_module("", 0, 0.003, 0.005, flops=6e9, type_="Net"), _module("a", 1, 0.001, 0.002, flops=3e9),
            _module("b", 1, 0.001, 0.002 * (1 + MARK_MIN_SHARE), flops=3e9)]
    assert profile_reading(_record(even), rank=0).marked is None
    unknown = [{k: v for k, v in m.items() if k not in ("flops", "fwd_flops")} for m in MODULES]
    p = profile_reading(_record(unknown, flops_note="not counted: FullyShardedDataParallel module"), rank=0)
    assert p.marked is None and p.citation() is None
    assert all(r.flops is None and r.flops_per_s is None for r in p.rows)
    assert p.fwd_flops_per_s is None and p.flops_note.startswith("not counted")


def test_overhead_is_measured_against_the_steps_before_and_unknown_without_them():
    p = profile_reading(_record(MODULES), rank=0)
    before = [(s, 0.010) for s in range(10, 30)]
    inside = [(s, 0.012) for s in range(30, 35)]
    costed = with_overhead(p, before + inside + [(35, 0.5)])
    assert costed.overhead == pytest.approx(0.2)
    assert (costed.baseline_step_s, costed.profiled_step_s) == (pytest.approx(0.010), pytest.approx(0.012))
    assert with_overhead(p, inside).overhead is None                 # nothing before it
    assert with_overhead(p, before + inside[:4]).overhead is None    # a profiled step missing


def test_the_run_model_keeps_the_newest_profile_with_its_cost():
    model = RunModel()
    model.ingest("s", R.hello(1, t=0.0, proto=[1, 1], pid=5))
    for step in range(40):
        dur = 0.02 if 30 <= step <= 34 else 0.01
        model.ingest("s", R.step(step, start=1.0 + step * 0.01 - dur, dur=dur))
    model.ingest("s", _record(MODULES))
    view = model.view()
    assert view.profile is not None and view.profile.rank == 1
    assert view.profile.overhead == pytest.approx(1.0)
    model.ingest("s", dict(_record(MODULES[:2]), t=200.0))
    assert [r.name for r in model.view().profile.rows] == ["Net", "fast"]


def test_the_text_names_the_mark_the_cost_and_fits_80_columns():
    p = with_overhead(profile_reading(_record(MODULES, peak=10e12), rank=0), [(s, 0.01) for s in range(10, 35)])
    lines = profile_lines(p.as_json())
    assert all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    assert "Marked ▶ slow: 60% of the step at 500GFLOP/s (5% of peak)" in text
    assert "forward 1TFLOP/s, backward 1.2TFLOP/s against a 10TFLOP/s peak" in text
    assert "(+0%)" in text
    assert next(line for line in lines if line.startswith("▶")).split()[1] == "slow"
    assert profile_lines(p.as_json(), top=2)[-1].strip().startswith("(3 more modules")


def test_a_failed_profile_says_why_and_nothing_else():
    p = profile_reading(_record([], error="profile failed: RuntimeError('x')"), rank=0)
    assert profile_lines(p.as_json()) == ["Profile failed: profile failed: RuntimeError('x')"]


def test_the_compute_efficiency_verdict_cites_the_marked_module():
    from dataclasses import replace

    from perfmon_analysis.verdict import evaluate
    from tests.unit.test_verdict_explain import VIEWS

    view = replace(VIEWS["compute_efficiency_mfu"](), profile=profile_reading(_record(MODULES), rank=0))
    v = evaluate(view)
    assert v.bottleneck == "compute_efficiency"
    assert v.headline.endswith("; slowest for its FLOPs: slow: 60% of the step at 500GFLOP/s")
    assert v.suggestions[0].startswith("start with slow (Linear): ")
    assert not any(s.startswith("`perfmon profile`") for s in v.suggestions)


def test_a_container_its_parent_never_calls_sums_its_children():
    """``nn.ModuleList``: the parent calls its blocks directly, so the list itself has no time."""
    modules = [_module("", 0, 0.004, 0.006, flops=6.3e9, type_="GPT"),
               _module("h", 1, 0.0, 0.0, flops=0.0, type_="ModuleList"),
               _module("h.0", 2, 0.001, 0.002, flops=3e9),
               _module("h.1", 2, 0.002, 0.004, flops=3e9),
               _module("head", 1, 0.0002, 0.0004, flops=0.3e9)]
    modules[1]["calls"] = 0.0
    rows = {r.name: r for r in profile_reading(_record(modules), rank=0).rows}
    assert (rows["h"].fwd_s, rows["h"].bwd_s, rows["h"].flops) == (pytest.approx(0.003), pytest.approx(0.006), 6e9)
    assert rows["h"].time_share == pytest.approx(0.9)
    assert [r.name for r in profile_reading(_record(modules), rank=0).rows if r.marked] == ["h.1"]


# a profile with every part: a peak, a cost, a note, a nested module, more rows than shown
GOLDEN_JSON = {'rank': 2,
 'steps': 5,
 'first_step': 30,
 'last_step': 34,
 'depth': 2,
 'step_s': 0.01,
 'timer': 'perf_counter',
 'fwd_flops_per_s': 1000000000000.0,
 'bwd_flops_per_s': 1200000000000.0,
 'peak_flops': 10000000000000.0,
 'peak_source': 'table',
 'overhead': 0.25,
 'baseline_step_s': 0.01,
 'profiled_step_s': 0.0125,
 'train_per_step_s': 0.0025,
 'thread_cpu_s': None,
 'marked': 'slow',
 'flops_note': 'note',
 'error': None,
 'truncated': True,
 'modules': [{'name': 'Net',
              'type': 'Net',
              'depth': 0,
              'params': 300,
              'calls': 1.0,
              'flops': 9000000000.0,
              'fwd_s': 0.003,
              'bwd_s': 0.005,
              'time_share': 0.8,
              'flop_share': 1.0,
              'flops_per_s': 1125000000000.0,
              'peak_frac': 0.1125,
              'marked': False},
             {'name': 'slow',
              'type': 'Linear',
              'depth': 1,
              'params': 100,
              'calls': 1.0,
              'flops': 3000000000.0,
              'fwd_s': 0.002,
              'bwd_s': 0.004,
              'time_share': 0.6,
              'flop_share': 0.333333,
              'flops_per_s': 500000000000.0,
              'peak_frac': 0.05,
              'marked': True},
             {'name': 'slow.inner',
              'type': 'Linear',
              'depth': 2,
              'params': 100,
              'calls': 1.0,
              'flops': 1000000000.0,
              'fwd_s': 0.001,
              'bwd_s': 0.001,
              'time_share': 0.2,
              'flop_share': 0.111111,
              'flops_per_s': 500000000000.0,
              'peak_frac': 0.05,
              'marked': False},
             {'name': 'fast',
              'type': 'Linear',
              'depth': 1,
              'params': 100,
              'calls': 1.0,
              'flops': 3000000000.0,
              'fwd_s': 0.0005,
              'bwd_s': 0.001,
              'time_share': 0.15,
              'flop_share': 0.333333,
              'flops_per_s': 2000000000000.0,
              'peak_frac': 0.2,
              'marked': False},
             {'name': 'act',
              'type': 'ReLU',
              'depth': 1,
              'params': 0,
              'calls': 1.0,
              'flops': 0.0,
              'fwd_s': 0.0002,
              'bwd_s': 0.0002,
              'time_share': 0.04,
              'flop_share': 0.0,
              'flops_per_s': 0.0,
              'peak_frac': 0.0,
              'marked': False},
             {'name': 'head',
              'type': 'Linear',
              'depth': 1,
              'params': 100,
              'calls': 1.0,
              'flops': 300000000.0,
              'fwd_s': 0.0001,
              'bwd_s': 0.0002,
              'time_share': 0.03,
              'flop_share': 0.033333,
              'flops_per_s': 999999999999.9999,
              'peak_frac': 0.1,
              'marked': False}]}
GOLDEN_LINES = ['Module profile of rank 2, steps 30-34 (5 steps, 10ms each while profiled, timer',
 '  perf_counter)',
 'forward 1TFLOP/s, backward 1.2TFLOP/s against a 10TFLOP/s peak (table)',
 'Cost: profiled steps took 12.5ms against 10ms before (+25%); steps outside the',
 '  profile run no hook',
 'FLOPs: note',
 'Marked ▶ slow: 60% of the step at 500GFLOP/s (5% of peak)',
 '',
 '  MODULE                PARAMS   FLOPS %FLOP     FWD     BWD %STEP  FLOP/S %PEAK',
 '  Net                      300      9G  100%     3ms     5ms   80%   1.12T   11%',
 '▶   slow                   100      3G   33%     2ms     4ms   60%    500G    5%',
 '      inner                100      1G   11%     1ms     1ms   20%    500G    5%',
 '    fast                   100      3G   33%   500µs     1ms   15%      2T   20%',
 '  (2 more modules; --top N shows more, --json all)',
 '  (the profile was truncated: too many modules or calls to time them all)']


def test_the_profile_json_and_text_carry_every_number_as_computed():
    """Golden values, each checked by hand once: Net 9 GFLOP in 8 ms of a 10 ms step; slow's own part
    is 4 ms for 2 GFLOP (inner does the rest), the least efficient against fast's 2 TFLOP/s."""
    modules = MODULES + [_module("slow.inner", 2, 0.001, 0.001, flops=1e9)]
    p = with_overhead(profile_reading(_record(modules, peak=10e12, peak_source="table", flops_note="note",
                                              truncated=True), rank=2),
                      [(s, 0.01) for s in range(10, 30)] + [(s, 0.0125) for s in range(30, 35)])
    assert p.as_json() == GOLDEN_JSON
    assert profile_lines(p.as_json(), top=4) == GOLDEN_LINES


def test_odd_values_in_a_profile_record_are_unknown_never_guessed():
    odd = [{"name": "", "type": "Net", "depth": 0, "params": True, "calls": 1.0, "fwd_s": "3", "bwd_s": 0.005,
            "flops": -5.0, "fwd_flops": None},
           {"name": "a", "type": 7, "depth": "1", "params": 10, "calls": -1, "fwd_s": 0.001, "bwd_s": 0.002,
            "flops": 1e9, "fwd_flops": 3e8}, {"name": 5}, "junk"]
    p = profile_reading({"k": "profile", "t": True, "steps": "5", "first_step": 1.5, "last_step": None,
                         "depth": None, "step_s": -1.0, "timer": "", "peak_flops": 0, "modules": odd}, rank=1)
    root, a = p.rows
    assert (p.t, p.steps, p.first_step, p.depth, p.step_s, p.timer, p.peak_flops) == (0.0, 0, None, 0, None, None, None)
    assert (root.name, root.params, root.calls, root.fwd_s, root.flops, root.seconds) == \
        ("Net", 0, 1.0, None, None, None)
    assert (a.type, a.depth, a.params, a.calls, a.time_share, a.peak_frac, a.flop_share) == \
        ("?", 0, 10, 0.0, None, None, None)
    assert a.flops_per_s == 1e9 / 0.003 and p.fwd_flops_per_s is None and p.bwd_flops_per_s is None
    assert p.marked is None and p.citation() is None and not p.truncated


def test_nested_uncalled_containers_sum_bottom_up_and_the_top_rows_keep_their_ancestors():
    """``blocks`` (a ModuleList) holds ``blocks.0`` (another one, never called either) whose layers run."""
    modules = [_module("", 0, 0.004, 0.006, flops=7e9, type_="Net"),
               _module("blocks", 1, 0.0, 0.0, flops=0.0, type_="ModuleList"),
               _module("blocks.0", 2, 0.0, 0.0, flops=0.0, type_="ModuleList"),
               _module("blocks.0.x", 3, 0.001, 0.002, flops=3e9),
               _module("blocks.0.y", 3, 0.002, 0.003, flops=3e9),
               _module("head", 1, 0.0005, 0.0005, flops=1e9)]
    for m in modules[1:3]:
        m["calls"] = 0.0
    rows = {r.name: r for r in profile_reading(_record(modules), rank=0).rows}
    assert (rows["blocks.0"].fwd_s, rows["blocks.0"].bwd_s, rows["blocks.0"].flops) == \
        (pytest.approx(0.003), pytest.approx(0.005), 6e9)
    assert (rows["blocks"].fwd_s, rows["blocks"].flops, rows["blocks"].time_share) == \
        (pytest.approx(0.003), 6e9, pytest.approx(0.8))
    p = profile_reading(_record(modules), rank=0)
    lines = profile_lines(p.as_json(), top=4)
    table = lines[lines.index(next(line for line in lines if line.startswith("  MODULE"))) + 1:]
    top = [line[2:].split()[0] for line in table if not line.startswith("  (")]
    assert top == ["Net", "blocks", "0", "y"]          # the four with the most time, in tree order
    assert table[-1] == "  (2 more modules; --top N shows more, --json all)"


def test_the_top_rows_count_forward_and_backward_time_together():
    modules = [_module("", 0, 0.006, 0.004, flops=2e9, type_="Net"), _module("a", 1, 0.005, 0.001, flops=1e9),
               _module("b", 1, 0.001, 0.003, flops=1e9), _module("c", 1, 0.0, 0.0035, flops=0.0)]
    p = profile_reading(_record(modules), rank=0).as_json()

    def names(top):
        lines = profile_lines(p, top=top)
        table = lines[lines.index(next(line for line in lines if line.startswith("  MODULE"))) + 1:]
        return [line[2:].split()[0] for line in table if not line.startswith("  (")]

    assert names(2) == ["Net", "a"]
    assert names(3) == ["Net", "a", "b"]
    assert names(None) == names(4) == ["Net", "a", "b", "c"]


def test_the_text_without_a_peak_says_how_to_give_one_and_names_the_profiles_own_cpu():
    modules = MODULES + [_module("slow.a_rather_long_block_name", 2, 0.001, 0.001, flops=1e9)]
    p = with_overhead(profile_reading(_record(modules, cost={"thread_cpu_s": 0.042}), rank=1),
                      [(s, 0.01) for s in range(10, 30)] + [(s, 0.0125) for s in range(30, 35)])
    assert p.thread_cpu_s == 0.042 and p.as_json()["thread_cpu_s"] == 0.042
    assert profile_lines(p.as_json(), top=None) == [      # every module, so no "more modules" line
        "Module profile of rank 1, steps 30-34 (5 steps, 10ms each while profiled, timer",
        "  perf_counter)",
        "forward 1TFLOP/s, backward 1.2TFLOP/s, no peak known (PERFMON_PEAK_TFLOPS gives",
        "  one)",
        "Cost: profiled steps took 12.5ms against 10ms before (+25%); steps outside the",
        "  profile run no hook; its own thread used 42ms CPU",
        "Marked ▶ slow: 60% of the step at 500GFLOP/s",
        "",
        "  MODULE                PARAMS   FLOPS %FLOP     FWD     BWD %STEP  FLOP/S %PEAK",
        "  Net                      300      9G  100%     3ms     5ms   80%   1.12T   n/a",
        "▶   slow                   100      3G   33%     2ms     4ms   60%    500G   n/a",
        "      a_rather_long_blo    100      1G   11%     1ms     1ms   20%    500G   n/a",
        "    fast                   100      3G   33%   500µs     1ms   15%      2T   n/a",
        "    act                      0       0    0%   200µs   200µs    4%       0   n/a",
        "    head                   100    300M    3%   100µs   200µs    3%      1T   n/a",
    ]


def test_the_citation_gives_the_marked_rows_share_of_peak():
    p = profile_reading(_record(MODULES, peak=5e11 / 0.6), rank=0)      # slow runs at 500 GFLOP/s
    assert p.citation() == "slow: 60% of the step at 500GFLOP/s (60% of peak)"


def test_the_baseline_reaches_back_exactly_twenty_steps_and_a_zero_baseline_has_no_overhead():
    inside = [(s, 0.03) for s in range(30, 35)]
    # step 10 is the 20th before step 30: the median before is of 10 ms and 30 ms
    assert window_cost(30, 34, [(9, 1.0), (10, 0.01), (29, 0.03)] + inside) == (pytest.approx(0.5), 0.02, 0.03)
    assert window_cost(30, 34, [(29, 0.0)] + inside) == (None, 0.0, 0.03)
    assert window_cost(None, 34, inside) is None and window_cost(30, None, inside) is None
