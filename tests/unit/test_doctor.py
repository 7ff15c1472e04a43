"""``perfmon doctor``: every check passes on a correct measurement and FAILS on a planted measurement
error. The CPU workloads run for real (in-process); the GPU workloads run on the SIMULATED device
layer (tests/sim: real CUDA timing semantics) on a simulated GPU host."""

from __future__ import annotations

import dataclasses
import time
import types

import pytest
import torch

from tests.sim.fixtures import simulated_cuda, simulated_nvml  # noqa: F401  (fixtures)
from tests.sim.simulated_pynvml import SimulatedGpu
from tui.commands import doctor
from tui.commands.doctor import checks as C


class SimDevice:
    """``doctor.Device`` on the simulated GPU: kernels go on its stream, syncs block and warn."""

    name = "simulated H100"
    LAUNCH_S = 0.0005

    def __init__(self, cuda) -> None:
        self.cuda = cuda

    def attach(self, mon) -> None:
        self.model = torch.nn.Linear(8, 8)       # kept: the probe holds a watched model weakly
        self.cuda.place(self.model)              # model.cuda(): its parameters live on the simulated GPU
        mon.watch(model=self.model, syncs=True)

    def kernels(self, seconds: float) -> None:
        for _ in range(max(1, round(seconds / self.LAUNCH_S))):   # launches of matmul length, as on a GPU
            self.cuda.run(self.LAUNCH_S)

    def tiny_kernels(self, n: int) -> None:
        for _ in range(n):                       # each launch costs the host ~20 us, the device 1 us
            end = time.perf_counter() + 20e-6
            while time.perf_counter() < end:
                pass
            self.cuda.run(1e-6)

    def sync(self) -> None:
        self.cuda.synchronizing_op()

    def synchronize(self) -> None:
        self.cuda.synchronize()

    def event_elapsed(self, seconds: float) -> float:
        start, end = self.cuda.new_event(), self.cuda.new_event()
        self.cuda.record_on(start)
        self.cuda.run(seconds)
        self.cuda.record_on(end)
        self.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    def kernel_seconds(self, seconds: float) -> float:
        self.cuda.synchronize()
        t0 = time.perf_counter()
        self.cuda.run(seconds)
        self.cuda.synchronize()
        return time.perf_counter() - t0


@pytest.fixture
def gpu_host(simulated_cuda, simulated_nvml, monkeypatch):
    """A machine with one GPU, as the probe's own detection sees it: NVML lists the simulated GPU
    (its utilization measured on the simulated stream), torch reports CUDA available, and CUDA calls
    reach the simulated backend. ``gpu_host(util=...)`` gives an NVML that reports a fixed value."""

    def install(**nvml_kwargs) -> SimDevice:
        cuda = simulated_cuda()
        gpu = SimulatedGpu(gpm=None, **nvml_kwargs) if nvml_kwargs else SimulatedGpu(timeline=cuda, gpm=None)
        simulated_nvml([gpu])
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        return SimDevice(cuda)

    return install


def _skewed(monkeypatch, change):
    """Plant a measurement error: every view the checks read has ``change(view)`` applied."""
    real = C.run_job
    monkeypatch.setattr(C, "run_job", lambda *a, **k: change(real(*a, **k)))


def _metric(**values):
    return lambda view: dataclasses.replace(view, metrics=dataclasses.replace(view.metrics, **values))


# -- CPU checks --------------------------------------------------------------------------------
@pytest.mark.slow
def test_compute_check_passes_for_training_and_fails_for_a_loop_that_only_sleeps():
    good = C.compute_bound()
    assert good.ok is True, good
    # a loop that only sleeps: the training thread's CPU clock says ~0, so "healthy, busy" cannot pass
    sleeping = C.compute_bound(work=lambda: time.sleep(0.005))
    assert sleeping.ok is False and sleeping.verdict == "FAIL", sleeping


@pytest.mark.slow
def test_known_wait_check_reads_the_planted_share_and_fails_when_the_wait_is_mismeasured(monkeypatch):
    good = C.loader_wait("known wait in each step", 0.5)
    assert good.ok is True, good
    _skewed(monkeypatch, lambda v: _metric(data_wait_frac=v.metrics.data_wait_frac + 0.1)(v))
    off = C.loader_wait("known wait in each step", 0.5)
    assert off.ok is False and off.verdict == "FAIL", off


@pytest.mark.slow
def test_starved_loader_check_fails_when_the_loader_wait_is_not_measured(monkeypatch):
    good = C.loader_wait("loop starved by its loader", 3.0)
    assert good.ok is True and good.measured.startswith("data_loading"), good
    _skewed(monkeypatch, _metric(data_wait_frac=0.0))
    blind = C.loader_wait("loop starved by its loader", 3.0)
    assert blind.ok is False, blind


@pytest.mark.slow
def test_wait_in_step_check_reads_the_planted_share_and_fails_when_the_wait_is_read_as_work(monkeypatch):
    good = C.wait_in_step()
    assert good.ok is True and good.measured.startswith("host_wait"), good
    _skewed(monkeypatch, lambda v: _metric(off_cpu_frac=max(0.0, v.metrics.off_cpu_frac - 0.2))(v))
    off = C.wait_in_step()
    assert off.ok is False, off


@pytest.mark.slow
def test_between_steps_check_reads_the_planted_ettr_and_fails_on_an_ettr_off_by_point_two(monkeypatch):
    good = C.between_steps()
    assert good.ok is True, good
    _skewed(monkeypatch, lambda v: _metric(ettr=v.metrics.ettr + 0.2)(v))
    off = C.between_steps()
    assert off.ok is False, off


# -- GPU checks on the simulated GPU host -------------------------------------------------------
def test_gpu_checks_pass_on_a_device_that_behaves_like_cuda(gpu_host):
    device = gpu_host()
    checks = {c.name: c for c in C.gpu_checks(device) if c.name != "CPU-only job on the GPU host"}
    assert set(checks) == {"CUDA events time a kernel", "GPU busy back to back", "NVML utilization", "GPM SM activity",
                           "GPU idle half of each step", "a sync every step", "launch-bound tiny kernels"}
    assert checks["GPM SM activity"].ok is None                    # this simulated GPU has no GPM
    failed = [c for c in checks.values() if c.ok is False]
    assert not failed, failed


def test_events_check_fails_on_a_device_whose_events_lie(gpu_host):
    class Lying(SimDevice):
        def event_elapsed(self, seconds: float) -> float:
            super().event_elapsed(seconds)                        # the kernel runs; its events say 3x
            return seconds * 3

    device = gpu_host()
    assert C.events_vs_host(device).ok is True
    lying = C.events_vs_host(Lying(device.cuda))
    assert lying.ok is False and lying.verdict == "FAIL", lying


def test_half_idle_check_fails_when_nvml_reports_a_busy_gpu(gpu_host):
    device = gpu_host(util=95)                                    # NVML's figure, whatever the stream did
    checks = {c.name: c for c in C.half_idle(device)}
    assert checks["NVML utilization"].ok is True
    assert checks["GPU idle half of each step"].ok is False, checks["GPU idle half of each step"]


def test_back_to_back_check_fails_when_the_busy_source_under_reads_a_gpu_bound_job(gpu_host):
    check, busy = C.back_to_back(gpu_host(util=40))               # kernels never stop; NVML says 40%
    assert busy == pytest.approx(0.40) and check.ok is False, check


def test_half_idle_expectation_is_the_kernel_share_scaled_by_the_back_to_back_reading(gpu_host):
    device = gpu_host()
    honest = {c.name: c for c in C.half_idle(device, full=1.0)}["GPU idle half of each step"]
    assert honest.ok is True, honest
    # kernels that read 50% busy back to back must read about half their share here: a busy reading
    # of the full share is then wrong
    scaled = {c.name: c for c in C.half_idle(device, full=0.5)}["GPU idle half of each step"]
    assert scaled.ok is False, scaled


def test_sync_check_fails_when_the_sync_counter_misses_the_syncs(gpu_host):
    class Unseen(SimDevice):
        def sync(self) -> None:                                   # blocks the host as before, uncounted
            self.cuda.synchronize()

    device = gpu_host()
    check = C.sync_every_step(Unseen(device.cuda))
    assert check.ok is False and "syncs/step 0.00" in check.measured, check


def test_launch_bound_check_fails_when_nvml_reports_a_busy_gpu(gpu_host):
    check = C.launch_bound(gpu_host(util=95))
    assert check.ok is False, check


@pytest.mark.slow
def test_cpu_job_check_fails_when_the_cpu_job_reads_as_a_gpu_job(monkeypatch):
    good = C.cpu_job_on_gpu_host()                                # no GPU here: the job reads as cpu
    assert good.ok is True, good
    _skewed(monkeypatch, lambda v: dataclasses.replace(v, device_type="cuda"))
    assert C.cpu_job_on_gpu_host().ok is False


@pytest.mark.slow
def test_a_cpu_job_on_a_gpu_host_gets_a_cpu_verdict(gpu_host):
    gpu_host()
    check = C.cpu_job_on_gpu_host()
    assert check.ok is True, check


# -- the table and the command ------------------------------------------------------------------
def test_without_a_gpu_the_gpu_checks_say_why_and_do_not_fail():
    checks = C.gpu_checks(None, "not run: no CUDA GPU visible to torch")
    assert {c.name for c in checks} == {name for name, _ in C.GPU_CHECKS}
    assert all(c.ok is None and c.measured == "not run: no CUDA GPU visible to torch" for c in checks)


def test_table_lists_every_check_and_counts_failures():
    checks = [doctor.Check("a", "healthy", "healthy: fine", True), doctor.Check("b", "host_sync", "host_overhead", False),
              doctor.Check("c", "x", "not run: no GPU", None)]
    text = doctor.render(checks, width=80)
    rows = text.splitlines()
    assert rows[0].split()[:3] == ["check", "expected", "verdict"]
    assert [r.split()[2] for r in rows[1:4]] == ["ok", "FAIL", "skip"]
    assert rows[-1] == "3 checks: 1 ok, 1 failed, 1 not run here"
    assert all(len(r) <= 80 for r in rows)


def test_exit_status_is_one_when_any_check_fails(monkeypatch, capsys):
    rows = [doctor.Check("a", "x", "y", True), doctor.Check("b", "x", "y", None)]
    monkeypatch.setattr(doctor, "run_checks", lambda device, why: list(rows))
    assert doctor.main(types.SimpleNamespace(cpu_only=True)) == 0
    rows.append(doctor.Check("c", "x", "y", False))
    assert doctor.main(types.SimpleNamespace(cpu_only=True)) == 1
    assert "1 failed" in capsys.readouterr().out
