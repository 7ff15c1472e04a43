"""The job's device: where the job's own tensors live, learned again whenever that changes.

The machine's GPUs (NVML) are a fact about the host; they say nothing about whether this job
trains on one. A CPU model on a GPU host is a CPU job, and a CUDA job whose NVML cannot be read
is still a CUDA job (its GPU busy is then not measured). So the device is read from the job:

1. the tensors of what ``watch()`` was given: CUDA when any watched parameter is on CUDA (a CPU
   embedding in front of GPU layers computes on the GPU), or when the root forward's output is (CPU
   offload: FSDP ``CPUOffload``, ZeRO-offload keep the parameters in host memory and compute on the
   GPU); the share of parameter bytes in host memory is stated (``offloaded``). A ``watch()`` before
   ``model.cuda()`` is seen as CPU, then as CUDA once the model moved;
2. else, CUDA allocations this process holds (the caching allocator's counters, read without
   initializing CUDA or creating a context): a script that never calls ``watch()``;
3. else the CPU.

``JobDevice`` is a sampler source: each tick it looks again (a few attribute reads), and every
``sample`` record carries the job's device as ``device`` (wire: ``probe.wire``), so a viewer
follows a change within one sampling period and a late viewer gets it from the backfilled
sample. A change is handed to the watcher, which reconfigures its hooks on the training thread
at the next step begin (``Watcher.device_moved``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from probe import flops
from probe.endpoints import cpu_name
from probe.gpu import cuda as gpu_cuda

if TYPE_CHECKING:
    from probe.gpu.nvml import Device, Nvml

Placement = tuple[str, "int | None"]   # (device type, index)
STEP_DEVICE_EVERY = 1.0     # seconds between two looks at the root forward's output device (hot path)


def cpu_description() -> dict[str, Any]:
    return {"type": "cpu", "name": cpu_name(), "count": os.cpu_count() or 1}


def host_gpus(nvml: Nvml, devices: list[Device]) -> dict[str, Any]:
    """The hello's ``gpus``: the GPUs this process can see, a fact about the host."""
    if nvml.status is not None or not devices:
        return {"count": 0, "status": nvml.status or "no NVIDIA GPU: none assigned to this process"}
    first = devices[0]
    return {"count": len(devices), "name": first.name, "memory_total": first.mem_total, "driver": nvml.driver,
            "status": None}


def tensor_placement(tensor: Any) -> Placement | None:
    """(type, index) of a tensor, asked through the CUDA backend (so the simulated device of the tests can
    place a tensor on its GPU); None when it cannot be read."""
    try:
        return gpu_cuda.backend.tensor_device(tensor)
    except Exception:
        return None


def output_placement(output: Any) -> Placement | None:
    """Where a forward's output lives: the tensor, or the first tensor of a tuple, list or mapping
    (Hugging Face's ModelOutput is one); None when there is none."""
    for _ in range(3):
        if hasattr(output, "device") and hasattr(output, "dtype"):
            return tensor_placement(output)
        if isinstance(output, dict) or hasattr(output, "values"):
            output = next(iter(output.values()), None)
        elif isinstance(output, (tuple, list)):
            output = output[0] if output else None
        else:
            return None
    return None


def job_placement(params: Any, step_device: Placement | None) -> tuple[Placement, float | None] | None:
    """Where a job computes, from all of its parameters and the device of its step's output: (placement,
    the share of parameter bytes in host memory when that placement is CUDA). CUDA when any parameter
    or the step's output is on CUDA; else the device holding most parameter bytes; None without any."""
    by_device: dict[Placement, int] = {}
    seen: set[int] = set()
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        placed = tensor_placement(p)
        if placed is not None:
            by_device[placed] = by_device.get(placed, 0) + _nbytes(p)
    total = sum(by_device.values())
    on_host = sum(n for (kind, _), n in by_device.items() if kind == "cpu")
    cuda = {d: n for d, n in by_device.items() if d[0] == "cuda"}
    if cuda:
        return max(cuda, key=lambda d: cuda[d]), (on_host / total if total else None)
    if step_device is not None and step_device[0] == "cuda":
        return step_device, (on_host / total if total else None)
    if not by_device:
        return (step_device, None) if step_device is not None else None
    return max(by_device, key=lambda d: by_device[d]), None


def _nbytes(tensor: Any) -> int:
    try:
        return int(tensor.numel()) * int(tensor.element_size())
    except Exception:
        return 0


def allocating_device(backend: Any, local_rank: int) -> int | None:
    """The CUDA device this process allocates on (its local rank's when several), else None."""
    try:
        devices = backend.allocating_devices()
    except Exception:
        return None
    if not devices:
        return None
    return local_rank if local_rank in devices else devices[0]


class JobDevice:
    """Sampler source ``device``: the job's device now, and the one place that decides it."""

    name = "device"

    def __init__(self, probe: Any, nvml: Nvml | None, refine: Callable[[Any, int, Any], Device | None]) -> None:
        self.probe = probe
        self.nvml = nvml
        self.refine = refine       # ``probe.gpu.refine``: the NVML device behind a CUDA index, by UUID
        self.placement: Placement = ("cpu", None)
        self.offloaded: float | None = None
        self.description: dict[str, Any] = cpu_description()

    def detect(self) -> tuple[Placement, float | None]:
        """(placement, share of parameter bytes in host memory on a CUDA job)."""
        watcher = self.probe.attached.watcher
        if watcher is not None:
            placed = watcher.placement()
            if placed is not None:
                return placed
        index = allocating_device(gpu_cuda.backend, self.probe.local_rank)
        return (("cuda", index) if index is not None else ("cpu", None)), None

    def update(self) -> bool:
        """Look again; True when the device changed (its description is then rebuilt)."""
        placement, offloaded = self.detect()
        if placement == self.placement:
            if offloaded != self.offloaded and placement[0] == "cuda":
                self.offloaded = offloaded
                self.description = dict(self.description, offloaded=_share(offloaded))
                self.probe.device = self.description
            return False
        self.placement, self.offloaded = placement, offloaded
        self.description = self.describe(placement)
        if placement[0] == "cuda":
            self.description["offloaded"] = _share(offloaded)
        self.probe.device = self.description
        watcher = self.probe.attached.watcher
        if watcher is not None:
            watcher.device_moved(placement)
        return True

    def describe(self, placement: Placement) -> dict[str, Any]:
        kind, index = placement
        if kind != "cuda":
            out = cpu_description()
            if kind != "cpu":       # a device perfmon has no counters for (mps, xpu, ...)
                out.update(type=kind, name=kind, status=f"{kind}: no activity counters for this device type")
            return out
        backend = gpu_cuda.backend
        idx = index if index is not None else _safe(backend.current_device)
        name = _safe(lambda: backend.device_name(idx)) if idx is not None else None
        total = _safe(lambda: backend.total_memory(idx)) if idx is not None else None
        matched = self._nvml_match(idx)
        status = self.nvml.status if self.nvml is not None else "NVML not loaded"
        if status is None and matched is None:
            status = "GPU busy not measured: NVML does not list this process's GPU"
        return {"type": "cuda", "index": idx, "name": name or (matched.name if matched else None), "count": 1,
                "memory_total": total or (matched.mem_total if matched else None),
                "peak_flops": flops.peak_table(name or (matched.name if matched else None)),
                "driver": self.nvml.driver if self.nvml is not None else None, "status": status}

    def _nvml_match(self, index: int | None) -> Device | None:
        """The NVML device sampled for this job's GPU (``probe.gpu.refine`` narrows it by UUID)."""
        if index is None:
            return None
        return self.refine(self.probe, index, gpu_cuda.backend)

    def read(self) -> dict[str, Any]:
        self.update()
        return {"device": self.description}


def _share(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None
