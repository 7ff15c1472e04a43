"""Shared fixtures: every test gets its own private socket directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# the simulated device layer (simulated pynvml / CUDA) as fixtures for any test that asks for them
pytest_plugins = ["tests.sim.fixtures"]


@pytest.fixture(autouse=True)
def perfmon_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh 0700 socket directory in PERFMON_DIR, inherited by subprocesses."""
    path = tmp_path_factory.mktemp("sock")
    os.chmod(path, 0o700)
    monkeypatch.setenv("PERFMON_DIR", str(path))
    return path
