"""What the doctor's checks run: a probe around a workload, the small models, and the GPU ``Device``.

Every workload keeps its own clock (``time.perf_counter`` around what it planted, the
training thread's CPU clock, the host clock across a device synchronize); the checks
compare that with what perfmon measured, never perfmon with itself.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

STEPS = 40                # steps per CPU workload
WINDOW = 20               # the view judges the last WINDOW steps: the first ones warm caches and the allocator
GPU_SECONDS = 1.5         # each GPU workload runs at least this long: NVML is sampled at 20 Hz


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

    def synchronize(self) -> None:
        """Wait until the device has run everything queued (``torch.cuda.synchronize()``)."""

    def event_elapsed(self, seconds: float) -> float:
        """Seconds CUDA events measure around ``seconds`` of device work (waits for the end event)."""

    def kernel_seconds(self, seconds: float) -> float:
        """Seconds ``kernels(seconds)`` keeps the device busy now, on the host clock across a synchronize."""


def run_job(name: str, body: Callable[[Any], None], *, device: Device | None = None) -> Any:
    """Run ``body(mon)`` under a fresh probe recording to a temporary directory; return the
    ``JobView`` of its recording over the last ``WINDOW`` steps, as ``perfmon report`` would see it."""
    import probe
    from probe.recording import read_recording
    from perfmon_analysis.analysis import Analysis

    with tempfile.TemporaryDirectory(prefix="perfmon-doctor-") as tmp:
        mon = probe.start(job=f"doctor-{name}", record=Path(tmp), serve=False, sample_hz=20)
        try:
            if device is not None:
                device.attach(mon)
            body(mon)
        finally:
            mon.close()
        analysis = Analysis(window_steps=WINDOW)
        if mon.record_path is not None:
            for rec in read_recording(mon.record_path).records:
                analysis.ingest(name, rec)
        return analysis.view()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread while a workload runs, so that the training thread's CPU clock
    holds all of its compute (restored after: the tests run the workloads in-process)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_queue_wait() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a core (Linux schedstat's second
    field, in ns); None where the kernel does not expose it."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def gpu_steps() -> Iterator[int]:
    """Step numbers for a GPU workload: ``STEPS`` of them and at least ``GPU_SECONDS``."""
    end = time.perf_counter() + GPU_SECONDS
    i = 0
    while i < STEPS or time.perf_counter() < end:
        yield i
        i += 1


class Mlp:
    """A small CPU model and its optimizer; ``work()`` is one step's compute (10 training iterations)."""

    def __init__(self) -> None:
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.x, self.y = torch.randn(64, 256), torch.randn(64, 1)

    def work(self) -> None:
        for _ in range(10):
            loss = self.torch.nn.functional.mse_loss(self.model(self.x), self.y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


class TorchCudaDevice:
    """The real GPU. Its kernels are bf16 matmuls that fill every SM, so both busy sources read
    them as busy: NVML utilization (any kernel running) and GPM SM activity (the share of SMs
    busy; a one-block spin kernel such as ``torch.cuda._sleep`` would read under 1% of an H100).
    Their length is calibrated on the host clock across a synchronize, never with the CUDA events
    the doctor checks, once the GPU has left its idle clocks; ``.item()`` is the sync."""

    SIDE = 4096          # ~0.2 ms per matmul on an H100, ~0.5 ms on an A100: fine-grained lengths

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.name = torch.cuda.get_device_name()
        self.scratch = torch.zeros(1, device="cuda")
        self.a = torch.randn(self.SIDE, self.SIDE, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(self.SIDE, self.SIDE, device="cuda", dtype=torch.bfloat16)
        self.out = torch.empty_like(self.a)
        self.matmul_s = self._calibrate()

    def _calibrate(self) -> float:
        """Seconds per matmul: a batch long enough (>= 50 ms) that launch costs vanish beside it, after
        0.5 s of the same work (an idle GPU runs its first kernels at low clocks: calibrated cold on an
        H200, 20 ms of kernels took 18 ms once it was busy)."""
        torch = self.torch
        torch.matmul(self.a, self.b, out=self.out)     # the first launch loads the kernel (cuBLAS)
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            for _ in range(16):
                torch.matmul(self.a, self.b, out=self.out)
            self.synchronize()
        n = 8
        while True:
            self.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                torch.matmul(self.a, self.b, out=self.out)
            self.synchronize()
            took = time.perf_counter() - t0
            if took >= 0.05:
                return took / n
            n *= 4

    def attach(self, mon: Any) -> None:
        self.model = self.torch.nn.Linear(8, 8).cuda()      # kept: the probe holds a watched model weakly
        mon.watch(model=self.model, syncs=True)

    def kernels(self, seconds: float) -> None:
        for _ in range(max(1, round(seconds / self.matmul_s))):
            self.torch.matmul(self.a, self.b, out=self.out)

    def tiny_kernels(self, n: int) -> None:
        for _ in range(n):
            self.scratch.add_(1.0)

    def sync(self) -> None:
        self.scratch.sum().item()

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def event_elapsed(self, seconds: float) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.kernels(seconds)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def kernel_seconds(self, seconds: float) -> float:
        reps = 10
        self.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            self.kernels(seconds)
        self.synchronize()
        return (time.perf_counter() - t0) / reps


def why_no_gpu() -> str | None:
    """Why the GPU checks cannot run here; None when a CUDA GPU is visible."""
    try:
        import torch
    except ImportError:
        return "not run: torch is not installed"
    if not torch.cuda.is_available():
        return "not run: no CUDA GPU visible to torch"
    return None
