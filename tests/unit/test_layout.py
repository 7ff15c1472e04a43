"""The job's parallel layout (perfmon_analysis.layout): each dim's role, a rank's stage, replica,
worker and label, the layout assembled from the ranks' readings, and its JSON."""

from __future__ import annotations

from perfmon_analysis.layout import Layout, assemble, world_layout
from perfmon_analysis.readings.layout import LayoutReading

# 2 stages x 2 replicas x 2-way tensor parallel: rank = pp * 4 + dp * 2 + tp
MESH = Layout(dims=("pp", "dp", "tp"), sizes=(2, 2, 2),
              coords={r: (r // 4, r // 2 % 2, r % 2) for r in range(8)}, source="mesh")


def test_each_dim_has_its_role_and_a_lone_unknown_dim_is_data_parallel():
    assert [MESH.role(d) for d in MESH.dims] == ["stage", "replica", "worker"]
    assert Layout(dims=("tp",), sizes=(4,)).role("tp") == "replica"
    assert Layout(dims=("tp", "x"), sizes=(2, 2)).role("x") == "worker"
    assert (MESH.stages, MESH.replicas) == (2, 2)


def test_a_ranks_stage_replica_worker_and_label():
    assert (MESH.stage(5), MESH.replica(5), MESH.worker(5), MESH.label(5)) == (1, 0, (1, 0), "pp1 dp0 tp1")
    assert (MESH.stage(99), MESH.worker(99), MESH.label(99)) == (None, None, "")     # a rank that said nothing
    assert MESH.worker_label(1, 0) == "dp0 pp1"
    assert Layout(dims=("tp", "x"), sizes=(2, 2)).worker_label(0, 3) == "replica 3"


def test_the_layouts_json_lists_each_ranks_coordinates_by_rank():
    assert Layout(dims=("pp", "dp"), sizes=(2, 1), coords={1: (1, 0), 0: (0, 0)}, source="x").as_json() == \
        {"dims": ["pp", "dp"], "sizes": [2, 1], "source": "x", "coords": {"0": [0, 0], "1": [1, 0]}}


def test_a_job_whose_ranks_said_nothing_is_data_parallel_over_at_least_one_rank():
    assert world_layout(0) == Layout(dims=("dp",), sizes=(1,), coords={0: (0,)}, source="world")
    assert world_layout(3).coords == {0: (0,), 1: (1,), 2: (2,)} and world_layout(3).source == "world"
    assert assemble({}, 2) == world_layout(2)


def test_the_assembled_layout_is_the_shape_most_ranks_report_with_its_commonest_source():
    def said(dims: tuple[str, ...], sizes: tuple[int, ...], coord: tuple[int, ...], source: str) -> LayoutReading:
        return LayoutReading(dims=dims, sizes=sizes, coord=coord, source=source)

    readings = {0: said(("pp", "dp"), (2, 2), (0, 0), "mesh"), 1: said(("pp", "dp"), (2, 2), (0, 1), "groups"),
                2: said(("pp", "dp"), (2, 2), (1, 0), "groups"), 3: said(("dp",), (4,), (3,), "mesh")}
    layout = assemble(readings, 4)
    assert (layout.dims, layout.sizes, layout.source) == (("pp", "dp"), (2, 2), "groups")
    assert dict(layout.coords) == {0: (0, 0), 1: (0, 1), 2: (1, 0)}          # rank 3 disagrees: left out
