"""Fixtures shared by the integration test files."""

from __future__ import annotations

import os
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
