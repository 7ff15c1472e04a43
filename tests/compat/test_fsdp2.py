"""FSDP2 (``fully_shard``) on 2 gloo ranks: its all-gathers and reduce-scatters are counted exactly, and a
job they dominate is called ``communication``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from probe.recording import read_recording, recording_files
from tests.compat import runs

JOB = str(Path(__file__).with_name("job.py"))
PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
STEPS = 24
WORLD = 2

pytestmark = [pytest.mark.slow, pytest.mark.cell("fsdp2_mixed_precision")]


def _padded_numel(shape: tuple[int, ...]) -> int:
    """FSDP2 shards dim 0 evenly: it pads dim 0 up to a multiple of the world size."""
    dim0 = math.ceil(shape[0] / WORLD) * WORLD
    return dim0 * math.prod(shape[1:])


def _linear(n_in: int, n_out: int) -> int:
    return _padded_numel((n_out, n_in)) + _padded_numel((n_out,))


def _comm_totals(record: Path) -> dict[int, dict[str, dict]]:
    totals = {}
    for path in recording_files(record):
        records = read_recording(path).records
        rank = next(r for r in records if r["k"] == "hello")["rank"]
        last = [r for r in records if r["k"] == "comm"][-1]
        totals[rank] = {op["op"]: op for op in last["ops"]}
    return totals


def test_fsdp2_all_gather_and_reduce_scatter_bytes_match_the_sharded_parameters() -> None:
    # the matrix's run of this cell with the API (the job's default 24 steps), shared with test_matrix.py
    ranks, record = runs.watched("fsdp2_mixed_precision", "api")
    assert {rank: line["steps"] for rank, line in ranks.items()} == {0: STEPS, 1: STEPS}
    # the job's model: Stack(dim=64, depth=2), each block and the root (head) its own FSDP unit
    block = _linear(64, 128) + _linear(128, 64)
    root = _linear(64, 1)
    bf16, fp32 = 2, 4                          # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    # forward gathers every unit; backward gathers the blocks again (resharded after forward), not the root
    gather_per_step = (root + 2 * block) * bf16 + 2 * block * bf16
    scatter_per_step = (root + 2 * block) * fp32
    for rank, ops in _comm_totals(record).items():
        assert ops["all_gather"]["count"] == 5 * STEPS, rank
        assert ops["all_gather"]["bytes"] == gather_per_step * STEPS, rank
        assert ops["reduce_scatter"]["count"] == 3 * STEPS, rank
        assert ops["reduce_scatter"]["bytes"] == scatter_per_step * STEPS, rank
        assert ops["all_gather"]["seconds"] > 0 and ops["reduce_scatter"]["seconds"] > 0


def test_fsdp2_job_bound_by_gathering_weights_is_called_communication(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    proc = subprocess.run([PY, "-m", "tui.cli", "run", "--no-tui", "--record", str(rec), "--",
                           *TORCHRUN, JOB, "fsdp2_comm_bound", "--steps", "30"],
                          capture_output=True, text=True, timeout=240, cwd=tempfile.gettempdir(),
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = subprocess.run([PY, "-m", "tui.cli", "report", str(rec), "--json"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    metrics = report["metrics"]
    assert metrics["comm_frac"] is not None and metrics["comm_exposed_frac"] is not None
    assert metrics["comm_exposed_frac"] > 0.3, metrics
    verdict = report["verdict"]
    assert verdict["bottleneck"] == "communication", verdict
    # FSDP's own knobs, not DDP's; the exposed share split between its two collectives
    fixes = " ".join(verdict["suggestions"])
    assert "reshard_after_forward" in fixes and "set_modules_to_forward_prefetch" in fixes
    assert "set_requires_gradient_sync" in fixes and "bucket_cap_mb" not in fixes and "no_sync()" not in fixes
    assert verdict["headline"].startswith("Communication (FSDP): exposed communication is "), verdict["headline"]
    assert "all-gather" in verdict["headline"] and "reduce-scatter" in verdict["headline"]
    split = verdict["evidence"]["comm_exposed_by_op"]
    assert set(split) == {"all_gather", "reduce_scatter"}
    assert sum(split.values()) == pytest.approx(metrics["comm_exposed_frac"], abs=0.01)
