"""GPU side of the probe: the host's GPUs, the job's device, and the per-GPU ``sample`` source.

``attach(probe)`` runs before the hello (core ``_device_extensions``). It opens NVML once,
picks the GPUs this process may use (the hello's ``gpus``: a fact about the host) and adds
two sampler sources: ``GpuSource`` (NVML counters of those GPUs) and ``JobDevice`` (where the
job's tensors live, ``probe.gpu.job``; the hello's and every sample's ``device``). No GPU is a
normal state: ``gpus.status`` and every sample's ``gpu_status`` say why, e.g.
``no NVIDIA GPU: NVML library not found``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from probe.gpu.job import JobDevice, host_gpus
from probe.gpu.nvml import Device, Nvml


@dataclass
class GpuAttachment:
    """What ``attach`` puts in ``Probe.attached.gpu``: the NVML session, this process's GPUs,
    and the sampler source reading them (defined here so that ``probe.attachments`` only
    refers to it for typing)."""

    nvml: Nvml
    devices: list[Device]
    source: GpuSource
    host: dict[str, Any]         # the hello's ``gpus``: what this host has, whatever the job uses
    job: JobDevice               # the job's own device (``probe.gpu.job``)


class GpuSource:
    """``gpus`` (one entry per GPU of this process) or ``gpu_status`` when there is none."""

    name = "gpu"

    def __init__(self, nvml: Nvml, devices: list[Device]) -> None:
        self.nvml = nvml
        self.devices = devices

    def read(self) -> dict[str, Any]:
        if self.nvml.status is not None or not self.devices:
            return {"gpu_status": self.nvml.status or "no NVIDIA GPU: none assigned to this process"}
        return {"gpus": [self.nvml.read(dev) for dev in self.devices]}


def visible_devices(nvml: Nvml, env: str | None = None) -> list[Device]:
    """NVML devices named by CUDA_VISIBLE_DEVICES (indices or UUID prefixes); all when unset.

    NVML numbers GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES; CUDA numbers them
    the same way only with CUDA_DEVICE_ORDER=PCI_BUS_ID. ``refine`` later matches by UUID.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES") if env is None else env
    if env is None:
        return list(nvml.devices)
    chosen: list[Device] = []
    for token in (t.strip() for t in env.split(",")):
        if not token:
            break
        if token.lstrip("-").isdigit():
            index = int(token)
            if index < 0:
                break
            chosen.extend(d for d in nvml.devices if d.index == index)
        else:
            chosen.extend(d for d in nvml.devices if d.uuid and d.uuid.startswith(token))
    return chosen


def own_devices(nvml: Nvml, local_rank: int, world_size: int) -> list[Device]:
    """The GPUs to sample: one per rank when several ranks share the visible set."""
    visible = visible_devices(nvml)
    if world_size > 1 and len(visible) > 1:
        return [visible[local_rank % len(visible)]]
    return visible


def attach(probe: Any, module: Any = None) -> None:
    """Device extension: NVML session, the host's GPUs and the job's device for the hello, and
    the sampler sources (``gpus`` of the host, ``device`` of the job: ``probe.gpu.job``)."""
    nvml = Nvml(module)
    devices = own_devices(nvml, probe.local_rank, probe.world_size) if nvml.status is None else []
    source = GpuSource(nvml, devices)
    job = JobDevice(probe, nvml, refine)
    probe.attached.gpu = GpuAttachment(nvml=nvml, devices=devices, source=source, host=host_gpus(nvml, devices),
                                       job=job)
    job.update()                      # CUDA already in use before start(): the hello says so
    probe.device = job.description
    probe.attached.sources.extend([job, source])


def refine(probe: Any, cuda_index: int, cuda: Any) -> Device | None:
    """Once torch has CUDA initialized: the NVML device behind ``cuda:<index>`` (by UUID).

    Narrows the sampled GPUs to that one, which fixes any numbering mismatch. Without a
    UUID match the device is still decided when this process has one GPU; otherwise the
    numbering cannot be trusted (``visible_devices``) and sampling stays on every visible
    GPU, which a warning says, as another says why the lookup failed (both rate-limited:
    the job's device detection may call this again).
    """
    gpu = probe.attached.gpu
    nvml = gpu.nvml if gpu is not None else None
    if gpu is None or nvml is None or nvml.status is not None:
        return None
    uuid = None
    try:
        uuid = cuda.device_uuid(cuda_index)
    except Exception as exc:
        probe.report_error("GPU UUID lookup", exc)
    match = None
    if uuid:
        bare = uuid.removeprefix("GPU-")
        match = next((d for d in nvml.devices if d.uuid.removeprefix("GPU-") == bare), None)
    if match is None:
        own = gpu.devices
        match = own[0] if len(own) == 1 else None
    if match is None:
        why = f"UUID {uuid} not among NVML's devices" if uuid else "no UUID from torch"
        probe.report_error("GPU selection", LookupError(
            f"cuda:{cuda_index} not matched to an NVML device ({why}); GPU sampling covers every visible "
            f"GPU ({len(gpu.devices)})"))
        return None
    gpu.source.devices = [match]
    return match
