"""The ranks heatmap of a large job: levels per quantity, ranks by node, the slowest rank and node."""

from __future__ import annotations

import dataclasses

import pytest

from perfmon_analysis.heatmap import RATIO_BANDS, SHARE_BANDS, heatmap, level
from tests.unit.verdict_synth import Rank, job


def _job(n: int, per_node: int, slow: int | None = None, data_rank: int | None = None):
    """n CPU ranks, ``per_node`` to a node; ``slow`` computes 1.6x longer, ``data_rank`` waits 40% for data."""
    ranks = []
    for r in range(n):
        compute = 0.16 if r == slow else 0.10
        data = 0.08 if r == data_rank else 0.002
        ranks.append(Rank(r, steps=20, dur=0.2, data=data, comm=0.2 - compute - data, exposed=0.2 - compute - data))
    view = job(*ranks).view()
    hosts = {r: f"n{r // per_node + 1:02d}" for r in range(n)}
    return dataclasses.replace(view, ranks=[dataclasses.replace(r, host=hosts[r.rank]) for r in view.ranks])


@pytest.mark.parametrize("value,bands,want", [
    (None, RATIO_BANDS, None), (1.0, RATIO_BANDS, 0), (1.1, RATIO_BANDS, 1), (1.6, RATIO_BANDS, 3),
    (2.5, RATIO_BANDS, 4), (0.049, SHARE_BANDS, 0), (0.05, SHARE_BANDS, 1), (0.5, SHARE_BANDS, 4)])
def test_a_value_falls_in_its_band_and_unknown_stays_unknown(value, bands, want):
    assert level(value, bands) == want


def test_the_slow_rank_is_hot_in_compute_and_the_waiting_ranks_in_comm():
    hm = heatmap(_job(16, 8, slow=11, data_rank=2))
    col = hm.ranks.index(11)
    assert hm.levels["comp"][col] == 3 and set(hm.levels["comp"][:col] + hm.levels["comp"][col + 1:]) == {0}
    assert hm.levels["comm"][col] == 2 < hm.levels["comm"][0] == 3      # 19% vs the others waiting 49%
    assert hm.levels["data"][hm.ranks.index(2)] == 3 and hm.levels["data"][0] == 0
    assert set(hm.levels["step"]) == {0}          # synchronous: every step takes the slowest one's time
    assert (hm.slowest_by, hm.slowest_rank, hm.slowest_rank_host) == ("compute", 11, "n02")
    assert hm.slowest_ratio == pytest.approx(1.6)
    assert hm.slowest_node is None and hm.slowest_node_ratio is None    # one slow rank does not make its node slow


def test_columns_are_grouped_by_node_in_the_order_of_their_lowest_rank():
    view = _job(6, 2)
    hosts = {0: "b", 1: "a", 2: "a", 3: "b", 4: "c", 5: "c"}
    view = dataclasses.replace(view, ranks=[dataclasses.replace(r, host=hosts[r.rank]) for r in view.ranks])
    hm = heatmap(view)
    assert hm.ranks == (0, 3, 1, 2, 4, 5) and hm.nodes == [("b", 0, 2), ("a", 2, 2), ("c", 4, 2)]
    assert hm.hosts == ("b", "b", "a", "a", "c", "c")


def test_a_slow_node_is_named_by_the_median_of_its_ranks():
    view = _job(12, 4)
    view = dataclasses.replace(view, ranks=[dataclasses.replace(r, compute_s=r.compute_s * (1.5 if r.rank < 4
                                                                                              else 1.0))
                                            for r in view.ranks])
    hm = heatmap(view)
    assert hm.slowest_node == "n01" and hm.slowest_node_ratio == pytest.approx(1.5)


def test_no_time_one_rank_or_a_zero_time_never_names_a_wrong_rank():
    warming = job(Rank(0, steps=0), Rank(1, steps=0)).view()
    hm = heatmap(warming)
    assert hm.slowest_rank is None and hm.slowest_ratio is None and hm.slowest_node is None
    assert set(hm.levels["step"]) == {None}
    alone = heatmap(_job(1, 1))
    assert alone.slowest_rank is None and alone.slowest_ratio is None and alone.levels["comp"] == (0,)
    view = _job(4, 2, slow=3)
    view = dataclasses.replace(view, ranks=[dataclasses.replace(r, compute_s=0.0 if r.rank == 0 else r.compute_s)
                                            for r in view.ranks])
    hm = heatmap(view)                    # a rank that measured no compute does not make the others unknown
    assert hm.levels["comp"] == (0, 0, 0, 3) and hm.slowest_rank == 3 and hm.slowest_ratio == pytest.approx(1.6)


def test_one_node_names_no_node_and_unknown_compute_falls_back_to_step_time():
    view = _job(4, 4)
    view = dataclasses.replace(view, ranks=[dataclasses.replace(r, compute_s=None, step_time_median_s=0.1 + 0.1 * (
        r.rank == 2)) for r in view.ranks])
    hm = heatmap(view)
    assert hm.slowest_node is None and (hm.slowest_by, hm.slowest_rank) == ("step", 2)
    assert hm.slowest_ratio == pytest.approx(2.0) and set(hm.levels["comp"]) == {None}


def _compute(view, times: dict[int, float | None]):
    return dataclasses.replace(view, ranks=[dataclasses.replace(r, compute_s=times.get(r.rank, r.compute_s))
                                            for r in view.ranks])


def test_two_ranks_and_two_nodes_are_enough_to_name_the_slower():
    hm = heatmap(_compute(_job(2, 1), {1: 0.12}))       # 1.2x: named, above the first band only
    assert (hm.slowest_rank, hm.slowest_rank_host) == (1, "n02") and hm.slowest_ratio == pytest.approx(1.2)
    assert hm.slowest_node == "n02" and hm.slowest_node_ratio == pytest.approx(1.2)


def test_a_rank_without_compute_is_unknown_and_a_node_of_zero_times_names_nothing():
    hm = heatmap(_compute(_job(4, 2), {2: None}))
    assert hm.levels["comp"] == (0, 0, None, 0)
    zero = heatmap(_compute(_job(4, 2), {0: 0.0, 1: 0.0}))     # node n01 measured no compute at all
    assert zero.slowest_node is None and zero.levels["comp"][:2] == (0, 0)


def test_a_layout_beyond_data_parallel_groups_the_columns_by_stage_and_replica():
    """A dp2 x pp2 job (ranks numbered pp-major): the columns go stage by stage, each labelled with its
    place, not its node; a data-parallel job keeps its node grouping."""
    from tests.helpers.ops_jobs import even, view

    hm = heatmap(view(pp=2, dp=2, steps=6, compute=even()))
    assert (hm.group_by, hm.ranks) == ("stage", (0, 1, 2, 3))
    assert [g for g, _, _ in hm.nodes] == ["dp0 pp0", "dp1 pp0", "dp0 pp1", "dp1 pp1"]
    assert heatmap(_job(16, 8)).group_by == "node"
