"""``perfmon doctor --cpu-only`` on this (GPU-less) machine: the CPU workloads run for real and agree with
the truth they planted, the GPU checks say why they did not run, and the exit status says all was well."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CPU_CHECKS = ("compute-bound loop", "known wait in each step", "loop starved by its loader",
              "unhooked wait in each step", "time between steps")


@pytest.mark.slow
def test_doctor_cpu_only_passes_on_a_cpu_machine_and_prints_its_table():
    out = subprocess.run([sys.executable, "-m", "tui.cli", "doctor", "--cpu-only"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {line.split("  ")[0].strip(): line for line in out.stdout.splitlines()[2:-1]}
    assert set(CPU_CHECKS) <= set(rows)
    for name in CPU_CHECKS:
        assert "  ok  " in rows[name], rows[name]
    assert "not run: --cpu-only" in rows["a sync every step"]
    gpu_rows = [name for name in rows if name not in CPU_CHECKS]
    assert gpu_rows and all("not run: --cpu-only" in rows[name] for name in gpu_rows)
    assert out.stdout.splitlines()[-1] == f"{len(rows)} checks: 5 ok, 0 failed, {len(gpu_rows)} not run here"
