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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu`` tests run only where CUDA is; elsewhere they are skipped, saying so."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m gpu on a GPU machine)")
        for item in gpu_items:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The random order's seed at the end of every run, ``-q`` included (pytest-randomly prints it only
    in the header, which ``-q`` leaves out), so a failure seen once can be run again in the same order."""
    if config.pluginmanager.hasplugin("randomly"):
        seed = config.getoption("randomly_seed", None)
        if isinstance(seed, int):
            terminalreporter.write_line(f"test order: -p randomly --randomly-seed={seed} runs it again")


@pytest.fixture
def no_coverage_tracer():
    """Stop coverage's tracer for a test that forks in-process: another thread may hold the
    tracer's lock at the fork, and the child would wait on it forever. Works with or without --no-cov."""
    import sys

    coverage = sys.modules.get("coverage")
    cov = coverage.Coverage.current() if coverage is not None else None
    if cov is not None:
        cov.stop()
    try:
        yield
    finally:
        if cov is not None:
            cov.start()
