"""Fixtures that install the SIMULATED device layer (import them into a test module)."""

from __future__ import annotations

import sys
from typing import Any, Callable

import pytest

from tests.sim import simulated_pynvml
from tests.sim.simulated_cuda import SimulatedCuda


@pytest.fixture
def simulated_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Factory: ``simulated_nvml([SimulatedGpu(...)], init_error=None)`` installs a simulated
    ``pynvml`` in ``sys.modules`` and returns it."""

    def install(devices: list[simulated_pynvml.SimulatedGpu] | None = None, **kwargs: Any) -> Any:
        module = simulated_pynvml.build(devices, **kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


@pytest.fixture
def simulated_cuda(monkeypatch: pytest.MonkeyPatch) -> Callable[..., SimulatedCuda]:
    """Factory: ``simulated_cuda(stats=..., lag=...)`` replaces ``probe.gpu.cuda.backend``."""
    from probe.gpu import cuda

    def install(**kwargs: Any) -> SimulatedCuda:
        backend = SimulatedCuda(**kwargs)
        monkeypatch.setattr(cuda, "backend", backend)
        return backend

    return install
