"""What the doctor's checks run: a probe around a workload, the small models, and the GPU ``Device``.

Every workload keeps its own clock (``time.perf_counter`` around what it planted, the
training thread's CPU clock, the host clock across a device synchronize); the checks
compare that with what perfmon measured, never perfmon with itself.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

STEPS = 40                # steps per CPU workload
WINDOW = 20               # the view judges the last WINDOW steps: the first ones warm caches and the allocator
GPU_SECONDS = 1.5         # each GPU workload runs at least this long: NVML is sampled at 20 Hz


class Device(Protocol):
    """What the GPU workloads need from a device (real CUDA, or the simulated one in tests)."""

    name: str

    def attach(self, mon: Any) -> None:
        """Let the probe see this device (watch a model on it, with sync counting on)."""

    def kernels(self, seconds: float) -> None:
        """Enqueue about ``seconds`` of device work that fills every SM; return at once."""

    def narrow_kernels(self, seconds: float) -> None:
        """Enqueue about ``seconds`` of kernels of one thread block each (one SM of many); return at once."""

    def tiny_kernels(self, n: int) -> None:
        """Launch ``n`` kernels that take almost no device time each."""

    def sync(self) -> None:
        """A host-device sync the way training code does it (``loss.item()``)."""

    def result(self) -> Any:
        """A device tensor computed after the work queued so far (a step's loss), not read yet."""

    def read(self, result: Any) -> float:
        """Read ``result`` on the host (``.item()``): a sync that waits for the work queued before it."""

    def synchronize(self) -> None:
        """Wait until the device has run everything queued (``torch.cuda.synchronize()``)."""

    def event_elapsed(self, seconds: float) -> float:
        """Seconds CUDA events measure around ``seconds`` of device work (waits for the end event)."""

    def kernel_seconds(self, seconds: float) -> float:
        """Seconds ``kernels(seconds)`` keeps the device busy now, on the host clock across a synchronize."""

    def hybrid(self) -> tuple[Any, Any, float]:
        """(a model with its embedding in host memory and its layers on the device, an input batch, the share
        of the model's parameter bytes in host memory), as a model too large for device memory is split."""

    def uuid(self) -> str | None:
        """The device's UUID, which ties it to its NVML device (the doctor asks NVML about it directly)."""


def run_job(name: str, body: Callable[[Any], None], *, device: Device | None = None) -> Any:
    """Run ``body(mon)`` under a fresh probe recording to a temporary directory; return the
    ``JobView`` of its recording over the last ``WINDOW`` steps, as ``perfmon report`` would see it."""
    import probe
    from perfmon_analysis.analysis import Analysis
    from probe.recording import read_recording

    with tempfile.TemporaryDirectory(prefix="perfmon-doctor-") as tmp:
        if device is not None:
            device.synchronize()          # each workload starts on an idle device, not another's queue
        mon = probe.start(job=f"doctor-{name}", record=Path(tmp), serve=False, sample_hz=20)
        try:
            if device is not None:
                device.attach(mon)
            body(mon)
            if device is not None:
                device.synchronize()      # its queued kernels run while the probe still samples them
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


def nvml_support(uuid: str | None) -> tuple[str | None, str | None]:
    """Asked of NVML directly, never through perfmon: (why utilization cannot be read, why GPM cannot),
    None for each that can. A check whose reading the driver cannot give does not run; one whose reading
    the driver gives and perfmon does not fails."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as exc:
        return f"NVML unavailable ({exc})", f"NVML unavailable ({exc})"
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        bare = (uuid or "").removeprefix("GPU-")
        handle = next((h for h in handles if bare and _text(pynvml.nvmlDeviceGetUUID(h)).removeprefix("GPU-") == bare),
                      handles[0] if len(handles) == 1 else None)
        if handle is None:
            return "the device is not among NVML's", "the device is not among NVML's"
        util: str | None = None
        try:
            pynvml.nvmlDeviceGetUtilizationRates(handle)
        except Exception as exc:
            util = f"NVML gives no utilization ({exc})"
        try:
            gpm = None if pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice else \
                "GPM unsupported on this GPU (Hopper and newer have it)"
        except Exception as exc:
            gpm = f"GPM unsupported ({exc})"
        return util, gpm
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        self._cycles_per_s: float | None = None

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

    def narrow_kernels(self, seconds: float) -> None:
        """``torch.cuda._sleep``: one thread spinning ``cycles``, a one-block kernel on one SM."""
        cycles = self._sleep_cycles_per_s()
        for _ in range(max(1, round(seconds / 0.001))):
            self.torch.cuda._sleep(int(cycles * 0.001))

    def _sleep_cycles_per_s(self) -> float:
        """Spin cycles per second of ``torch.cuda._sleep``, calibrated once on the host clock."""
        if self._cycles_per_s is None:
            self.torch.cuda._sleep(1_000_000)
            self.synchronize()
            t0 = time.perf_counter()
            self.torch.cuda._sleep(50_000_000)
            self.synchronize()
            self._cycles_per_s = 50_000_000 / (time.perf_counter() - t0)
        return self._cycles_per_s

    def tiny_kernels(self, n: int) -> None:
        for _ in range(n):
            self.scratch.add_(1.0)

    def hybrid(self) -> tuple[Any, Any, float]:
        torch = self.torch
        nn = torch.nn
        module: Any = nn.Module

        class Hybrid(module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(4096, 1024)                              # 16 MiB, in host memory
                self.layers = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024)).cuda()

            def forward(self, x: Any) -> Any:
                return self.layers(self.embed(x).cuda(non_blocking=True))

        model = Hybrid()
        host = sum(p.numel() * p.element_size() for p in model.embed.parameters())
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        return model, torch.randint(0, 4096, (256,)), host / total

    def uuid(self) -> str | None:
        uuid = getattr(self.torch.cuda.get_device_properties(self.torch.cuda.current_device()), "uuid", None)
        return str(uuid) if uuid is not None else None

    def sync(self) -> None:
        self.scratch.sum().item()

    def result(self) -> Any:
        return self.out[0, :8].float().sum()

    def read(self, result: Any) -> float:
        return float(result.item())

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
