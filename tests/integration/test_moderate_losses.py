"""Moderate losses are named, not called healthy: plain PyTorch scripts under ``perfmon run``,
judged by ``perfmon report --json`` on the recording.

Before loss accounting, a job only left `healthy` when its busy share fell under 70%: a
2-rank job waiting ~30% of each step on peers, or one waiting ~15-25% for its loader, was
"healthy". The shares here depend on the machine's speed, so the tests bound them
loosely and assert what must hold whatever the speed: the cause is named, and the share
that named it is the measured one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = str(Path(__file__).parent / "scripts" / "moderate_losses.py")
PY = sys.executable


def _report(tmp_path: Path, *cmd: str) -> dict:
    rec = tmp_path / "rec"
    run = subprocess.run([PY, "-m", "tui.cli", "run", "--no-tui", "--record", str(rec), "--", *cmd],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    out = subprocess.run([PY, "-m", "tui.cli", "report", str(rec), "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _loss(report: dict, loss_id: str) -> dict:
    """The verdict's loss with its share, the value of the metric it names."""
    loss = next(x for x in report["verdict"]["losses"] if x["id"] == loss_id)
    return {**loss, "share": report["metrics"][loss["metric"]]}


@pytest.mark.slow
def test_two_rank_job_waiting_on_peers_is_communication(tmp_path):
    rep = _report(tmp_path, PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", SCRIPT,
                  "comm", "--steps", "80")
    v, m = rep["verdict"], rep["metrics"]
    assert v["bottleneck"] == "communication", (v["headline"], m["device_busy"], m["comm_exposed_frac"])
    comm = _loss(rep, "comm_exposed")
    assert 0.10 <= comm["share"] <= 0.7 and comm["source"] == "time blocked in collectives"
    assert v["path"][:4] == ["memory", "device_busy", "data_wait", "comm_exposed"]
    assert v["unknown"]["data_wait_frac"].startswith("loader wait not measured")   # no loader: said, not 0
    # data parallel only: no layout beyond dp, rank rows and path as before the layout existed (issue 41)
    assert rep["layout"] == {"dims": ["dp"], "sizes": [2], "source": "world", "coords": {"0": [0], "1": [1]}}
    assert all("stage" not in r for r in rep["ranks"]) and v["path"][4:] == ["straggler"]


@pytest.mark.slow
def test_a_loader_costing_a_part_of_each_step_is_data_loading(tmp_path):
    rep = _report(tmp_path, PY, SCRIPT, "loader", "--steps", "300", "--wait-share", "0.25")
    v = rep["verdict"]
    data = _loss(rep, "data_wait")
    assert v["bottleneck"] in ("data_loading", "data_preprocessing"), (v["headline"], data)
    assert data["share"] >= 0.05
    # the worker sleeps on reads: once its CPU is measured it is not CPU-bound
    assert v["bottleneck"] == "data_loading"


@pytest.mark.slow
def test_a_compute_bound_loop_is_healthy_with_every_loss_small_or_unknown(tmp_path):
    rep = _report(tmp_path, PY, SCRIPT, "compute", "--steps", "150")
    v = rep["verdict"]
    assert v["bottleneck"] == "healthy", v["headline"]
    shares = [_loss(rep, x["id"])["share"] for x in v["losses"] if x["id"] != "step_gaps"]
    assert all(share is None or share < 0.10 for share in shares)
