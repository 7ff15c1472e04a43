"""``perfmon doctor`` on this (GPU-less) machine: the CPU workloads run for real and agree with their
known bottleneck, the GPU checks say why they did not run, and the exit status says all was well."""

from __future__ import annotations

import os
import subprocess
import sys


def test_doctor_passes_on_a_cpu_machine_and_prints_its_table():
    out = subprocess.run([sys.executable, "-m", "tui.cli", "doctor"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "160"})
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {line.split("  ")[0].strip(): line for line in out.stdout.splitlines()[2:-1]}
    assert {"compute-bound loop", "step time vs the loop's own clock", "loop starved by its loader"} <= set(rows)
    for name in ("compute-bound loop", "step time vs the loop's own clock", "loop starved by its loader"):
        assert "  ok  " in rows[name], rows[name]
    assert "not run: no CUDA GPU visible to torch" in rows["a sync every step"]
    assert out.stdout.splitlines()[-1].endswith("0 failed, 5 not run here")
