"""The relay tree's reductions (perfmon_analysis/groups.py) and the tree end to end without
processes: node relays' summaries -> group relays (``tui.commands.relay.group.GroupRelay``) ->
the viewer's ``TreeFeed`` -> the same verdict as a model that holds every rank."""

from __future__ import annotations

import random

import pytest

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.groups import (
    MAX_ODD_STALLED,
    REPS_PER_STALL,
    GroupReduction,
    RankRow,
    Reduction,
    Sketch,
    merge_groups,
    reduce_rows,
    representatives,
)
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.sketch import SKETCH_ACCURACY
from tests.tui import scenarios


def test_a_sketch_quantile_is_within_its_accuracy_and_merging_equals_the_union():
    rng = random.Random(7)
    values = [rng.lognormvariate(-2.0, 0.6) for _ in range(5000)] + [0.0] * 50
    whole, parts = Sketch(), [Sketch() for _ in range(8)]
    for i, v in enumerate(values):
        whole.add(v)
        parts[i % 8].add(v)
    merged = Sketch()
    for p in parts:
        merged.merge(Sketch.read(p.wire()))          # through the wire form, as between relays
    ordered = sorted(values)
    for q in (0.01, 0.25, 0.5, 0.9, 0.99):
        exact = ordered[int(q * (len(values) - 1))]
        assert whole.quantile(q) == pytest.approx(exact, rel=SKETCH_ACCURACY * 1.01, abs=1e-9)
        assert merged.quantile(q) == whole.quantile(q)
    assert merged.count == len(values) and Sketch().quantile(0.5) is None


def test_malformed_sketches_and_reductions_read_as_nothing_rather_than_raise():
    assert Sketch.read({"z": -1, "b": [1, "x", 2]}).count == 0
    assert Sketch.read("junk").count == 0
    red = Reduction.read({"n": "3", "min": float("nan"), "max": 2.0, "max_rank": True})
    assert (red.n, red.min, red.max, red.max_rank) == (0, None, 2.0, None)
    assert GroupReduction.read({"key": ["group"]}) is None


def _row(rank: int, step: float, **kw) -> RankRow:
    stats = {"warming_up": False, "step_median": step, "compute_median": step * 0.6, "samples_per_s": 10.0}
    return RankRow(src=f"n{rank // 8}/job.r{rank}", rank=rank, stats=stats, **kw)


def test_a_group_reduction_keeps_each_extreme_with_its_rank_and_merges_into_the_job():
    g1 = reduce_rows([_row(r, 0.101 + 0.001 * r) for r in range(8)], "n0", 10.0)[0]
    g2 = reduce_rows([_row(r, 0.2 if r == 13 else 0.1) for r in range(8, 16)], "n1", 10.0)[0]
    g2 = GroupReduction.read(g2.wire())                 # the viewer reads it off the wire
    job = merge_groups([g1, g2])[("job", "")]
    step = job.quantities["step_time"]
    assert (job.ranks, job.timed, job.sums["samples_per_s"]) == (16, 16, 160.0)
    assert (step.min, step.min_rank, step.max, step.max_rank, step.max_src) == (0.1, 8, 0.2, 13, "n1/job.r13")
    assert step.median == pytest.approx(0.101, rel=SKETCH_ACCURACY)      # the 8th of 16, sorted
    assert all(step.min <= step.quantile(q) <= step.max for q in (0.0, 0.5, 1.0))


def test_representatives_are_the_extremes_and_the_odd_stalled_ranks_bounded_whatever_the_group():
    rows = [_row(r, 0.1 + (0.05 if r == 700 else 0.0), stalled=True, call=("world", 20)) for r in range(1000)]
    rows[3] = _row(3, 0.1, stalled=True, call=None)                   # never reached the collective
    reds = reduce_rows(rows, "g", 10.0)
    reps = representatives(rows, reds, set(), 10.0)
    assert "n0/job.r3" in reps and "n87/job.r700" in reps          # the culprit and the slowest
    assert len(reps) <= 2 * 7 + MAX_ODD_STALLED + REPS_PER_STALL
    assert reds[0].stalled == 1000


def test_an_incumbent_representative_stays_while_within_a_hair_of_the_extreme():
    rows = [_row(r, 0.100 + 0.0001 * (r == 5)) for r in range(8)]
    first = representatives(rows, reduce_rows(rows, "g", 10.0), set(), 10.0)
    assert first == {"n0/job.r0", "n0/job.r5"}          # the fastest (first of the equal ones) and the slowest
    rows2 = [_row(r, 0.100 + 0.0001 * (r == 6)) for r in range(8)]     # rank 6 now a hair (0.1%) slower
    assert representatives(rows2, reduce_rows(rows2, "g", 10.0), first, 10.0) <= first    # no churn: rank 6 not sent
    rows3 = [_row(r, 0.100 + 0.01 * (r == 6)) for r in range(8)]       # rank 6 now 10% slower: it is sent
    assert representatives(rows3, reduce_rows(rows3, "g", 10.0), first, 10.0) == {"n0/job.r0", "n0/job.r6"}


class _Out:
    def __init__(self) -> None:
        self.records: list[dict] = []
        self.broken = False

    def send(self, rec: dict) -> None:
        self.records.append(rec)


def _through_tree(records: dict[int, list[dict]], per_node: int, nodes_per_group: int):
    """The job's records read by node relays (a model per node, summarised), two group relays
    and a viewer's ``TreeFeed``: the viewer's model."""
    from tui.commands.relay.group import GroupRelay
    from tui.stream.feed import StreamStatus
    from tui.stream.tree import TreeFeed, plan_groups

    nodes: dict[str, RunModel] = {}
    for rank, recs in records.items():
        node = f"n{rank // per_node + 1:02d}"
        model = nodes.setdefault(node, RunModel())
        for rec in recs:
            model.ingest(f"job.r{rank}", rec)
    plan = plan_groups(sorted(nodes), nodes_per_group)
    viewer = TreeFeed(Analysis(), "job", plan, "via {host}")
    for name, members in plan:
        group = GroupRelay("job", name, members, "via {host}", ("perfmon", "relay", "--stdio"), None, None)
        group.out = _Out()
        for node in members:
            model = nodes[node]
            for sid in list(model._streams):
                state = model._streams[sid]
                group.take(f"{node}/{sid}", {**state.hello, "host": node})
                group.take(f"{node}/{sid}", model.summary(sid, state.last_t)[1])
        group.tick()
        status, srcs = StreamStatus(name, name), {}
        for rec in group.out.records:
            viewer.streams.setdefault(name, status)
            viewer._take(name, status, rec, srcs)
    return viewer


def test_a_job_through_group_relays_gets_the_verdict_of_every_rank_from_a_few_of_them():
    records = scenarios.many_nodes(nodes=8, per_node=8, slow_rank=37)
    full = Analysis.of_records((f"r{rank}", recs) for rank, recs in records.items())
    expected, want = full.view(), full.judge(full.view())
    feed = _through_tree(records, 8, 4)
    tree = feed.analysis
    view = tree.view()
    got = tree.judge(view)
    assert len(view.ranks) < 32 and 37 in {r.rank for r in view.ranks}     # the worst ranks, not all 64
    assert (got.bottleneck, got.straggler_rank) == (want.bottleneck, want.straggler_rank) == ("load_imbalance", 37)
    job = next(g for g in view.groups if g.key == ("job", ""))
    assert job.ranks == 64 and view.world_size == 64
    for name in ("step_time_median_s", "comm_exposed_frac", "device_busy", "compute_ratio"):
        assert getattr(view.metrics, name) == pytest.approx(getattr(expected.metrics, name), rel=1e-6), name
    assert view.metrics.samples_per_s == pytest.approx(expected.metrics.samples_per_s, rel=1e-6)
    assert {r.host for r in view.ranks if r.rank == 37} == {"n05"}


def test_the_viewer_drops_a_rank_its_group_relay_no_longer_sends_on():
    records = scenarios.many_nodes(nodes=2, per_node=4, slow_rank=5)
    feed = _through_tree(records, 4, 2)
    shown = {r.stream for r in feed.analysis.view().ranks}
    extra = sorted(shown)[0]
    feed._other("n01", {"k": "group", "t": 0.0, "key": ["group", "n01"], "ranks": 8,
                        "reps": sorted(shown - {extra})})
    assert extra not in {r.stream for r in feed.analysis.view().ranks}
    assert feed.analysis.view().world_size == 8


def _reduction(*values_ranks: tuple[float, int]) -> Reduction:
    red = Reduction()
    for value, rank in values_ranks:
        red.add(value, rank, f"n/job.r{rank}")
    return red


def test_a_reduction_keeps_the_first_holder_of_a_tied_extreme_and_merges_only_strictly_better_ones():
    red = _reduction((0.2, 4), (0.1, 1), (0.2, 7), (0.1, 9))
    assert (red.n, red.min, red.min_rank, red.max, red.max_rank) == (4, 0.1, 1, 0.2, 4)
    red.merge(_reduction((0.1, 20), (0.2, 21)))                   # ties: the holders stay
    assert (red.n, red.min_rank, red.min_src, red.max_rank, red.max_src) == (6, 1, "n/job.r1", 4, "n/job.r4")
    red.merge(_reduction((0.05, 30), (0.3, 31)))
    assert (red.min, red.min_rank, red.min_src, red.max, red.max_rank, red.max_src) == \
        (0.05, 30, "n/job.r30", 0.3, 31, "n/job.r31")
    red.merge(Reduction())                                          # an empty one changes nothing but nothing
    assert (red.n, red.min, red.max) == (8, 0.05, 0.3)
    empty = Reduction()
    empty.merge(red)
    assert (empty.n, empty.min_rank, empty.max_rank) == (8, 30, 31)


def test_a_quantile_is_held_within_the_exact_extremes_and_an_empty_one_is_unknown():
    red = _reduction(*((0.1 + 0.001 * i, i) for i in range(100)))
    assert red.quantile(0.0) == 0.1 and red.quantile(1.0) == pytest.approx(0.199)
    assert red.quantile(1.0) <= red.max and red.quantile(0.0) >= red.min
    assert Reduction().quantile(0.5) is None and Reduction().median is None


def test_a_reduction_and_a_group_survive_the_wire_and_bad_fields_read_as_unknown():
    red = _reduction((0.25, 3), (0.5, 6))
    back = Reduction.read(red.wire())
    assert (back.n, back.min, back.min_rank, back.min_src, back.max, back.max_rank, back.max_src) == \
        (2, 0.25, 3, "n/job.r3", 0.5, 6, "n/job.r6")
    assert back.sketch.count == 2
    odd = Reduction.read({"n": True, "min": 1, "min_rank": 2.0, "min_src": 5, "max": None, "max_rank": 4,
                          "max_src": "x"})
    assert (odd.n, odd.min, odd.min_rank, odd.min_src, odd.max, odd.max_rank, odd.max_src) == \
        (0, 1.0, None, None, None, None, None)
    assert Reduction.read([1, 2]).n == 0
    unknown_min = Reduction.read({"n": 1, "min": "x", "min_rank": 3, "min_src": "s", "max": 0.5, "max_rank": 3})
    assert (unknown_min.min, unknown_min.min_rank, unknown_min.min_src, unknown_min.max_rank) == (None, None, None, 3)
    unknown_max = Reduction.read({"n": 2, "min": 0.1, "max": None, "sketch": red.sketch.wire()})
    assert unknown_max.quantile(0.5) == red.sketch.quantile(0.5)      # no max to hold it within: the sketch's
    no_sketch = Reduction.read({"n": 1, "min": 0.1, "max": 0.2})
    assert no_sketch.quantile(0.5) is None
    group = GroupReduction(("stage", "2"), ranks=8, timed=7, stalled=1, silent=2, steps=40,
                           sums={"samples_per_s": 80.0, "tokens_per_s": 800.0}, quantities={"compute": red},
                           relays_down=("n03",))
    again = GroupReduction.read(group.wire())
    assert again is not None
    assert (again.key, again.ranks, again.timed, again.stalled, again.silent, again.steps) == \
        (("stage", "2"), 8, 7, 1, 2, 40)
    assert (again.sums, again.relays_down, set(again.quantities)) == (group.sums, ("n03",), {"compute"})
    assert (again.samples_per_s, again.tokens_per_s) == (80.0, 800.0)
    bad = GroupReduction.read({"key": ["group", "g"], "ranks": -1, "timed": "3", "stalled": 1.5, "silent": True,
                               "steps": 9, "sums": {"samples_per_s": "x", "tokens_per_s": 5, "other": 1.0},
                               "q": {"compute": red.wire(), "unknown": red.wire()}, "relays_down": ["a", 3]})
    assert bad is not None
    assert (bad.ranks, bad.timed, bad.stalled, bad.silent, bad.steps) == (0, 0, 0, 0, 9)
    assert (bad.sums, set(bad.quantities), bad.relays_down) == ({"tokens_per_s": 5.0}, {"compute"}, ("a",))
    for key in (["group", 3], ["a", "b", "c"], "group", None):
        assert GroupReduction.read({"key": key}) is None
    assert GroupReduction.read({"key": ["g", "x"], "q": [], "sums": [], "relays_down": "n01"}) == \
        GroupReduction(("g", "x"))


def test_the_reports_group_entry_has_the_counts_the_sums_and_each_quantitys_extremes_and_quantiles():
    red = _reduction(*((0.1234567 + 0.01 * i, i) for i in range(10)))
    group = GroupReduction(("group", "n01"), ranks=10, timed=9, stalled=1, silent=0, steps=5,
                           sums={"samples_per_s": 1.23456789}, quantities={"step_time": red},
                           relays_down=("n02", "n05"))
    entry = group.as_json()
    assert entry == {
        "key": ["group", "n01"], "ranks": 10, "timed": 9, "stalled": 1, "silent": 0,
        "relays_down": ["n02", "n05"], "sums": {"samples_per_s": 1.234568},
        "quantities": {"step_time": {"n": 10, "min": 0.123457, "min_rank": 0,
                                     "p50": round(red.quantile(0.5), 6), "p90": round(red.quantile(0.9), 6),
                                     "max": 0.213457, "max_rank": 9}}}
    assert entry["quantities"]["step_time"]["p50"] < entry["quantities"]["step_time"]["p90"]
    assert GroupReduction(("group", "e"), quantities={"busy": Reduction()}).as_json()["quantities"]["busy"] == \
        {"n": 0, "min": None, "min_rank": None, "p50": None, "p90": None, "max": None, "max_rank": None}


def test_groups_merge_their_counts_sums_and_down_relays_and_the_job_is_the_trees_groups_only():
    a = GroupReduction(("group", "a"), ranks=4, timed=4, stalled=1, silent=2, steps=10,
                       sums={"samples_per_s": 1.0}, quantities={"compute": _reduction((0.1, 0))},
                       relays_down=("n2",))
    b = GroupReduction(("group", "b"), ranks=3, timed=2, stalled=0, silent=1, steps=12,
                       sums={"samples_per_s": 2.0, "tokens_per_s": 5.0}, quantities={"compute": _reduction((0.3, 5))},
                       relays_down=("n1", "n2"))
    stage = GroupReduction(("stage", "0"), ranks=7, timed=6, sums={"samples_per_s": 3.0})
    merged = merge_groups([a, b, stage])
    job = merged[("job", "")]
    assert (job.ranks, job.timed, job.stalled, job.silent, job.steps) == (7, 6, 1, 3, 12)
    assert (job.sums, job.relays_down) == ({"samples_per_s": 3.0, "tokens_per_s": 5.0}, ("n1", "n2"))
    assert (job.quantities["compute"].min_rank, job.quantities["compute"].max_rank) == (0, 5)
    assert set(merged) == {("group", "a"), ("group", "b"), ("stage", "0"), ("job", "")}
    assert all(red.key == key for key, red in merged.items())
    assert merged[("stage", "0")].ranks == 7 and merged[("group", "a")] is not a      # copies: inputs unchanged
    assert (a.ranks, a.steps) == (4, 10)


def test_a_grouping_by_the_hello_reduces_each_value_apart_after_the_groups_own(monkeypatch):
    from perfmon_analysis import groups

    monkeypatch.setitem(groups.GROUPINGS, "stage", lambda hello: hello.get("stage"))
    rows = [_row(r, 0.1 + 0.01 * r, hello={"stage": r % 2} if r != 3 else {}, steps=10 + r) for r in range(4)]
    reds = reduce_rows(rows, "g", 10.0)
    assert [red.key for red in reds] == [("group", "g"), ("stage", "0"), ("stage", "1")]
    assert [(red.ranks, red.steps) for red in reds] == [(4, 13), (2, 12), (1, 11)]
    assert reds[2].quantities["step_time"].max_rank == 1
    assert reduce_rows([], "g", 10.0) == [GroupReduction(("group", "g"))]


def test_a_rank_warming_up_or_silent_is_counted_but_not_reduced():
    rows = [_row(0, 0.1), RankRow(src="n/job.r1", rank=1, stats={"warming_up": True, "step_median": 9.0}),
            RankRow(src="n/job.r2", rank=2, stats={"step_median": 9.0}),
            _row(3, 0.2, silent_s=10.0), _row(4, 0.3, silent_s=9.99, stalled=True)]
    red = reduce_rows(rows, "g", 10.0)[0]
    assert (red.ranks, red.timed, red.silent, red.stalled) == (5, 3, 1, 1)
    assert (red.quantities["step_time"].n, red.quantities["step_time"].max) == (3, 0.3)
    assert red.sums["samples_per_s"] == 30.0 and "tokens_per_s" not in red.sums


def test_stalled_representatives_are_the_odd_ones_and_the_first_two_in_the_common_call():
    rows = [_row(r, 0.1, stalled=True, call=("world", 7)) for r in range(6)]
    rows += [_row(6, 0.1, stalled=True, call=("world", 6)), _row(7, 0.1, silent_s=10.0),
             _row(8, 0.1, silent_s=1.0)]
    reps = representatives(rows, reduce_rows(rows, "g", 10.0), set(), 10.0)
    stalled = reps - {"n0/job.r0", "n1/job.r8"}                     # the step time's extremes (all equal)
    assert stalled == {"n0/job.r1", "n0/job.r6", "n0/job.r7"}
    assert representatives(rows, [], set(), 10.0) == {"n0/job.r0", "n0/job.r1", "n0/job.r6", "n0/job.r7"}
    many = [_row(r, 0.1, stalled=True) for r in range(20)]            # none in a known call: all odd, 8 of them
    assert len(representatives(many, [], set(), 10.0)) == MAX_ODD_STALLED


def test_the_first_two_in_the_common_call_are_sent_on_even_when_odd_ranks_come_before_them():
    rows = [_row(0, 0.1, stalled=True), _row(1, 0.1, stalled=True, call=("world", 6))]
    rows += [_row(r, 0.1, stalled=True, call=("world", 7)) for r in range(2, 8)]
    assert representatives(rows, [], set(), 10.0) == {"n0/job.r0", "n0/job.r1", "n0/job.r2", "n0/job.r3"}


def test_a_rank_alone_is_its_groups_every_extreme_and_a_missing_quantity_skips_only_itself():
    alone = [_row(0, 0.1)]
    assert representatives(alone, reduce_rows(alone, "g", 10.0), set(), 10.0) == {"n0/job.r0"}
    rows = [RankRow(src=f"n/job.r{r}", rank=r, stats={"warming_up": False, "compute_median": 0.1 * (r + 1)})
            for r in range(3)]                                     # no step time: compute's holders still sent
    assert representatives(rows, reduce_rows(rows, "g", 10.0), set(), 10.0) == {"n/job.r0", "n/job.r2"}


def test_the_nearest_incumbent_stays_and_one_warming_up_does_not():
    rows = [_row(0, 0.1), _row(1, 0.1004), _row(2, 0.1), _row(3, 0.1005)]
    reds = reduce_rows(rows, "g", 10.0)
    kept = representatives(rows, reds, {"n0/job.r1", "n0/job.r2"}, 10.0)
    assert "n0/job.r1" in kept and "n0/job.r3" not in kept         # 0.1004 nearer the max 0.1005 than 0.1
    warming = [*rows[:1], RankRow(src="n0/job.r1", rank=1, stats={"warming_up": True, "step_median": 0.1005,
                                                                   "compute_median": 0.0603}), *rows[2:]]
    reps = representatives(warming, reduce_rows(warming, "g", 10.0), {"n0/job.r1"}, 10.0)
    assert "n0/job.r1" not in reps and "n0/job.r3" in reps
