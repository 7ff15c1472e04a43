"""The checks. Each plants a known truth in a short workload, measures that truth with a clock the
probe does not use (the training thread's CPU clock and run-queue wait, the workload's own
``perf_counter`` around what it planted, the host clock across a device synchronize, the kernel
lengths it chose), and compares it with what perfmon reports. A check passes only when the two
agree, so a broken measurement fails it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from tui.commands.doctor.table import Check
from tui.commands.doctor.workloads import (STEPS, WINDOW, Device, Mlp, gpu_steps, one_thread, run_job,
                                           run_queue_wait)
from perfmon_analysis import units

# The probe counts a step's time as CPU busy unless a measured cause took it. The kernel's clocks say
# how much of it the training thread wanted a CPU: on one (its CPU clock) or waiting for one on a
# loaded machine (its run-queue wait; where the kernel does not expose it, the CPU clock alone is a
# lower bound). A loop that does not compute is near 0 on both.
CPU_AGREE = 0.25
SHARE_TOL = 0.05          # a planted loss, read back as a share of the step
ETTR_TOL = 0.05
PAUSE_EVERY = 5           # the between-steps check's checkpoint cadence: a pause, not the loop's own work
EVENTS_REL, EVENTS_ABS = 0.10, 0.0005    # CUDA events against the host clock: launch and sync costs
BUSY_TOL = 0.10           # the device's busy reading against the planted kernel share
FULL_BUSY_MIN = 0.75      # kernels back to back: a busy source that reads them lower misjudges GPU-bound jobs
KERNEL_S = 0.020


def _leaf(view: Any) -> str:
    from perfmon_analysis.verdict import evaluate

    return evaluate(view).bottleneck


def _share(view: Any, loss_id: str) -> float | None:
    from perfmon_analysis.losses import account

    return next((loss.share for loss in account(view.metrics, view.device_type) if loss.id == loss_id), None)


def _pts(x: float) -> str:
    return f"{x * 100:.0f} pts"


_pct = units.pct


def _num(x: float | None) -> str:
    return units.NA if x is None else f"{x:.2f}"


def _ms(x: float | None) -> str:
    return units.NA if x is None else f"{x * 1000:.1f} ms"


def _watched(mon: Any, mlp: Mlp) -> float:
    """Watch the model, warm it up, and return one step's compute time by the loop's own clock."""
    mon.watch(model=mlp.model, optimizer=mlp.opt)
    mlp.work()
    t0 = time.perf_counter()
    mlp.work()
    return time.perf_counter() - t0


# -- on every machine ------------------------------------------------------------------------------
def compute_bound(work: Callable[[], None] | None = None) -> Check:
    """A loop of training steps: healthy, with a CPU busy the training thread's CPU clock confirms.
    ``work`` replaces the step's compute (a test plants a loop that only sleeps)."""
    mlp = Mlp()
    step_work = work or mlp.work
    start: list[Any] = []
    end: list[Any] = []

    def clocks() -> tuple[float, float | None, float]:
        return time.thread_time(), run_queue_wait(), time.perf_counter()

    def body(mon: Any) -> None:
        _watched(mon, mlp)
        for i in range(STEPS):
            if i == STEPS - WINDOW:
                start.extend(clocks())
            with mon.step(samples=len(mlp.x)):
                step_work()
        end.extend(clocks())

    with one_thread():
        view = run_job("compute", body)
    wall = end[2] - start[2]
    on_cpu = (end[0] - start[0]) / wall
    queued = (end[1] - start[1]) / wall if start[1] is not None and end[1] is not None else None
    wanted = on_cpu + (queued or 0.0)
    busy, leaf = view.metrics.device_busy, _leaf(view)
    ok = leaf == "healthy" and busy is not None and abs(busy - wanted) <= CPU_AGREE
    return Check("compute-bound loop", f"healthy, CPU busy = thread on/waiting for CPU ± {_pts(CPU_AGREE)}",
                 f"{leaf}, CPU busy {_pct(busy)}; training thread on CPU {_pct(on_cpu)}, "
                 f"waiting for a core {_pct(queued)}", ok)


def loader_wait(name: str, ratio: float) -> Check:
    """The same loop fed by a loader that sleeps ``ratio`` times the step's compute: a data wait of
    the share the loader's own clock planted, named by the verdict as data loading."""
    mlp = Mlp()
    slept: list[float] = []
    spans: list[float] = []

    def body(mon: Any) -> None:
        wait = ratio * _watched(mon, mlp)

        def batches() -> Iterator[Any]:
            while True:
                t0 = time.perf_counter()
                time.sleep(wait)              # a loader waiting on slow storage: no CPU used
                slept.append(time.perf_counter() - t0)
                yield mlp.x

        it = iter(mon.loader(batches()))
        for _ in range(STEPS):
            t0 = time.perf_counter()          # loader wait + step: the probe's active step time
            xb = next(it)
            with mon.step(samples=len(xb)):
                mlp.work()
            spans.append(time.perf_counter() - t0)

    with one_thread():
        view = run_job(name.replace(" ", "-"), body)
    planted = sum(slept[-WINDOW:]) / sum(spans[-WINDOW:])
    share, leaf = _share(view, "data_wait"), _leaf(view)
    ok = leaf == "data_loading" and share is not None and abs(share - planted) <= SHARE_TOL
    return Check(name, f"data_loading, data wait {_pct(planted)} ± {_pts(SHARE_TOL)}",
                 f"{leaf}, data wait {_pct(share)}", ok)


def wait_in_step(ratio: float = 0.6) -> Check:
    """The loop with an unhooked wait inside each step (a call to a slow service, standing in for an
    RPC, a lock, a file read): ``ratio`` times the step's compute asleep between forward and the
    rest. The off-CPU loss must be the share the loop's own clock planted, named ``host_wait``."""
    mlp = Mlp()
    slept: list[float] = []
    spans: list[float] = []

    def body(mon: Any) -> None:
        wait = ratio * _watched(mon, mlp)
        for _ in range(STEPS):
            t0 = time.perf_counter()
            with mon.step(samples=len(mlp.x)):
                mlp.work()
                t1 = time.perf_counter()
                time.sleep(wait)              # the service answers: no CPU used, nothing perfmon hooks
                slept.append(time.perf_counter() - t1)
            spans.append(time.perf_counter() - t0)

    with one_thread():
        view = run_job("wait-in-step", body)
    planted = sum(slept[-WINDOW:]) / sum(spans[-WINDOW:])
    share, leaf = _share(view, "device_idle"), _leaf(view)
    # a sleep's wall time includes the wake-up's wait for a core, which perfmon measures apart as
    # CPU contention: the two together are the thread's time off CPU that the sleep planted
    queued = view.metrics.cpu_contention_frac or 0.0
    off = share + queued if share is not None else None
    ok = leaf == "host_wait" and off is not None and abs(off - planted) <= SHARE_TOL
    return Check("unhooked wait in each step", f"host_wait, off CPU {_pct(planted)} ± {_pts(SHARE_TOL)}",
                 f"{leaf}, off CPU {_pct(share)} + waiting for a core {_pct(queued)}", ok)


def between_steps(ratio: float = 1.0) -> Check:
    """The loop with ``ratio`` times its steps' compute spent in pauses between them (a checkpoint every
    ``PAUSE_EVERY`` steps): ETTR is the share of wall time in the loop by the loop's own clock. A pause
    between every two steps would be the loop's own work, a loss of its own, not ETTR's."""
    mlp = Mlp()
    inside: list[float] = []
    span: list[float] = []

    def body(mon: Any) -> None:
        pause = ratio * PAUSE_EVERY * _watched(mon, mlp)
        first = time.perf_counter()
        for i in range(STEPS):
            t0 = time.perf_counter()
            with mon.step(samples=len(mlp.x)):
                mlp.work()
            inside.append(time.perf_counter() - t0)
            if i < STEPS - 1 and i % PAUSE_EVERY == PAUSE_EVERY - 1:
                time.sleep(pause)
        span.append(time.perf_counter() - first)

    with one_thread():
        view = run_job("between-steps", body)
    planted = sum(inside) / span[0]
    ettr = view.metrics.ettr
    ok = ettr is not None and abs(ettr - planted) <= ETTR_TOL
    return Check("time between steps", f"ETTR {_num(planted)} ± {ETTR_TOL}", f"ETTR {_num(ettr)}", ok)


def cpu_checks() -> list[Check]:
    """The workloads every machine can run."""
    return [compute_bound(), loader_wait("known wait in each step", 0.5),
            loader_wait("loop starved by its loader", 3.0), wait_in_step(), between_steps()]


# -- with a GPU ------------------------------------------------------------------------------------
EVENTS_EXPECTED = "= host clock ± 10%"
SYNC_EXPECTED = "host_sync, 1 sync/step"
CPU_JOB_EXPECTED = "cpu job: healthy"
FULL_EXPECTED = f"healthy, busy ≥ {units.pct(FULL_BUSY_MIN)}"
GPU_CHECKS = (("CUDA events time a kernel", EVENTS_EXPECTED), ("GPU busy back to back", FULL_EXPECTED),
              ("NVML utilization", "readable"),
              ("GPU idle half of each step", "busy = kernel share × back-to-back busy ± 10 pts, host_overhead"),
              ("a sync every step", SYNC_EXPECTED), ("launch-bound tiny kernels", "host_overhead"),
              ("CPU-only job on the GPU host", CPU_JOB_EXPECTED))


def events_vs_host(device: Device, seconds: float = KERNEL_S) -> Check:
    """A kernel timed by CUDA events and by the host clock from one synchronize to the next."""
    device.synchronize()
    t0 = time.perf_counter()
    events = device.event_elapsed(seconds)
    device.synchronize()
    host = time.perf_counter() - t0
    ok = abs(events - host) <= EVENTS_REL * host + EVENTS_ABS
    return Check("CUDA events time a kernel", EVENTS_EXPECTED,
                 f"events {_ms(events)}, host clock {_ms(host)} (kernel of {_ms(seconds)})", ok)


def _host_work(seconds: float) -> None:
    """Python on the host's CPU for ``seconds``: a host-bound step's overhead. (A sleep would be a
    host that waits, which the verdict tells apart: ``host_wait``.)"""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))


def _busy(view: Any) -> tuple[float | None, str]:
    """The job's own GPU busy reading and what measured it ("sm_active", "nvml_util"), as the verdict
    reads it; None on a view that is not a CUDA job's."""
    m = view.metrics
    busy = m.device_busy if view.device_type == "cuda" else None     # the GPU's own reading, not step accounting
    return busy, m.device_busy_source or "no source"


def back_to_back(device: Device) -> tuple[Check, float | None]:
    """Steps of kernels with no host work between them: the device never idles, so the job is GPU-bound
    (healthy), and busy reads the kernels' own fill (NVML utilization ~100%; SM activity the share of SMs
    their blocks occupy). Returns the check and that reading, which scales the half-idle expectation."""
    def body(mon: Any) -> None:
        for _ in gpu_steps():
            with mon.step():
                device.kernels(0.010)

    view = run_job("gpu-back-to-back", body, device=device)
    busy, source = _busy(view)
    leaf = _leaf(view)
    ok = busy is not None and busy >= FULL_BUSY_MIN and leaf == "healthy"
    return Check("GPU busy back to back", FULL_EXPECTED, f"{leaf}, busy {_pct(busy)} ({source})", ok), busy


def half_idle(device: Device, full: float | None = None) -> list[Check]:
    """Kernels of 10 ms in steps of ~20 ms of host work: the busy reading is the planted kernel share,
    scaled by what the same kernels read back to back (``full``: SM activity counts the SMs a kernel
    leaves empty too). The share is the kernels' length measured on the host clock after the run (the
    GPU's clocks settle while it runs) over the run's wall time."""
    calls: list[float] = []

    def body(mon: Any) -> None:
        n, t0 = 0, time.perf_counter()
        for _ in gpu_steps():
            with mon.step():
                device.kernels(0.010)
                _host_work(0.020)             # host work the device does not see
            n += 1
        calls[:] = [n, time.perf_counter() - t0]

    view = run_job("gpu-half-idle", body, device=device)
    n, wall = calls
    planted = n * device.kernel_seconds(0.010) / wall
    expected = planted * (full if full is not None and full > 0 else 1.0)
    busy, source = _busy(view)
    has_gpm = source == "sm_active" or any(row.gpu.sm_active is not None for row in view.gpus)
    leaf = _leaf(view)
    return [
        Check("NVML utilization", "readable", "not measured (NVML unavailable)" if busy is None
              else f"busy {_pct(busy)} ({source})", busy is not None),
        Check("GPM SM activity", "available on Hopper and newer",
              "available" if has_gpm else "not supported by this GPU/driver", True if has_gpm else None),
        Check("GPU idle half of each step",
              f"busy {_pct(expected)} ± {_pts(BUSY_TOL)} (kernels {_pct(planted)}), host_overhead",
              f"busy {_pct(busy)}, {leaf}",
              busy is not None and abs(busy - expected) <= BUSY_TOL and leaf == "host_overhead")]


def sync_every_step(device: Device) -> Check:
    """One ``.item()`` per step: host_sync, with one sync counted per step."""
    def body(mon: Any) -> None:
        for _ in gpu_steps():
            with mon.step():
                time.sleep(0.010)
                device.kernels(0.010)
                device.sync()

    view = run_job("gpu-sync", body, device=device)
    syncs, leaf = view.metrics.syncs_per_step, _leaf(view)
    return Check("a sync every step", SYNC_EXPECTED, f"{leaf}, syncs/step {_num(syncs)}",
                 leaf == "host_sync" and syncs is not None and abs(syncs - 1) <= 0.25)


def launch_bound(device: Device) -> Check:
    """Steps of 400 tiny kernels: the host's launches take the step, the device mostly idles."""
    def body(mon: Any) -> None:
        for _ in gpu_steps():
            with mon.step():
                device.tiny_kernels(400)

    view = run_job("gpu-launch-bound", body, device=device)
    busy, leaf = view.metrics.device_busy, _leaf(view)
    return Check("launch-bound tiny kernels", "host_overhead", f"{leaf}, busy {_pct(busy)}", leaf == "host_overhead")


def cpu_job_on_gpu_host() -> Check:
    """The CPU model on a machine with a GPU: the job's device is where its tensors live, so the
    verdict is a CPU one (busy from step accounting), not an idle GPU's."""
    mlp = Mlp()

    def body(mon: Any) -> None:
        _watched(mon, mlp)
        for _ in range(STEPS):
            with mon.step(samples=len(mlp.x)):
                mlp.work()

    with one_thread():
        view = run_job("cpu-job-on-gpu-host", body)
    leaf = _leaf(view)
    return Check("CPU-only job on the GPU host", CPU_JOB_EXPECTED,
                 f"{view.device_type} job: {leaf} (busy from {view.metrics.device_busy_source})",
                 view.device_type == "cpu" and leaf == "healthy")


def gpu_checks(device: Device | None, why_not: str = "not run: --cpu-only") -> list[Check]:
    """The GPU workloads; without a device each says why it did not run."""
    if device is None:
        return [Check(name, expected, why_not, None) for name, expected in GPU_CHECKS]
    full, full_busy = back_to_back(device)
    return [events_vs_host(device), full, *half_idle(device, full_busy), sync_every_step(device),
            launch_bound(device), cpu_job_on_gpu_host()]
