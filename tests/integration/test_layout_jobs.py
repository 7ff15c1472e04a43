"""Jobs shaped like large-model training, live on CPU under ``perfmon run`` over gloo, judged by
``perfmon report --json`` on their recordings (scripts/layout_jobs.py; each job runs once, every
assertion on its one report):

* a ``torch.distributed.pipelining`` pipeline, GPipe and 1F1B, one stage holding 3x the layers: the
  layout is the pipeline's, the stage is named, and each stage's bubble (its time blocked on its
  neighbours) is within 0.1 of 1 - the stage's own busy share, which the script measures itself;
* a 2-D mesh (dp x tp) with one rank slowed (it sleeps): the worker and its replica are named;
* DDP whose slow rank is a different one each step (it sleeps; two ranks, each slow on half the
  steps in a shuffled order): rotating imbalance, no rank blamed.
The effects are sleeps or the stage's own share of the pipeline, not the machine's core count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = str(Path(__file__).parent / "scripts" / "layout_jobs.py")
PY = sys.executable
pytestmark = pytest.mark.slow


def run_job(tmp: Path, ranks: int, *args: str) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """(the report JSON, each rank's own measurements) of one job."""
    rec, out = tmp / "rec", tmp / "out"
    run = subprocess.run([PY, "-m", "tui.cli", "run", "--no-tui", "--record", str(rec), "--", PY, "-m",
                          "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), SCRIPT, *args,
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = subprocess.run([PY, "-m", "tui.cli", "report", str(rec), "--json"], capture_output=True, text=True,
                            timeout=120)
    assert report.returncode == 0, report.stderr
    own = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    return json.loads(report.stdout), own


@pytest.fixture(scope="module", params=["gpipe", "1f1b"])
def pipeline_job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    heavy = 1 if request.param == "gpipe" else 0      # the last stage in one, the first in the other
    report, own = run_job(tmp_path_factory.mktemp(request.param), 2, "pipeline", "--schedule", request.param,
                          "--heavy", str(heavy), "--steps", "16")
    return heavy, report, own


@pytest.fixture(scope="module")
def mesh_job(tmp_path_factory: pytest.TempPathFactory):
    return run_job(tmp_path_factory.mktemp("mesh"), 4, "mesh", "--slow-rank", "3", "--steps", "16")


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory: pytest.TempPathFactory):
    return run_job(tmp_path_factory.mktemp("ddp"), 2, "ddp", "--steps", "20", "--sleep", "0.08")


def test_pipeline_names_the_heavy_stage_and_measures_each_bubble(pipeline_job) -> None:
    heavy, report, own = pipeline_job
    assert report["layout"] == {"dims": ["pp"], "sizes": [2], "source": "pipeline",
                                "coords": {"0": [0], "1": [1]}}
    assert [(r["rank"], r["stage"]) for r in report["ranks"]] == [(0, 0), (1, 1)]
    s = report["straggling"]
    assert (s["cause"], s["stage"]) == ("slow_stage", heavy), s
    assert s["slowdown"] > 1.05      # its gain is the simulation's reading of noisy CPU timings: not asserted
    stages = {st["stage"]: st for st in s["stages"]}
    assert max(stages, key=lambda k: stages[k]["compute_s"]) == heavy
    for rank, mine in own.items():
        assert abs(stages[rank]["bubble_frac"] - (1.0 - mine["busy_share"])) <= 0.1, (rank, stages[rank], mine)


def test_mesh_names_the_slow_worker_and_its_replica(mesh_job) -> None:
    report, own = mesh_job
    assert report["layout"]["dims"] == ["dp", "tp"] and report["layout"]["sizes"] == [2, 2]
    assert report["layout"]["coords"]["3"] == own[3]["coordinate"] == [1, 1]
    s = report["straggling"]
    assert (s["cause"], s["rank"], s["worker"]["replica"], s["chronic"]) == ("slow_worker", 3, 1, True), s
    assert s["gain"] > 1.5


def test_ddp_with_a_random_slow_rank_is_rotating_imbalance(ddp_job) -> None:
    report, own = ddp_job
    assert report["layout"]["dims"] == ["dp"] and report["layout"]["source"] == "world"
    assert all("stage" not in r for r in report["ranks"])       # data parallel: the rows read as before
    s = report["straggling"]
    assert s["cause"] == "rotating_imbalance" and s["rank"] is None and s["worker"] is None, s
    assert s["workers_standing_out"] == 2 and s["gain"] > 1.1      # each rank slow on half the steps, in turn
