"""Test helpers for ``perfmon demo --headless``: run it, and see what it left behind the moment it exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).parents[2]
PERFMON = [sys.executable, "-m", "tui.cli"]
LOAD_IMBALANCE_SECONDS = 8      # the shared load_imbalance run's watch (conftest.py)


def demo_processes(perfmon_dir: Path) -> list[psutil.Process]:
    """Workload ranks and their loader workers started under this socket directory."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "tui.commands.demo.workload" in " ".join(proc.info["cmdline"] or []) \
                    and proc.environ().get("PERFMON_DIR") == str(perfmon_dir):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@dataclass(frozen=True)
class HeadlessRun:
    """A finished headless demo and what it left, looked at as soon as the command returned."""

    proc: subprocess.CompletedProcess
    files_left: list[Path]              # anything in its socket directory
    processes_left: list[psutil.Process]  # its ranks or loader workers still running
    ranks_alive: list[int]              # pids of the report's ranks that still exist


def run_headless(scenario: str, seconds: float, perfmon_dir: Path, *extra: str, timeout: float = 120) -> HeadlessRun:
    """``perfmon demo --headless --seconds S --scenario NAME [extra]`` with ``perfmon_dir`` as its socket directory."""
    proc = subprocess.run(PERFMON + ["demo", "--headless", "--seconds", str(seconds), "--scenario", scenario, *extra],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PERFMON_DIR": str(perfmon_dir)})
    try:
        ranks = [r["pid"] for r in json.loads(proc.stdout)["ranks"]]
    except (ValueError, KeyError, TypeError):
        ranks = []
    return HeadlessRun(proc, list(perfmon_dir.iterdir()), demo_processes(perfmon_dir),
                       [pid for pid in ranks if psutil.pid_exists(pid)])
