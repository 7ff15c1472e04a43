"""``perfmon doctor``: its GPU workloads on the SIMULATED device layer (real CUDA timing semantics:
tests/sim), its table, and its exit status. The CPU workloads run for real in tests/integration."""

from __future__ import annotations

import time
import types

import torch

from probe import gpu
from probe import watch as watch_module
from tests.sim.fixtures import simulated_cuda, simulated_nvml  # noqa: F401  (fixtures)
from tests.sim.simulated_pynvml import SimulatedGpu
from tui.commands import doctor


class SimDevice:
    """``doctor.Device`` on the simulated GPU: kernels go on its stream, syncs block and warn."""

    name = "simulated H100"

    def __init__(self, cuda) -> None:
        self.cuda = cuda

    def attach(self, mon) -> None:
        watcher = watch_module.watch(mon, syncs=True)
        watcher._learn_device([types.SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16)])

    def kernels(self, seconds: float) -> None:
        self.cuda.run(seconds)

    def tiny_kernels(self, n: int) -> None:
        for _ in range(n):                       # each launch costs the host ~20 us, the device 1 us
            end = time.perf_counter() + 20e-6
            while time.perf_counter() < end:
                pass
            self.cuda.run(1e-6)

    def sync(self) -> None:
        self.cuda.synchronizing_op()

    def event_elapsed(self, seconds: float) -> float:
        start, end = self.cuda.new_event(), self.cuda.new_event()
        self.cuda.record_on(start)
        self.cuda.run(seconds)
        self.cuda.record_on(end)
        self.cuda.synchronize()
        return start.elapsed_time(end) / 1e3


def test_gpu_checks_pass_on_a_device_that_behaves_like_cuda(simulated_cuda, simulated_nvml, monkeypatch):
    cuda = simulated_cuda()
    simulated_nvml([SimulatedGpu(timeline=cuda, gpm=None)])
    monkeypatch.setattr(gpu, "_torch_uses_cuda", lambda: None)
    checks = {c.name: c for c in doctor.gpu_checks(SimDevice(cuda))}
    assert set(checks) == {"CUDA events time a kernel", "NVML utilization", "GPM SM activity",
                           "GPU idle half of each step", "a sync every step", "launch-bound tiny kernels"}
    assert checks["GPM SM activity"].ok is None                    # this simulated GPU has no GPM
    failed = [c for c in checks.values() if c.ok is False]
    assert not failed, failed


def test_a_device_whose_events_lie_fails_the_events_check(simulated_cuda, simulated_nvml, monkeypatch):
    cuda = simulated_cuda()
    simulated_nvml([SimulatedGpu(timeline=cuda, gpm=None)])
    monkeypatch.setattr(gpu, "_torch_uses_cuda", lambda: None)

    class Lying(SimDevice):
        def event_elapsed(self, seconds: float) -> float:
            return seconds * 3

    checks = {c.name: c for c in doctor.gpu_checks(Lying(cuda))}
    assert checks["CUDA events time a kernel"].ok is False and checks["CUDA events time a kernel"].verdict == "FAIL"


def test_without_a_gpu_the_gpu_checks_say_why_and_do_not_fail():
    checks = doctor.gpu_checks(None)
    assert checks and all(c.ok is None and c.measured.startswith("not run") for c in checks)


def test_table_lists_every_check_and_counts_failures():
    checks = [doctor.Check("a", "healthy", "healthy: fine", True), doctor.Check("b", "host_sync", "host_overhead", False),
              doctor.Check("c", "x", "not run: no GPU", None)]
    text = doctor.render(checks, width=80)
    rows = text.splitlines()
    assert rows[0].split()[:3] == ["check", "expected", "verdict"]
    assert [r.split()[2] for r in rows[1:4]] == ["ok", "FAIL", "skip"]
    assert rows[-1] == "3 checks: 1 ok, 1 failed, 1 not run here"
    assert all(len(r) <= 80 for r in rows)
