"""The job's device: where the job's own tensors live, learned again whenever that changes.

The machine's GPUs (NVML) are a fact about the host; they say nothing about whether this job
trains on one. A CPU model on a GPU host is a CPU job, and a CUDA job whose NVML cannot be read
is still a CUDA job (its GPU busy is then not measured). So the device is read from the job:

1. the parameters ``watch()`` was given (first parameter of the first live model or optimizer):
   a ``watch()`` before ``model.cuda()`` is seen as CPU, then as CUDA once the model moved;
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
from typing import TYPE_CHECKING, Any, Callable

from probe import flops
from probe.endpoints import cpu_name
from probe.gpu import cuda as gpu_cuda

if TYPE_CHECKING:
    from probe.gpu.nvml import Device, Nvml

Placement = tuple[str, "int | None"]   # (device type, index)


def cpu_description() -> dict[str, Any]:
    return {"type": "cpu", "name": cpu_name(), "count": os.cpu_count() or 1}


def host_gpus(nvml: "Nvml", devices: "list[Device]") -> dict[str, Any]:
    """The hello's ``gpus``: the GPUs this process can see, a fact about the host."""
    if nvml.status is not None or not devices:
        return {"count": 0, "status": nvml.status or "no NVIDIA GPU: none assigned to this process"}
    first = devices[0]
    return {"count": len(devices), "name": first.name, "memory_total": first.mem_total, "driver": nvml.driver,
            "status": None}


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

    def __init__(self, probe: Any, nvml: "Nvml | None", refine: Callable[[Any, int, Any], "Device | None"]) -> None:
        self.probe = probe
        self.nvml = nvml
        self.refine = refine       # ``probe.gpu.refine``: the NVML device behind a CUDA index, by UUID
        self.placement: Placement = ("cpu", None)
        self.description: dict[str, Any] = cpu_description()

    def detect(self) -> Placement:
        watcher = self.probe.attached.watcher
        if watcher is not None:
            placed = watcher.param_placement()
            if placed is not None:
                return placed
        index = allocating_device(gpu_cuda.backend, self.probe.local_rank)
        return ("cuda", index) if index is not None else ("cpu", None)

    def update(self) -> bool:
        """Look again; True when the device changed (its description is then rebuilt)."""
        placement = self.detect()
        if placement == self.placement:
            return False
        self.placement = placement
        self.description = self.describe(placement)
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

    def _nvml_match(self, index: int | None) -> "Device | None":
        """The NVML device sampled for this job's GPU (``probe.gpu.refine`` narrows it by UUID)."""
        if index is None:
            return None
        return self.refine(self.probe, index, gpu_cuda.backend)

    def read(self) -> dict[str, Any]:
        self.update()
        return {"device": self.description}


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None
