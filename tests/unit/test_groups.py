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
