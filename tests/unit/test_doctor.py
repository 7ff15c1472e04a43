"""``perfmon doctor``: every check passes on a correct measurement and FAILS on a planted measurement
error. The CPU workloads run for real (in-process); the GPU workloads run on the SIMULATED device
layer (tests/sim: real CUDA timing semantics) on a simulated GPU host."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
import types

import pytest
import torch

from tests.sim.simulated_cuda import SimulatedDeviceTensor, SimulatedEvent
from tests.sim.simulated_pynvml import NVML_ERROR_NOT_SUPPORTED, SimulatedGpu
from tui.commands import doctor
from tui.commands.doctor import checks as C, gpu as G, workloads
from tui.commands.doctor.workloads import nvml_support

# the doctor's checks run their planted workloads for real, a second or more each: the slow tier
pytestmark = pytest.mark.slow


class SimDevice:
    """``doctor.Device`` on the simulated GPU: kernels go on its stream (full ones fill every SM, narrow ones
    one of 132, as a one-block kernel on an H100), syncs block and warn."""

    name = "simulated H100"
    LAUNCH_S = 0.0005
    SMS = 132

    def __init__(self, cuda) -> None:
        self.cuda = cuda

    def attach(self, mon) -> None:
        self.model = torch.nn.Linear(8, 8)       # kept: the probe holds a watched model weakly
        self.cuda.place(self.model)              # model.cuda(): its parameters live on the simulated GPU
        mon.watch(model=self.model, syncs=True)

    def kernels(self, seconds: float) -> None:
        for _ in range(max(1, round(seconds / self.LAUNCH_S))):   # launches of matmul length, as on a GPU
            self.cuda.run(self.LAUNCH_S)

    def narrow_kernels(self, seconds: float) -> None:
        for _ in range(max(1, round(seconds / self.LAUNCH_S))):
            self.cuda.run(self.LAUNCH_S, fill=1 / self.SMS)

    def tiny_kernels(self, n: int) -> None:
        for _ in range(n):                       # each launch costs the host ~20 us, the device 1 us
            end = time.perf_counter() + 20e-6
            while time.perf_counter() < end:
                pass
            self.cuda.run(1e-6)

    def sync(self) -> None:
        self.cuda.synchronizing_op()

    def result(self):
        return SimulatedDeviceTensor(self.cuda, 1.0)

    def read(self, result) -> float:
        return result.item()

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
        reps = 10                                 # one synchronize's wake-up late, over ten kernels
        self.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            self.cuda.run(seconds)
        self.cuda.synchronize()
        return (time.perf_counter() - t0) / reps

    def hybrid(self):
        model = _Hybrid(self.cuda)
        host = sum(p.numel() * p.element_size() for p in model.embed.parameters())
        return model, torch.randint(0, 256, (32,)), host / sum(p.numel() * p.element_size() for p in model.parameters())

    def uuid(self) -> str | None:
        return self.cuda.uuid


class _Hybrid(torch.nn.Module):
    def __init__(self, cuda) -> None:
        super().__init__()
        self.cuda = cuda
        self.embed = torch.nn.Embedding(256, 256)                 # in host memory
        self.layers = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
        cuda.place(self.layers)                                   # .cuda()

    def forward(self, x):
        self.cuda.run(0.001)
        return self.layers(self.embed(x))


@pytest.fixture
def gpu_host(simulated_cuda, simulated_nvml, monkeypatch):
    """A machine with one GPU, as the probe's own detection sees it: NVML lists the simulated GPU (its
    utilization, and with ``gpm=True`` its GPM SM activity, measured on the simulated stream), torch
    reports CUDA available, and CUDA calls reach the simulated backend. ``gpu_host(util=...)`` gives an
    NVML that reports a fixed utilization, ``gpu_host(sm_fixed=20.0)`` a GPM whose SM activity is fixed
    whatever the kernels fill."""

    def install(gpm: bool = False, sm_fixed: float | None = None, **nvml_kwargs) -> SimDevice:
        monkeypatch.setattr(workloads, "GPU_SECONDS", 1.0)   # a second of 20 Hz samples: enough here, and cheap
        cuda = simulated_cuda()
        counters = dict(SimulatedGpu().gpm) if gpm or sm_fixed is not None else None
        if sm_fixed is not None:
            counters[2] = sm_fixed
        gpu = SimulatedGpu(timeline=None if "util" in nvml_kwargs else cuda, gpm=counters,
                           sm_from_timeline=sm_fixed is None, **nvml_kwargs)
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
def test_compute_check_passes_for_training_and_fails_for_a_loop_that_only_sleeps():
    good = C.compute_bound()
    assert good.ok is True, good
    # a loop that only sleeps: the training thread's CPU clock says ~0, so "healthy, busy" cannot pass
    sleeping = C.compute_bound(work=lambda: time.sleep(0.005))
    assert sleeping.ok is False and sleeping.verdict == "FAIL", sleeping


def test_known_wait_check_reads_the_planted_share_and_fails_when_the_wait_is_mismeasured(monkeypatch):
    good = C.loader_wait("known wait in each step", 0.5)
    assert good.ok is True, good
    _skewed(monkeypatch, lambda v: _metric(data_wait_frac=v.metrics.data_wait_frac + 0.1)(v))
    off = C.loader_wait("known wait in each step", 0.5)
    assert off.ok is False and off.verdict == "FAIL", off


def test_starved_loader_check_fails_when_the_loader_wait_is_not_measured(monkeypatch):
    good = C.loader_wait("loop starved by its loader", 3.0)
    assert good.ok is True and good.measured.startswith("data_loading"), good
    _skewed(monkeypatch, _metric(data_wait_frac=0.0))
    blind = C.loader_wait("loop starved by its loader", 3.0)
    assert blind.ok is False, blind


def test_wait_in_step_check_reads_the_planted_share_and_fails_when_the_wait_is_read_as_work(monkeypatch):
    good = C.wait_in_step()
    assert good.ok is True and good.measured.startswith("host_wait"), good
    _skewed(monkeypatch, lambda v: _metric(off_cpu_frac=max(0.0, v.metrics.off_cpu_frac - 0.2))(v))
    off = C.wait_in_step()
    assert off.ok is False, off
    monkeypatch.undo()              # the next error is planted on the real measurement, not on this one
    _skewed(monkeypatch, lambda v: _metric(off_cpu_frac=v.metrics.off_cpu_frac + 0.2)(v))
    over = C.wait_in_step()
    assert over.ok is False, over
    monkeypatch.undo()              # contention read where the thread did not wait for a core
    _skewed(monkeypatch, lambda v: _metric(cpu_contention_frac=(v.metrics.cpu_contention_frac or 0.0) + 0.2)(v))
    queued = C.wait_in_step()
    assert queued.ok is False, queued


def test_wait_in_step_check_holds_on_a_busy_machine_whose_compute_also_waits_for_a_core():
    """Processes taking every core make the loop wait for one, in its compute and as it wakes:
    perfmon's time off CPU plus its CPU contention still match the sleeps plus the run-queue wait the
    kernel counted (the share off CPU alone would not: perfmon's split comes from sampler records
    longer than this job)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range((os.cpu_count() or 1) + 1)]
    try:
        busy = C.wait_in_step()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    queued = re.search(r"waiting for a core (\d+)%", busy.expected)
    assert queued is not None and int(queued[1]) >= 5, busy     # the machine was busy
    assert busy.ok is True, busy


def test_between_steps_check_reads_the_planted_ettr_and_fails_on_an_ettr_off_by_point_two(monkeypatch):
    good = C.between_steps()
    assert good.ok is True, good
    _skewed(monkeypatch, lambda v: _metric(ettr=v.metrics.ettr + 0.2)(v))
    off = C.between_steps()
    assert off.ok is False, off


# -- GPU checks on the simulated GPU host -------------------------------------------------------
GPU_ROWS = {name for name, _ in G.GPU_CHECKS} - {"CPU-only job on the GPU host"}


def _without_the_cpu_row(monkeypatch) -> None:
    """The GPU rows alone: the CPU-only row trains a real CPU model (slow tests below check it)."""
    monkeypatch.setattr(G, "cpu_job_on_gpu_host", lambda: doctor.Check("CPU-only job on the GPU host", "", "", None))


def test_gpu_checks_pass_on_a_hopper_like_device_that_behaves_like_cuda(gpu_host, monkeypatch):
    _without_the_cpu_row(monkeypatch)
    checks = {c.name: c for c in G.gpu_checks(gpu_host(gpm=True)) if c.name in GPU_ROWS}
    assert set(checks) == GPU_ROWS
    failed = [c for c in checks.values() if c.ok is not True]
    assert not failed, failed


def test_without_gpm_the_fill_rows_say_why_nvml_gave(gpu_host):
    """Before: the "GPM SM activity" row was ok or skipped, never failed. Without GPM (NVML, asked
    directly, says so) the fill rows do not run and say why; the rows that read other measurements are
    the full run's above."""
    device = gpu_host()
    util_why, gpm_why = nvml_support(device.uuid())
    assert util_why is None and gpm_why == "GPM unsupported on this GPU (Hopper and newer have it)"
    rows = G.gpm_fill(device, gpm_why)
    assert [(c.name, c.ok) for c in rows] == [("GPM SM fill", None), ("narrow kernels back to back", None)]
    assert all(c.measured == f"not run: {gpm_why}" for c in rows)


def _lying_events(cuda) -> None:
    """Plant: every CUDA event reads three times the time between it and its partner."""
    class Lying(SimulatedEvent):
        def elapsed_time(self, other):
            return 3 * super().elapsed_time(other)

    cuda.new_event = lambda: Lying(cuda)


def test_cuda_timing_reads_perfmons_own_step_timer_and_fails_on_events_that_lie(gpu_host):
    """Before: the row timed torch's events around a kernel, not perfmon's step timer."""
    device = gpu_host()
    assert G.cuda_timing(device).ok is True
    _lying_events(device.cuda)
    lying = G.cuda_timing(device)
    assert lying.ok is False and lying.verdict == "FAIL", lying


def test_cuda_timing_fails_on_a_broken_step_timer(gpu_host, monkeypatch):
    """Plant: the step timer reads the step from its first event to its forward's end, not its last."""
    from probe.gpu import cuda as gpu_cuda

    real = gpu_cuda.StepTimer._result

    def broken(self, done, seen):
        result = real(self, done, seen)
        result["gpu_time"] = result["gpu_time"] / 2
        return result

    monkeypatch.setattr(gpu_cuda.StepTimer, "_result", broken)
    check = G.cuda_timing(gpu_host())
    assert check.ok is False, check


def test_nvml_row_reads_utilization_itself_and_fails_when_nvml_reports_a_busy_gpu(gpu_host):
    good = {c.name: c for c in G.half_idle(gpu_host(), None)}
    assert good["NVML utilization"].ok is True and good["GPU idle half of each step"].ok is True
    checks = {c.name: c for c in G.half_idle(gpu_host(util=95), None)}    # NVML's figure, whatever the stream did
    assert checks["NVML utilization"].ok is False and checks["GPU idle half of each step"].ok is False


def test_nvml_row_does_not_pass_on_gpm_when_utilization_is_unreadable(gpu_host):
    """Before: "NVML utilization readable" passed on a busy that GPM gave. NVML asked directly says it
    gives no utilization: the row does not run (and never reads ok)."""
    device = gpu_host(gpm=True, errors={"nvmlDeviceGetUtilizationRates": NVML_ERROR_NOT_SUPPORTED})
    util_why, gpm_why = nvml_support(device.uuid())
    assert util_why is not None and gpm_why is None
    nvml = {c.name: c for c in G.half_idle(device, util_why)}["NVML utilization"]
    assert nvml.ok is None and nvml.measured.startswith("not run: NVML gives no utilization")


def test_half_idle_verdict_row_fails_when_queued_whole_is_misread_and_not_on_a_late_lead(gpu_host, monkeypatch):
    """Plant: the step timer says every step was queued whole (the host looks a step ahead of an idle
    device): the row fails. A lead read 10 s late (a poller kept from the GIL) alone does not fool it."""
    from probe.gpu import cuda as gpu_cuda

    real = gpu_cuda.StepTimer._result
    monkeypatch.setattr(gpu_cuda.StepTimer, "_result", lambda self, done, seen: real(self, done, seen + 10.0))
    late = {c.name: c for c in G.half_idle(gpu_host(), None)}
    assert late["GPU idle half of each step"].ok is True, late

    def whole(self, done, seen):
        done.whole = True
        return real(self, done, seen)
    monkeypatch.setattr(gpu_cuda.StepTimer, "_result", whole)
    checks = {c.name: c for c in G.half_idle(gpu_host(), None)}
    assert checks["GPU idle half of each step"].ok is False, checks


def test_back_to_back_check_fails_when_busy_under_reads_a_gpu_bound_job(gpu_host, monkeypatch):
    """Kernels never stop. Busy has two sources (NVML, and the steps' CUDA timeline where the host queues
    each step whole), so plant both errors: NVML at 40% and no step queued whole, every lead read 0."""
    from probe.gpu import cuda as gpu_cuda

    real = gpu_cuda.StepTimer._result

    def not_whole(self, done, seen):
        done.whole = False
        return real(self, done, done.host_end)
    monkeypatch.setattr(gpu_cuda.StepTimer, "_result", not_whole)
    check = G.back_to_back(gpu_host(util=40))
    assert check.ok is False and "busy 40%" in check.measured, check


def test_gpm_row_fails_when_gpm_disagrees_with_the_planted_fill(gpu_host):
    """Before: the GPM row could only be ok or skipped. Plant: GPM reads 20% SM activity whatever the
    kernels fill, so full kernels back to back read 20% fill."""
    rows = {c.name: c for c in G.gpm_fill(gpu_host(gpm=True), None)}
    assert rows["GPM SM fill"].ok is True and rows["narrow kernels back to back"].ok is True
    rows = {c.name: c for c in G.gpm_fill(gpu_host(sm_fixed=20.0), None)}
    assert rows["GPM SM fill"].ok is False, rows["GPM SM fill"]


def test_gpm_rows_fail_when_gpm_reads_narrow_kernels_as_full(gpu_host):
    rows = {c.name: c for c in G.gpm_fill(gpu_host(sm_fixed=95.0), None)}
    assert rows["GPM SM fill"].ok is False and rows["narrow kernels back to back"].ok is False, rows


def test_gpm_row_fails_when_nvml_supports_gpm_but_perfmon_reads_none(gpu_host, monkeypatch):
    from probe.gpu import nvml as probe_nvml

    monkeypatch.setattr(probe_nvml, "GPM_METRICS", tuple(m for m in probe_nvml.GPM_METRICS if m[1] != "sm_active"))
    device = gpu_host(gpm=True)
    assert nvml_support(device.uuid())[1] is None                 # NVML, asked directly, has GPM
    rows = {c.name: c for c in G.gpm_fill(device, None)}
    assert rows["GPM SM fill"].ok is False and "n/a" in rows["GPM SM fill"].measured, rows


def test_sync_check_fails_when_the_sync_counter_misses_the_syncs(gpu_host):
    class Unseen(SimDevice):
        def sync(self) -> None:                                   # blocks the host as before, uncounted
            self.cuda.synchronize()

    device = gpu_host()
    check = G.sync_every_step(Unseen(device.cuda))
    assert check.ok is False and "syncs/step 0.00" in check.measured, check


def test_a_sync_on_a_device_that_never_idles_is_not_host_sync_and_fails_when_nvml_under_reads(gpu_host):
    assert G.sync_never_idle(gpu_host()).ok is True
    check = G.sync_never_idle(gpu_host(util=40))                # NVML reads the busy device 40% busy
    assert check.ok is False and check.measured.startswith("host_sync"), check


def test_launch_bound_check_fails_when_nvml_reports_a_busy_gpu(gpu_host):
    check = G.launch_bound(gpu_host(util=95))
    assert check.ok is False, check


def test_hybrid_model_row_fails_when_the_device_is_the_first_parameters(gpu_host, monkeypatch):
    """Plant: the job's device from its first parameter only (the CPU embedding), as before."""
    from probe import watch

    device = gpu_host()
    assert G.hybrid_model(device).ok is True
    real = watch.job_placement
    monkeypatch.setattr(watch, "job_placement", lambda params, step: real(list(params)[:1], None))
    check = G.hybrid_model(device)
    assert check.ok is False and check.measured.startswith("cpu job"), check


def test_cpu_job_check_fails_when_the_cpu_job_reads_as_a_gpu_job(monkeypatch):
    good = C.cpu_job_on_gpu_host()                                # no GPU here: the job reads as cpu
    assert good.ok is True, good
    _skewed(monkeypatch, lambda v: dataclasses.replace(v, device_type="cuda"))
    assert C.cpu_job_on_gpu_host().ok is False


def test_a_cpu_job_on_a_gpu_host_gets_a_cpu_verdict(gpu_host):
    gpu_host()
    check = C.cpu_job_on_gpu_host()
    assert check.ok is True, check


# -- the table and the command ------------------------------------------------------------------
def test_without_a_gpu_the_gpu_checks_say_why_and_do_not_fail():
    checks = G.gpu_checks(None, "not run: no CUDA GPU visible to torch")
    assert {c.name for c in checks} == {name for name, _ in G.GPU_CHECKS}
    assert all(c.ok is None and c.measured == "not run: no CUDA GPU visible to torch" for c in checks)


def test_table_lists_every_check_and_counts_failures():
    checks = [doctor.Check("a", "healthy", "healthy: fine", True),
              doctor.Check("b", "host_sync", "host_overhead", False),
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
