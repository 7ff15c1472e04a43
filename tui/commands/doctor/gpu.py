"""The GPU checks. Each row plants its own truth on the device (kernels of a length and a fill it chose,
host work it timed, syncs it made, a model it split) and compares one of perfmon's measurements with
it; the truth comes from a clock perfmon does not use (the host clock across a device synchronize),
from the workload itself, or from NVML asked directly. No row passes on another row's evidence: the
CUDA timing row reads perfmon's own step timer, the NVML row NVML's utilization as perfmon sampled it,
the fill row GPM's SM activity, the verdict rows the verdict. A row the driver cannot support (NVML
gives no utilization, no GPM before Hopper: asked of NVML directly) does not run and says why; one
the driver supports and perfmon misreads fails.
"""

from __future__ import annotations

import time
from typing import Any

from perfmon_analysis import units
from perfmon_analysis.flowchart import DEVICE_BUSY_MIN, FILL_MIN
from tui.commands.doctor.checks import STEPS, _leaf, _num, _pct, _pts, cpu_job_on_gpu_host
from tui.commands.doctor.table import Check
from tui.commands.doctor.workloads import Device, gpu_steps, nvml_support, run_job

EVENTS_REL, EVENTS_ABS = 0.10, 0.0005    # CUDA timing against the host clock: launch and sync costs
BUSY_TOL = 0.10           # NVML utilization against the planted kernel share
FULL_BUSY_MIN = 0.75      # kernels back to back: a busy reading under this misjudges GPU-bound jobs
NARROW_FILL_MAX = 0.10    # one-block kernels fill one SM of dozens (an H100 has 132): anything near 0
OFFLOAD_TOL = 0.01        # the share of parameter bytes in host memory, against the model's own count
KERNEL_S = 0.020


def _ms(x: float | None) -> str:
    return units.NA if x is None else f"{x * 1000:.1f} ms"


def _kernel_seconds(device: Device, seconds: float) -> float:
    """How long ``kernels(seconds)`` keeps the device busy, on the host clock across a synchronize: the
    least of three readings, since the host can only wake late from a synchronize (a loaded machine),
    never early."""
    return min(device.kernel_seconds(seconds) for _ in range(3))


def _host_work(seconds: float) -> None:
    """Python on the host's CPU for ``seconds``: a host-bound step's overhead. (A sleep would be a
    host that waits, which the verdict tells apart: ``host_wait``.)"""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))


# -- the rows ---------------------------------------------------------------------------------------
def cuda_timing(device: Device, seconds: float = KERNEL_S) -> Check:
    """perfmon's own step timer (CUDA events on a sampled subset of steps) against the host clock: each
    step launches ``seconds`` of kernels and waits for them, so a step's device time is the kernels'."""
    def body(mon: Any) -> None:
        for _ in gpu_steps():
            device.synchronize()
            with mon.step():
                device.kernels(seconds)
            device.synchronize()

    view = run_job("gpu-cuda-timing", body, device=device)
    host = _kernel_seconds(device, seconds)
    timed = view.metrics.device_time_median_s
    ok = timed is not None and abs(timed - host) <= EVENTS_REL * host + EVENTS_ABS
    return Check("CUDA timing (perfmon's step timer)", "= host clock ± 10%",
                 f"steps {_ms(timed)} on the device, host clock {_ms(host)} (kernels of {_ms(seconds)})", ok)


def back_to_back(device: Device) -> Check:
    """Steps of kernels with no host work between them: the device never idles, so busy reads near 100%
    in time and the verdict does not call it starved."""
    def body(mon: Any) -> None:
        for _ in gpu_steps():
            with mon.step():
                device.kernels(0.010)

    view = run_job("gpu-back-to-back", body, device=device)
    busy, leaf = view.metrics.device_busy, _leaf(view)
    source = view.metrics.device_busy_source or "no source"
    ok = busy is not None and busy >= FULL_BUSY_MIN and leaf in ("healthy", "low_fill", "compute_efficiency")
    return Check("GPU busy back to back", f"busy ≥ {_pct(FULL_BUSY_MIN)}, not starved",
                 f"{leaf}, busy {_pct(busy)} ({source})", ok)


def half_idle(device: Device, util_why: str | None) -> list[Check]:
    """Kernels of 10 ms in steps of ~20 ms of host work. Two rows: NVML's utilization as perfmon sampled it
    against the planted kernel share (the kernels' length on the host clock after the run, over the run's
    wall time), and the verdict: host_overhead with the host's lead measured and too short to hide the
    idle (the host launches each step's kernels at its end, after its own work)."""
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
    planted = n * _kernel_seconds(device, 0.010) / wall
    util, leaf = view.metrics.gpu_util, _leaf(view)     # NVML's own figure, whatever busy source won
    ahead = view.metrics.host_queued_whole_frac
    if util_why is not None:
        nvml = Check("NVML utilization", f"= kernel share {_pct(planted)} ± {_pts(BUSY_TOL)}", f"not run: {util_why}",
                     None)
    else:
        nvml = Check("NVML utilization", f"= kernel share {_pct(planted)} ± {_pts(BUSY_TOL)}",
                     f"utilization {_pct(util)} as perfmon sampled it",
                     util is not None and abs(util - planted) <= BUSY_TOL)
    verdict = Check("GPU idle half of each step", "host_overhead, no step queued whole",
                    f"{leaf}, {_pct(ahead)} of timed steps queued whole, lead {_ms(view.metrics.host_lead_s)}",
                    leaf == "host_overhead" and ahead == 0.0)
    return [nvml, verdict]


def gpm_fill(device: Device, gpm_why: str | None) -> list[Check]:
    """GPM's SM activity over busy against the fill the kernels have: full matmuls back to back (every SM)
    and one-block kernels back to back (one SM). Two rows: the fill numbers, and the verdict on the
    narrow loop (busy in time, poorly filled: low_fill)."""
    names = ("GPM SM fill", "narrow kernels back to back")
    expected = (f"full ≥ {_pct(FILL_MIN)}, one-block ≤ {_pct(NARROW_FILL_MAX)}", "low_fill")
    if gpm_why is not None:
        return [Check(name, want, f"not run: {gpm_why}", None) for name, want in zip(names, expected)]

    def loop(narrow: bool) -> Any:
        def body(mon: Any) -> None:
            for _ in gpu_steps():
                with mon.step():
                    (device.narrow_kernels if narrow else device.kernels)(0.010)
        return run_job("gpu-narrow" if narrow else "gpu-full", body, device=device)

    full, narrow = loop(False), loop(True)
    f, n = full.metrics.device_fill, narrow.metrics.device_fill
    fill_ok = f is not None and n is not None and f >= FILL_MIN and n <= NARROW_FILL_MAX
    leaf, busy = _leaf(narrow), narrow.metrics.device_busy
    return [Check(names[0], expected[0], f"full {_pct(f)}, one-block {_pct(n)} (SM activity over busy)", fill_ok),
            Check(names[1], expected[1], f"{leaf}, busy {_pct(busy)}, fill {_pct(n)}",
                  leaf == "low_fill" and busy is not None and busy >= DEVICE_BUSY_MIN)]


def sync_every_step(device: Device) -> Check:
    """One ``.item()`` per step after host work: the device idles while the host works, and every step
    syncs: host_sync, one sync counted per step."""
    def body(mon: Any) -> None:
        for _ in gpu_steps():
            with mon.step():
                time.sleep(0.010)
                device.kernels(0.010)
                device.sync()

    view = run_job("gpu-sync", body, device=device)
    syncs, leaf = view.metrics.syncs_per_step, _leaf(view)
    return Check("a sync every step", "host_sync, 1 sync/step", f"{leaf}, syncs/step {_num(syncs)}",
                 leaf == "host_sync" and syncs is not None and abs(syncs - 1) <= 0.25)


def sync_never_idle(device: Device) -> Check:
    """One ``.item()`` per step on a device that never idles: each step launches its kernels, then reads
    the previous step's loss, so the host waits while this step's kernels keep the device busy (the
    usual way to log a loss without stalling). A sync that leaves the device busy costs nothing: the
    verdict must not be host_sync, with the syncs counted."""
    def body(mon: Any) -> None:
        previous = None
        for _ in gpu_steps():
            with mon.step():
                device.kernels(0.020)
                loss = device.result()
                if previous is not None:
                    device.read(previous)
                previous = loss

    view = run_job("gpu-sync-busy", body, device=device)
    syncs, leaf, busy = view.metrics.syncs_per_step, _leaf(view), view.metrics.device_busy
    ok = leaf not in ("host_sync", "host_overhead", "host_wait") and syncs is not None and abs(syncs - 1) <= 0.25 \
        and busy is not None and busy >= FULL_BUSY_MIN
    return Check("a sync on a device that never idles", "not host_sync, 1 sync/step",
                 f"{leaf}, busy {_pct(busy)}, syncs/step {_num(syncs)}", ok)


def launch_bound(device: Device) -> Check:
    """Steps of 400 tiny kernels: the host's launches take the step, the device mostly idles."""
    def body(mon: Any) -> None:
        for _ in gpu_steps():
            with mon.step():
                device.tiny_kernels(400)

    view = run_job("gpu-launch-bound", body, device=device)
    busy, leaf = view.metrics.device_busy, _leaf(view)
    return Check("launch-bound tiny kernels", "host_overhead", f"{leaf}, busy {_pct(busy)}", leaf == "host_overhead")


def hybrid_model(device: Device) -> Check:
    """A CPU embedding in front of layers on the GPU: a CUDA job, with the embedding's bytes as the share
    of parameters in host memory (the model's own count)."""
    model, inputs, planted = device.hybrid()

    def body(mon: Any) -> None:
        import torch

        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        mon.watch(model=model, optimizer=opt)
        for _ in range(STEPS):
            with mon.step():
                model(inputs).sum().backward()
                opt.step()
                opt.zero_grad()

    view = run_job("gpu-hybrid", body)
    share = view.metrics.params_offloaded
    ok = view.device_type == "cuda" and share is not None and abs(share - planted) <= OFFLOAD_TOL
    return Check("hybrid model (CPU embedding, GPU layers)", f"cuda job, {_pct(planted)} of params in host memory",
                 f"{view.device_type} job, {_pct(share)} in host memory", ok)


GPU_CHECKS = (("CUDA timing (perfmon's step timer)", "= host clock ± 10%"),
              ("GPU busy back to back", f"busy ≥ {_pct(FULL_BUSY_MIN)}, not starved"),
              ("NVML utilization", "= kernel share ± 10 pts"),
              ("GPU idle half of each step", "host_overhead, the host's lead under a step"),
              ("GPM SM fill", f"full ≥ {_pct(FILL_MIN)}, one-block ≤ {_pct(NARROW_FILL_MAX)}"),
              ("narrow kernels back to back", "low_fill"),
              ("a sync every step", "host_sync, 1 sync/step"),
              ("a sync on a device that never idles", "not host_sync, 1 sync/step"),
              ("launch-bound tiny kernels", "host_overhead"),
              ("hybrid model (CPU embedding, GPU layers)", "cuda job, its host share of params"),
              ("CPU-only job on the GPU host", "cpu job: healthy"))


def gpu_checks(device: Device | None, why_not: str = "not run: --cpu-only") -> list[Check]:
    """The GPU workloads; without a device each says why it did not run."""
    if device is None:
        return [Check(name, expected, why_not, None) for name, expected in GPU_CHECKS]
    util_why, gpm_why = nvml_support(device.uuid())
    return [cuda_timing(device), back_to_back(device), *half_idle(device, util_why), *gpm_fill(device, gpm_why),
            sync_every_step(device), sync_never_idle(device), launch_bound(device), hybrid_model(device),
            cpu_job_on_gpu_host()]
