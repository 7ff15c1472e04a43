"""Fixtures shared by the integration test files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.demoutil import LOAD_IMBALANCE_SECONDS, HeadlessRun, run_headless


@pytest.fixture(scope="session")
def load_imbalance_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[HeadlessRun, Path]:
    """One recorded ``perfmon demo --headless --scenario load_imbalance`` (2 ranks), and its recording
    directory: test_demo.py judges its verdict and clean exit, test_html_report.py draws its recording."""
    sock = tmp_path_factory.mktemp("demo-sock")
    os.chmod(sock, 0o700)
    rec = tmp_path_factory.mktemp("demo-rec") / "rec"
    return run_headless("load_imbalance", LOAD_IMBALANCE_SECONDS, sock, "--record", str(rec)), rec


@pytest.fixture(scope="session")
def loader_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tests/integration/scripts/loader_pair.py under ``perfmon run --record``: the job whose loader
    costs 2/3 of each step (``slow``), its fixed twin (``fixed``) and the fixed twin again
    (``fixed2``), recorded side by side, so whatever else loads the machine loads the three alike.
    test_compare.py compares them, test_gains.py judges the gains against the fix."""
    root = tmp_path_factory.mktemp("loader-pair")
    script = str(Path(__file__).parent / "scripts" / "loader_pair.py")
    runs = {name: subprocess.Popen([sys.executable, "-m", "tui.cli", "run", "--no-tui", "--record", str(root / name),
                                    "--", sys.executable, script, name.rstrip("2")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for name in ("slow", "fixed", "fixed2")}
    for name, run in runs.items():
        _, err = run.communicate(timeout=600)
        assert run.returncode == 0, (name, err[-2000:])
    return {name: root / name for name in runs}
