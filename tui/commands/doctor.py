"""``perfmon doctor``: does perfmon tell the truth on this machine?

Short built-in workloads whose bottleneck is known by construction run under the
probe; the verdict and the measurements are compared with that truth and printed as
a table (check, expected, measured, verdict). Exit status 1 when any check
disagrees, 0 otherwise (checks that cannot run here say why and do not fail).

On every machine: a compute-bound loop (``healthy``), a loop starved by its loader
(``data_loading``) and step timing against the loop's own clock. With a CUDA GPU:
NVML readable, GPM available or not, CUDA events timing a known kernel, a GPU idle
half of each step (busy ≈ 50%, ``host_overhead``), a sync every step (``host_sync``)
and a launch-bound loop of tiny kernels (``host_overhead``). The GPU workloads reach
the device through a ``Device`` so the tests run them on the simulated device layer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from tui.model import units

STEPS = 40                # enough for a full window of ``MIN_STEPS``
GPU_SECONDS = 1.5         # each GPU workload runs at least this long: NVML is sampled at 20 Hz


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    measured: str
    ok: bool | None        # None: not run here (``measured`` says why)

    @property
    def verdict(self) -> str:
        return "skip" if self.ok is None else "ok" if self.ok else "FAIL"


class Device(Protocol):
    """What the GPU workloads need from a device (real CUDA, or the simulated one in tests)."""

    name: str

    def attach(self, mon: Any) -> None:
        """Let the probe see this device (watch a model on it, with sync counting on)."""

    def kernels(self, seconds: float) -> None:
        """Enqueue about ``seconds`` of device work; return at once."""

    def tiny_kernels(self, n: int) -> None:
        """Launch ``n`` kernels that take almost no device time each."""

    def sync(self) -> None:
        """A host-device sync the way training code does it (``loss.item()``)."""

    def event_elapsed(self, seconds: float) -> float:
        """Seconds CUDA events measure around ``seconds`` of device work (waits for it)."""


# -- running a workload under the probe ----------------------------------------------------------
def run_job(name: str, body: Callable[[Any], None], *, device: Device | None = None) -> Any:
    """Run ``body(mon)`` under a fresh probe recording to a temporary directory; return the
    ``JobView`` of its recording, as ``perfmon report`` would see it."""
    import probe
    from probe.recording import read_recording
    from tui.model.runmodel import RunModel

    with tempfile.TemporaryDirectory(prefix="perfmon-doctor-") as tmp:
        mon = probe.start(job=f"doctor-{name}", record=Path(tmp), serve=False, sample_hz=20)
        try:
            if device is not None:
                device.attach(mon)
            body(mon)
        finally:
            mon.close()
        model = RunModel()
        if mon.record_path is not None:
            for rec in read_recording(mon.record_path).records:
                model.ingest(name, rec)
        return model.view()


def _gpu_steps() -> Iterator[int]:
    """Step numbers for a GPU workload: ``STEPS`` of them and at least ``GPU_SECONDS``."""
    end = time.perf_counter() + GPU_SECONDS
    i = 0
    while i < STEPS or time.perf_counter() < end:
        yield i
        i += 1


def _verdict_check(name: str, expected: str, view: Any, extra: str = "") -> Check:
    from tui.model.verdict import evaluate

    v = evaluate(view)
    measured = f"{v.bottleneck}: {v.headline}" + (f" [{extra}]" if extra else "")
    return Check(name, expected, measured, v.bottleneck == expected)


def _mlp() -> tuple[Any, Any, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return model, opt, (torch.randn(64, 256), torch.randn(64, 1))


def _train_step(model: Any, opt: Any, x: Any, y: Any) -> None:
    import torch

    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def cpu_checks() -> list[Check]:
    """The workloads every machine can run."""
    model, opt, (x, y) = _mlp()
    walls: list[float] = []

    def compute(mon: Any) -> None:
        mon.watch(model=model, optimizer=opt)
        for _ in range(STEPS):
            t0 = time.perf_counter()
            with mon.step(samples=len(x)):
                for _ in range(20):
                    _train_step(model, opt, x, y)
            walls.append(time.perf_counter() - t0)

    view = run_job("compute", compute)
    checks = [_verdict_check("compute-bound loop", "healthy", view)]
    own = statistics.median(walls[-20:])
    durs = [s.dur for t in view.traces.values() for s in t.steps[-20:]]
    seen = statistics.median(durs) if durs else None       # the same 20 steps, as the probe timed them
    close = seen is not None and abs(seen - own) <= 0.1 * own + 0.002
    checks.append(Check("step time vs the loop's own clock", f"{own * 1000:.1f} ms ± 10%",
                        "not measured" if seen is None else f"{seen * 1000:.1f} ms", close))

    def starved(mon: Any) -> None:
        compute_s = max(own / 20, 0.001)

        def batches() -> Iterator[tuple[Any, Any]]:
            while True:
                time.sleep(3 * compute_s)     # a loader waiting on slow storage: no CPU used
                yield x, y

        it = iter(mon.loader(batches()))
        for _ in range(STEPS):
            xb, yb = next(it)
            with mon.step(samples=len(xb)):
                _train_step(model, opt, xb, yb)

    view = run_job("data-starved", starved)
    checks.append(_verdict_check("loop starved by its loader", "data_loading", view,
                                 f"data wait {_pct(view.metrics.data_wait_frac)}"))
    return checks


def _host_work(seconds: float) -> None:
    """Python on the host's CPU for ``seconds``: a host-bound step's overhead. (A sleep would be a
    host that waits, which the verdict tells apart: ``host_wait``.)"""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))


def gpu_checks(device: Device | None) -> list[Check]:
    """The GPU workloads; without a device each says why it did not run."""
    if device is None:
        why = _why_no_gpu() or "not run: --cpu-only"
        return [Check(name, expected, why, None) for name, expected in (
            ("NVML utilization", "readable"), ("CUDA events time a kernel", "≈ its length"),
            ("GPU idle half of each step", "busy ≈ 50%, host_overhead"),
            ("a sync every step", "host_sync"), ("launch-bound tiny kernels", "host_overhead"))]
    checks = []
    elapsed = device.event_elapsed(0.02)
    checks.append(Check("CUDA events time a kernel", "20 ms ± 25%", f"{elapsed * 1000:.1f} ms",
                        0.015 <= elapsed <= 0.025))

    def half_idle(mon: Any) -> None:
        for _ in _gpu_steps():
            with mon.step():
                device.kernels(0.010)
                _host_work(0.020)             # host work the device does not see

    view = run_job("gpu-half-idle", half_idle, device=device)
    busy = view.metrics.device_busy
    checks.append(Check("NVML utilization", "readable", "not measured (NVML unavailable)" if busy is None
                        else f"busy {_pct(busy)} ({view.metrics.device_busy_source})", busy is not None))
    gpm = [row.gpu.sm_active for row in view.gpus]
    checks.append(Check("GPM SM activity", "available on Hopper and newer",
                        "available" if any(v is not None for v in gpm) else "not supported by this GPU/driver",
                        None if not any(v is not None for v in gpm) else True))
    half = busy is not None and abs(busy - 0.5) <= 0.1
    checks.append(Check("GPU idle half of each step", "busy ≈ 50%, host_overhead",
                        f"busy {_pct(busy)}, {_leaf(view)}", half and _leaf(view) == "host_overhead"))

    def syncing(mon: Any) -> None:
        for _ in _gpu_steps():
            with mon.step():
                time.sleep(0.010)
                device.kernels(0.010)
                device.sync()

    view = run_job("gpu-sync", syncing, device=device)
    checks.append(_verdict_check("a sync every step", "host_sync", view,
                                 f"syncs/step {_num(view.metrics.syncs_per_step)}"))

    def launch_bound(mon: Any) -> None:
        for _ in _gpu_steps():
            with mon.step():
                device.tiny_kernels(400)

    view = run_job("gpu-launch-bound", launch_bound, device=device)
    checks.append(_verdict_check("launch-bound tiny kernels", "host_overhead", view,
                                 f"busy {_pct(view.metrics.device_busy)}"))
    return checks


class TorchCudaDevice:
    """The real GPU: ``torch.cuda._sleep`` spins a kernel for a number of clock cycles, calibrated
    once with CUDA events; ``.item()`` is the sync."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.name = torch.cuda.get_device_name()
        self.scratch = torch.zeros(1, device="cuda")
        self.cycles_per_s = self._calibrate()

    def _calibrate(self) -> float:
        cycles = 10_000_000
        return cycles / max(self._elapsed_cycles(cycles), 1e-6)

    def _elapsed_cycles(self, cycles: int) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def attach(self, mon: Any) -> None:
        model = self.torch.nn.Linear(8, 8).cuda()
        mon.watch(model=model, syncs=True)

    def kernels(self, seconds: float) -> None:
        self.torch.cuda._sleep(int(seconds * self.cycles_per_s))

    def tiny_kernels(self, n: int) -> None:
        for _ in range(n):
            self.scratch.add_(1.0)

    def sync(self) -> None:
        self.scratch.sum().item()

    def event_elapsed(self, seconds: float) -> float:
        return self._elapsed_cycles(int(seconds * self.cycles_per_s))


def _why_no_gpu() -> str | None:
    """Why the GPU checks cannot run here; None when a CUDA GPU is visible."""
    try:
        import torch
    except ImportError:
        return "not run: torch is not installed"
    if not torch.cuda.is_available():
        return "not run: no CUDA GPU visible to torch"
    return None


def _leaf(view: Any) -> str:
    from tui.model.verdict import evaluate

    return evaluate(view).bottleneck


_pct = units.pct


def _num(x: float | None) -> str:
    return units.NA if x is None else f"{x:.1f}"


def render(checks: list[Check], width: int = 100) -> str:
    """The table: one row per check, columns cut to fit ``width``."""
    w_name = max(len(c.name) for c in checks)
    w_exp = max(len(c.expected) for c in checks)
    room = max(20, width - w_name - w_exp - 12)
    lines = [f"{'check':<{w_name}}  {'expected':<{w_exp}}  {'verdict':<7}  measured"]
    for c in checks:
        measured = c.measured if len(c.measured) <= room else c.measured[:room - 1] + "…"
        lines.append(f"{c.name:<{w_name}}  {c.expected:<{w_exp}}  {c.verdict:<7}  {measured}")
    failed = sum(c.ok is False for c in checks)
    lines.append(f"{len(checks)} checks: {sum(c.ok is True for c in checks)} ok, {failed} failed, "
                 f"{sum(c.ok is None for c in checks)} not run here")
    return "\n".join(lines)


def run_checks(device: Device | None) -> list[Check]:
    return cpu_checks() + gpu_checks(device)


def main(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401  (the workloads train small models)
    except ImportError:
        from tui.errors import UserError
        raise UserError("needs torch: pip install 'perfmon[torch]' (or any torch build)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    device = None
    if not args.cpu_only and _why_no_gpu() is None:
        device = TorchCudaDevice()
    print(f"perfmon doctor: {'GPU ' + device.name if device else 'CPU only'}; each check runs a short "
          "workload whose bottleneck is known", flush=True)
    checks = run_checks(device)
    print(render(checks, shutil.get_terminal_size((120, 24)).columns))
    return 1 if any(c.ok is False for c in checks) else 0
