"""Fixtures that install the SIMULATED device layer (import them into a test module)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

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


@pytest.fixture
def cuda_peak_resets(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every way torch offers to reset the CUDA allocator's peak/accumulated statistics, replaced by a
    recorder: the returned list names each reset the code under test asked for (it must stay empty:
    resetting would break the user's own peak tracking). Nothing here talks to a GPU."""
    import torch

    calls: list[str] = []
    targets = [torch.cuda, torch.cuda.memory, torch._C] + ([torch.accelerator] if hasattr(torch, "accelerator") else [])
    for module in targets:
        for name in dir(module):
            low = name.lower()
            if "reset" in low and ("peak" in low or "max_memory" in low or "accumulated" in low
                                   or "memory_stat" in low):
                if callable(getattr(module, name, None)):
                    monkeypatch.setattr(module, name,
                                        lambda *a, _n=f"{module.__name__}.{name}", **k: calls.append(_n))
    return calls
