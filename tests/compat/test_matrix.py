"""The compatibility matrix (``tests/compat/matrix.py``), run for real: each cell bare, with the API, under
``perfmon run``.

For every CPU cell and both ways of using perfmon: the job exits 0 with a final loss
bit-identical to the bare run's on every rank (CPU, gloo and these stacks are
deterministic), perfmon counts exactly the loop's optimizer steps on every rank,
communication is measured where the job has it, and the phases the row lists are
timed while the others are announced as not visible.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from probe.recording import read_recording, recording_files
from tests.compat import runs
from tests.compat.matrix import ALL, BY_NAME, CELLS, Cell, render

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _flops_per_step(record: Path) -> list[float]:
    return [r["flops"] for path in recording_files(record) for r in read_recording(path).records
            if r["k"] == "step" and r.get("flops")]


def _steps_and_phases(record: Path) -> dict[int, tuple[int, frozenset[str], int, list[str]]]:
    """Per rank: step records, the standard phases timed in most steps, steps with comm time, warnings."""
    out = {}
    for path in recording_files(record):
        records = read_recording(path).records
        hello = next(r for r in records if r["k"] == "hello")
        steps = [r for r in records if r["k"] == "step"]
        counts = Counter(name for s in steps for name in (s.get("phases") or {}) if name in ALL)
        timed = frozenset(name for name, n in counts.items() if n * 2 >= len(steps))
        with_comm = sum(1 for s in steps if (s.get("comm") or {}).get("seconds"))
        warnings = [r.get("message", "") for r in records if r["k"] == "event" and r.get("name") == "warning"]
        out[hello["rank"]] = (len(steps), timed, with_comm, warnings)
    return out


def _available(cell: Cell) -> None:
    for module in cell.extra:
        pytest.importorskip(module)


CPU_CELLS = [c.name for c in CELLS if not c.gpu]


@pytest.mark.parametrize("mode", ["api", "run"])
@pytest.mark.parametrize("name", CPU_CELLS)
def test_cell(name: str, mode: str) -> None:
    cell = BY_NAME[name]
    _available(cell)
    bare = runs.bare(name)
    assert sorted(bare) == list(range(cell.ranks))
    watched, record = runs.watched(name, mode)
    for rank, line in bare.items():        # the job is unchanged: same steps, same loss to the last bit
        assert watched[rank]["steps"] == line["steps"]
        assert watched[rank]["loss"] == line["loss"], f"rank {rank}: {watched[rank]['loss']} != {line['loss']}"
    seen = _steps_and_phases(record)
    assert sorted(seen) == list(range(cell.ranks))
    expected = cell.api_phases if mode == "api" else cell.run_phases
    for rank, (steps, timed, with_comm, warnings) in seen.items():
        assert steps == bare[rank]["steps"], f"rank {rank}: {steps} step records for {bare[rank]['steps']} steps"
        assert timed == expected, f"rank {rank}: phases timed {sorted(timed)}, expected {sorted(expected)}"
        if expected != ALL:     # what is not timed is announced, once
            notices = [w for w in warnings if w.startswith("phases not visible")]
            assert len(notices) == 1 and all(h in notices[0] for h in ALL - expected), warnings
        if cell.comm:           # all steps but the first (hooks are attached during it under perfmon run)
            assert with_comm >= steps - 1, f"rank {rank}: comm timed in {with_comm} of {steps} steps"
        else:
            assert with_comm == 0
    if cell.comm:
        report = subprocess.run([PY, "-m", "tui.cli", "report", str(record), "--json"],
                                capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert report.returncode == 0, report.stderr
        metrics = json.loads(report.stdout)["metrics"]
        assert metrics["comm_frac"] and metrics["comm_exposed_frac"] is not None


# the stacks where hooks on every module, a live FLOP count or torch.profiler could bite
REQUEST_CELLS = ["compile_model", "activation_checkpointing", "fsdp2_mixed_precision", "dtensor_tp", "hf_trainer",
                 "lightning_trainer"]


@pytest.mark.parametrize("name", REQUEST_CELLS)
def test_a_module_profile_and_a_profiler_capture_leave_the_job_unchanged(name: str) -> None:
    """The job asks for a profile at step 3 and a capture at step 14, as a viewer would: the loss
    is bit-identical and the steps the same; each rank sends both results, or (a model compiled
    where its hooks would recompile it) a one-line refusal."""
    cell = BY_NAME[name]
    _available(cell)
    record = Path(tempfile.mkdtemp(prefix=f"perfmon-compat-{name}-requests-"))
    assert runs.run_cell(cell, "requests", record) == runs.bare(name)
    for path in recording_files(record):
        records = read_recording(path).records
        profiles = [r for r in records if r["k"] == "profile"]
        captures = [r for r in records if r["k"] == "capture"]
        refused = {r["op"]: r["reason"] for r in records if r["k"] == "event" and r.get("name") == "request_refused"}
        assert len(captures) == 1 and captures[0].get("error") is None and Path(captures[0]["path"]).exists()
        if name.startswith("compile"):
            assert not profiles and refused["profile"].startswith("the model's forward runs inside a torch.compile")
        else:
            assert len(profiles) == 1 and profiles[0].get("error") is None and not refused
            assert sum(m.get("flops") or 0 for m in profiles[0]["modules"]) > 0


@pytest.mark.parametrize("name", ["activation_checkpointing", "autocast_bf16"])
def test_zero_code_counts_the_same_flops_as_the_api(name: str) -> None:
    """Both count one forward+backward on a meta copy of the same model: the same FLOPs per step."""
    api, run = (_flops_per_step(runs.watched(name, mode)[1]) for mode in ("api", "run"))
    # the count runs on a background thread: the first steps (more on a loaded machine) have none yet
    assert len(api) >= 5 and len(run) >= 5
    assert set(run) == set(api) and len(set(api)) == 1, (set(api), set(run))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["api", "run"])
@pytest.mark.parametrize("name", [c.name for c in CELLS if c.gpu])
def test_gpu_cell(name: str, mode: str, tmp_path: Path) -> None:
    import torch

    cell = BY_NAME[name]
    if torch.cuda.device_count() < cell.min_gpus:
        pytest.skip(f"needs {cell.min_gpus} GPUs")
    bare = runs.bare(name)
    watched = runs.run_cell(cell, mode, tmp_path / "rec")
    for rank, line in bare.items():
        assert watched[rank]["steps"] == line["steps"]
    for rank, (steps, timed, with_comm, _) in _steps_and_phases(tmp_path / "rec").items():
        assert steps == bare[rank]["steps"]
        assert timed >= (cell.api_phases if mode == "api" else cell.run_phases)
        if cell.comm:
            assert with_comm >= steps - 1


def test_the_compatibility_doc_is_generated_from_the_matrix() -> None:
    doc = ROOT / "docs" / "compatibility.md"
    assert doc.read_text() == render(), "run: python scripts/compat_doc.py"
