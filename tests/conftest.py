"""Shared fixtures (every test gets its own private socket directory) and the two test tiers.

The fast tier (``python -m pytest -m "not slow"``) is the unit and TUI tests that run inside the
pytest process. Every test that starts a process is ``slow``: by path (``SLOW_DIRS``: real jobs,
tmux, the compatibility matrix) or by its own marker; a test outside those that starts a process
without the marker fails, naming the marker (``_no_process_in_fast_tests``), so the fast tier
stays fast as tests are added.
"""

from __future__ import annotations

import _posixsubprocess
import multiprocessing.process
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SLOW_DIRS = ("integration", "e2e", "compat")
TESTS = Path(__file__).resolve().parent

# the simulated device layer (simulated pynvml / CUDA) as fixtures for any test that asks for them
pytest_plugins = ["tests.sim.fixtures"]


@pytest.fixture(autouse=True)
def perfmon_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh 0700 socket directory in PERFMON_DIR, inherited by subprocesses. Short, as the default
    ones are (``probe.paths.socket_dir``): a torchrun job's socket name is 60 bytes or more, and under
    pytest's deeper temporary directories (pytest-xdist's) its path would pass the 107 a Unix socket takes."""
    path = Path(tempfile.mkdtemp(prefix="pm-"))
    monkeypatch.setenv("PERFMON_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, the work units go out in the order ``_share_out`` gives, not by their number of tests."""
    if config.pluginmanager.hasplugin("xdist"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)      # before pytest-xdist reads the groups (after pytest-randomly's shuffle)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests under ``SLOW_DIRS`` are ``slow``; ``gpu`` tests run only where CUDA is, and elsewhere are
    skipped, saying so."""
    for item in items:
        parts = Path(str(item.path)).resolve().relative_to(TESTS).parts
        if parts and parts[0] in SLOW_DIRS:
            item.add_marker(pytest.mark.slow)
    if config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") != "no":
        _share_out(items)
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


def _work_unit(item: pytest.Item) -> str:
    """What one worker runs as a whole: a module, whose module-scoped jobs then start once; in the
    compatibility matrix, a cell, whose bare and watched runs (``tests/compat/runs.py``) its tests share."""
    cell = item.get_closest_marker("cell")
    params = getattr(item, "callspec", None)
    if cell is not None:
        return f"cell:{cell.args[0]}"
    if params is not None and Path(str(item.path)).parent.name == "compat" and "name" in params.params:
        return f"cell:{params.params['name']}"
    return item.nodeid.split("::")[0]


def _share_out(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n 2 --dist loadgroup``): each work unit goes to one worker, the units with
    the most processes to start first, so that the last ones handed out are short and both workers
    finish together. The order within a weight stays pytest-randomly's."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        unit = _work_unit(item)
        item.add_marker(pytest.mark.xdist_group(unit))
        units.setdefault(unit, []).append(item)
    weight = {unit: sum(20 if i.get_closest_marker("slow") else 1 for i in unit_items)
              for unit, unit_items in units.items()}
    items.sort(key=lambda item: -weight[_work_unit(item)])


@pytest.fixture(autouse=True)
def _no_real_cuda(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside ``gpu`` tests the probe's real CUDA backend reads as never initialized, as on a machine
    without a GPU: on a GPU machine an earlier test in this process may have initialized CUDA and
    allocated on it, and the probe would rightly judge this process a CUDA job. A test that wants a GPU
    asks for one: the simulated device layer (``simulated_cuda``) or the ``gpu`` marker."""
    if request.node.get_closest_marker("gpu") is None:
        from probe.gpu import cuda
        monkeypatch.setattr(cuda.TorchCuda, "ready", lambda self: False)


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


class ProcessInFastTest(AssertionError):
    """A test not marked ``slow`` started a process."""


# Every way this interpreter starts a process, each patched where it is looked up at call time:
# subprocess, os.popen and multiprocessing's spawn/forkserver helpers reach ``fork_exec``; os.spawn*
# and multiprocessing's fork start reach ``os.fork``; the rest are calls of their own into libc.
PROCESS_STARTS = [(subprocess.Popen, "_execute_child", "subprocess"),
                  (_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec"),
                  (multiprocessing.process.BaseProcess, "start", "multiprocessing"),
                  *((os, name, f"os.{name}") for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
                    if hasattr(os, name))]


@pytest.fixture(autouse=True)
def _no_process_in_fast_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail a test that is not ``slow`` as soon as it starts a process (``PROCESS_STARTS``: a
    subprocess, a fork, a spawn, a shell, a multiprocessing child): starting interpreters is what
    makes a tier slow."""
    if request.node.get_closest_marker("slow"):
        return
    name = request.node.nodeid

    def refuse(what: str):
        def start(*args, **kwargs):
            raise ProcessInFastTest(f"{name} starts a process ({what}): mark it @pytest.mark.slow")
        return start

    for owner, attr, what in PROCESS_STARTS:
        monkeypatch.setattr(owner, attr, refuse(what))
