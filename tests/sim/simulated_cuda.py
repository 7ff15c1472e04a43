"""SIMULATED CUDA backend: the interface of ``probe.gpu.cuda.TorchCuda`` with a modelled device.

The device is one stream on the host's clock (``time.perf_counter``), as real CUDA:

* ``run(seconds)`` enqueues that much kernel work (one launch): it starts when the stream is free
  (or now, if the device idles) and the host returns at once, so the host can run ahead, until
  ``launch_queue`` launches are pending: then the launch blocks the host until the oldest has run,
  as a real stream's bounded launch queue does (about a thousand launches on current drivers);
* an event recorded on the stream takes the time the stream reaches it, i.e. after all
  work queued before it, and is complete (``query()``) once the host clock passes that
  time. ``elapsed_time`` between two events is therefore GPU-timeline time, **idle gaps
  included**, exactly as real CUDA events: a step whose kernels take 10 ms of 20 ms
  reads 20 ms elapsed. It refuses incomplete events, like CUDA's;
* ``busy_fraction(t0, t1)`` is the share of [t0, t1] with a kernel running (what NVML's
  utilization reports; ``simulated_pynvml.SimulatedGpu(timeline=...)`` reads it);
* a kernel has a ``fill``: the share of the SMs its blocks occupy (a one-block kernel on an H100:
  1/132). ``sm_active_fraction(t0, t1)`` averages it over [t0, t1], idle time counting 0, which is
  DCGM's SM activity ("a kernel using N/5 blocks over the whole interval reads 0.2, and so does one
  using N blocks over a fifth of it"); GPM's SM_UTIL of a ``SimulatedGpu(timeline=...)`` reads it;
* ``synchronizing_op()`` is a host-device sync (``loss.item()``): it warns or raises
  according to the sync debug mode, as c10 does, then blocks the host until the stream
  has drained, or reached the tensor read (``SimulatedDeviceTensor.item``: work queued after
  it keeps running); ``synchronize()`` is the same wait for tests.

``memory_stats`` returns the dict a test set (the keys of ``torch.cuda.memory_stats``).
Every call is logged in ``calls`` so tests can assert what the probe never does.
Nothing here talks to a GPU.
"""

from __future__ import annotations

import collections
import time
import warnings
import weakref
from typing import Any

import torch

BUSY_HISTORY = 10_000     # kernel intervals kept for busy_fraction
LAUNCH_QUEUE = 1024       # pending launches before a launch blocks the host
SPIN_S = 0.001            # a synchronize spins this long before the stream drains (and sleeps before)


class SimulatedDeviceTensor:
    """A one-element CUDA tensor whose value the stream computes at ``ready_t``: reading it on the
    host (``float``/``item``) is a host-device sync, as for a real one; every read is logged with
    its thread in ``reads``."""

    is_cuda = True

    def __init__(self, cuda: SimulatedCuda, value: float) -> None:
        self.cuda = cuda
        self.value = value
        self.ready_t = max(time.perf_counter(), cuda.free_at)   # after the work queued before it, not later work
        self.device = type("device", (), {"type": "cuda", "index": 0})()
        self.reads: list[int] = []

    def item(self) -> float:
        """The host waits for the kernels that compute it (stream order): work queued after it keeps
        the device busy meanwhile."""
        import threading

        self.reads.append(threading.get_ident())
        self.cuda.synchronizing_op(until=self.ready_t)
        return self.value

    __float__ = item


class SimulatedHostCopy:
    """The pinned host buffer of a non-blocking device-to-host copy: reading it before the copy's
    event completes reads whatever was there (an error here, so a test sees it)."""

    def __init__(self, value: float, done: SimulatedEvent) -> None:
        self.value = value
        self.done = done

    def __float__(self) -> float:
        if not self.done.query():
            raise RuntimeError("pinned host copy read before its event completed")
        return float(self.value)


class SimulatedEvent:
    def __init__(self, cuda: SimulatedCuda) -> None:
        self.cuda = cuda
        self.device_t: float | None = None     # when the stream reaches it (host clock)

    def query(self) -> bool:
        return self.device_t is not None and time.perf_counter() >= self.device_t

    def elapsed_time(self, other: SimulatedEvent) -> float:
        if self.device_t is None or other.device_t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not (self.query() and other.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (other.device_t - self.device_t) * 1e3


class SimulatedCuda:
    """Stand-in for ``probe.gpu.cuda.backend``; ``name`` says it is a simulation."""

    name = "simulated CUDA"

    def __init__(self, *, stats: dict[str, Any] | None = None, total: int = 80 * (1 << 30),
                 device_name: str = "NVIDIA H100 80GB HBM3",
                 uuid: str = "GPU-00000000-sim0-0000-0000-000000000000", sync_mode: int = 0) -> None:
        self.stats = dict(stats or {})
        self.total = total
        self.name_of_device = device_name
        self.uuid = uuid
        self.sync_mode = sync_mode
        self.free_at = 0.0                  # host-clock time the stream drains
        self.busy: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=BUSY_HISTORY)
        self.launch_queue = LAUNCH_QUEUE
        self.queued: collections.deque[float] = collections.deque()   # end times of pending launches
        self.calls: list[str] = []
        self.events_created = 0
        self.placed: dict[int, weakref.ref] = {}   # tensors "on" the simulated GPU, by identity

    def ready(self) -> bool:
        return True

    def place(self, *holders: Any) -> None:
        """``model.cuda()`` in simulation: the parameters of these modules (or these tensors) now
        live on simulated ``cuda:0``. The probe asks ``tensor_device``, as it asks real tensors."""
        for holder in holders:
            for t in (list(holder.parameters()) if hasattr(holder, "parameters") else [holder]):
                self.placed[id(t)] = weakref.ref(t)

    def unplace(self, *holders: Any) -> None:
        """``model.cpu()`` in simulation."""
        for holder in holders:
            for t in (list(holder.parameters()) if hasattr(holder, "parameters") else [holder]):
                self.placed.pop(id(t), None)

    def tensor_device(self, tensor: Any) -> tuple[str, int | None]:
        ref = self.placed.get(id(tensor))
        if ref is not None and ref() is tensor:
            return "cuda", 0
        return str(tensor.device.type), tensor.device.index

    def allocating_devices(self) -> list[int]:
        """Allocated bytes on the simulated GPU: placed tensors, or the memory stats a test set."""
        placed = any(r() is not None for r in self.placed.values())
        return [0] if placed or self.stats.get("allocated_bytes.all.current", 0) > 0 else []

    def memory_stats(self, index: int) -> dict[str, Any]:
        self.calls.append("memory_stats")
        return dict(self.stats)

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def total_memory(self, index: int) -> int:
        self.calls.append("total_memory")
        return self.total

    def device_name(self, index: int) -> str:
        return self.name_of_device

    def device_uuid(self, index: int) -> str | None:
        return self.uuid

    def new_event(self) -> SimulatedEvent:
        self.events_created += 1
        return SimulatedEvent(self)

    def record_on(self, event: SimulatedEvent, index: int | None = None) -> None:
        self.calls.append("record")
        event.device_t = max(time.perf_counter(), self.free_at)

    def copy_to_host(self, tensor: SimulatedDeviceTensor) -> tuple[SimulatedHostCopy, SimulatedEvent]:
        """``tensor.to("cpu", non_blocking=True)`` and an event after it: the copy lands when the
        stream reaches it; the host does not wait."""
        self.calls.append("copy_to_host")
        event = SimulatedEvent(self)
        self.record_on(event)
        return SimulatedHostCopy(tensor.value, event), event

    def run(self, seconds: float, fill: float = 1.0) -> None:
        """Enqueue ``seconds`` of kernels on the stream, occupying ``fill`` of the SMs while they run; the
        host waits only for a full launch queue."""
        now = time.perf_counter()
        while self.queued and self.queued[0] <= now:
            self.queued.popleft()
        if len(self.queued) >= self.launch_queue:
            time.sleep(self.queued.popleft() - now)
            now = time.perf_counter()
        start = max(now, self.free_at)
        self.free_at = start + seconds
        self.busy.append((start, self.free_at, fill))
        self.queued.append(self.free_at)

    def pending(self, index: int) -> bool:
        """Kernels queued on the stream have not all run yet (``stream.query()`` is False)."""
        self.calls.append("pending")
        return time.perf_counter() < self.free_at

    def synchronize(self, until: float | None = None) -> None:
        """Block the host until the stream has drained (``torch.cuda.synchronize()``), or has reached
        ``until`` (a tensor's ``item()`` waits for the work queued before it). CUDA's default schedule
        spins while it waits, so the host resumes within microseconds of the last kernel: the wait
        sleeps until ``SPIN_S`` before the time and spins the rest (a sleep alone wakes milliseconds
        late on a loaded host, an idle gap no GPU would show)."""
        end = self.free_at if until is None else until
        delay = end - time.perf_counter()
        if delay > SPIN_S:
            time.sleep(delay - SPIN_S)
        while time.perf_counter() < end:
            pass

    def busy_fraction(self, t0: float, t1: float) -> float:
        """Share of the host-clock interval [t0, t1] during which a kernel ran."""
        if t1 <= t0:
            return 0.0
        intervals = list(self.busy)     # one C call: the training thread appends while NVML's sampler reads
        covered = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b, _ in intervals)
        return min(1.0, covered / (t1 - t0))

    def sm_active_fraction(self, t0: float, t1: float) -> float:
        """SM activity over [t0, t1]: each kernel's ``fill`` weighted by its time in the interval."""
        if t1 <= t0:
            return 0.0
        intervals = list(self.busy)
        active = sum(fill * max(0.0, min(b, t1) - max(a, t0)) for a, b, fill in intervals)
        return min(1.0, active / (t1 - t0))

    def get_sync_debug_mode(self) -> int:
        return self.sync_mode

    def set_sync_debug_mode(self, mode: int) -> None:
        """As torch: switching the mode on warns (once per process in torch; every time here) that it is
        a prototype, through the warnings filters."""
        self.calls.append(f"set_sync_debug_mode({mode})")
        if mode:
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                          "synchronizing operations", UserWarning, stacklevel=2)
        self.sync_mode = mode

    def synchronizing_op(self, until: float | None = None) -> None:
        """A host-device sync (``loss.item()``) as c10's ``warn_or_error_on_sync`` treats it: debug mode
        1 raises the ``TORCH_WARN`` as a Python ``UserWarning`` from the caller's line (through the
        warnings filters, as torch's PyWarningHandler does), 2 raises an error, 0 says nothing."""
        from probe.gpu.cuda import SYNC_MESSAGE

        self.calls.append("sync")
        if self.sync_mode == 1:
            warnings.warn(SYNC_MESSAGE + " (simulated)", UserWarning, stacklevel=2)
        elif self.sync_mode == 2:
            raise RuntimeError(SYNC_MESSAGE + " (simulated)")
        self.synchronize(until)


def memory_stats(*, allocated: int, reserved: int, peak: int, peak_reserved: int | None = None,
                 inactive_split: int = 0, retries: int = 0, ooms: int = 0) -> dict[str, int]:
    """A ``torch.cuda.memory_stats()``-shaped dict (only the keys the probe reads, plus noise)."""
    return {
        "allocated_bytes.all.current": allocated,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": reserved,
        "reserved_bytes.all.peak": peak_reserved if peak_reserved is not None else reserved,
        "active_bytes.all.current": allocated,
        "inactive_split_bytes.all.current": inactive_split,
        "num_alloc_retries": retries,
        "num_ooms": ooms,
        "num_sync_all_streams": 0,
        "num_device_alloc": 12,
        "num_device_free": 3,
    }


class SimulatedKernel(torch.nn.Module):
    """A module whose forward enqueues ``seconds`` of work on the simulated device and returns at
    once, as a CUDA kernel launch does (a model "on the GPU" for module profiles)."""

    def __init__(self, device: SimulatedCuda, seconds: float) -> None:
        super().__init__()
        self.device, self.seconds = device, seconds
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: Any) -> Any:
        self.device.run(self.seconds)
        return x * self.weight
