"""Running a compatibility-matrix cell (``tests/compat/job.py``) for real: bare, with the API, under
``perfmon run``. The bare run and each watched run are made once per session and shared by every
test that reads them (``test_matrix.py``, ``test_fsdp2.py``)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.compat.matrix import BY_NAME, Cell

JOB = str(Path(__file__).with_name("job.py"))
PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240


def _launch(cell: Cell) -> list[str]:
    if cell.launcher == "torchrun":
        return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cell.ranks}"]
    if cell.launcher == "accelerate":
        return [PY, "-m", "accelerate.commands.launch", "--multi_gpu", f"--num_processes={cell.ranks}",
                "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no"]
    return [PY]


def _results(proc: subprocess.CompletedProcess) -> dict[int, dict]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"cell"')]
    return {line["rank"]: line for line in lines}


def run_cell(cell: Cell, mode: str, record: Path | None) -> dict[int, dict]:
    """Each rank's ``{"cell", "rank", "steps", "loss"}`` line from one run of ``cell``: ``bare``,
    ``api`` or ``requests`` (recording to ``record`` with PERFMON_RECORD), ``run`` (under ``perfmon run --record``)."""
    cmd = [*_launch(cell), JOB, cell.name] + (["--api"] if mode in ("api", "requests") else [])
    cmd += ["--requests"] if mode == "requests" else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PERFMON_RECORD", None)
    if mode in ("api", "requests"):
        env["PERFMON_RECORD"] = str(record)
    elif mode == "run":
        cmd = [PY, "-m", "tui.cli", "run", "--no-tui", "--record", str(record), "--", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=tempfile.gettempdir())
    return _results(proc)


@functools.cache
def bare(name: str) -> dict[int, dict]:
    return run_cell(BY_NAME[name], "bare", None)


@functools.cache
def watched(name: str, mode: str) -> tuple[dict[int, dict], Path]:
    """One run of the cell with perfmon (``api`` or ``run``) and its recording directory."""
    record = Path(tempfile.mkdtemp(prefix=f"perfmon-compat-{name}-{mode}-"))
    return run_cell(BY_NAME[name], mode, record), record
