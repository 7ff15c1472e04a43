"""The single NVML wrapper: every NVML call of the probe goes through ``Nvml.call``.

Any NVML error becomes "not available" for that one field (``None``), never an
exception. A function a device does not support (NotSupported, FunctionNotFound,
NoPermission) is remembered and not called again; a lost GPU is marked and not
queried again. No GPU, no driver or no ``pynvml`` is a normal state with a one-line
``status`` such as ``no NVIDIA GPU: NVML library not found``.

Counters read per device (NVML API reference, docs.nvidia.com/deploy/nvml-api):
utilization (share of time at least one kernel ran: says nothing about SM
occupancy), memory, power and its enforced limit, SM clock vs max, temperature,
clock-event ("throttle") reasons, PCIe and NVLink throughput, and on GPM devices
(Hopper and newer) SM activity, SM occupancy, tensor-core activity and DRAM
bandwidth utilisation.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

# nvmlClocksEventReason* bits (nvml.h); names are the wire values of ``throttle``.
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "idle"),
    (0x2, "app_clocks"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
)

# NVML_GPM_METRIC_* ids (nvml.h / pynvml); percentages become fractions, MiB/s become bytes/s.
GPM_METRICS: tuple[tuple[int, str, float], ...] = (
    (2, "sm_active", 0.01),           # SM_UTIL: share of SMs busy
    (3, "sm_occupancy", 0.01),        # SM_OCCUPANCY: active warps vs theoretical maximum
    (5, "tensor_active", 0.01),       # ANY_TENSOR_UTIL: share of time SMs ran tensor ops
    (10, "dram_bw", 0.01),            # DRAM_BW_UTIL: DRAM bandwidth used vs peak
    (20, "pcie_tx", 1 << 20),         # PCIE_TX_PER_SEC (MiB/s)
    (21, "pcie_rx", 1 << 20),         # PCIE_RX_PER_SEC (MiB/s)
    (61, "nvlink_tx", 1 << 20),       # NVLINK_TOTAL_TX_PER_SEC (MiB/s)
    (60, "nvlink_rx", 1 << 20),       # NVLINK_TOTAL_RX_PER_SEC (MiB/s)
)
GPM_ONLY = ("sm_active", "sm_occupancy", "tensor_active", "dram_bw")
GPM_MIN_INTERVAL = 0.1       # seconds between the two GPM samples (NVML needs >= ~100 ms)

NVLINK_TX_FIELD = 138        # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB counter
NVLINK_RX_FIELD = 139        # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
ALL_LINKS = 0xFFFFFFFF       # scopeId UINT_MAX: "aggregate value summed up across all links" (nvml.h)
PCIE_EVERY = 5               # nvmlDeviceGetPcieThroughput samples a counter over 20 ms: not every tick

# NVML_ERROR_* codes that mean "this device will never answer this call".
_PERMANENT = {2, 3, 4, 13}   # INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND
_GPU_IS_LOST = 15
# Why a reading is missing, in NVML's own words (its NVML_ERROR_* names), for the viewer to quote.
_REASON = {
    2: "NVML: InvalidArgument",
    3: "NVML: NotSupported on this GPU",
    4: "NVML: NoPermission",
    13: "NVML: FunctionNotFound (the driver lacks this call)",
    15: "NVML: GpuIsLost",
}
GPM_UNSUPPORTED = "GPM unsupported on this GPU (Hopper and newer have it)"
# The reading of each ``gpus[]`` field that a ``why`` entry explains, by the NVML call behind it.
UTIL_CALL = "nvmlDeviceGetUtilizationRates"
GPM_CALLS = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet", "nvmlGpmMetricsGet")
_STATUS = {
    12: "no NVIDIA GPU: NVML library not found",
    9: "no NVIDIA GPU: NVIDIA driver not loaded",
    4: "no NVIDIA GPU: no permission to use NVML",
}


def decode_throttle(mask: int) -> list[str]:
    """Clock-event bitmask -> reason names; unknown bits kept as hex."""
    names = [name for bit, name in THROTTLE_BITS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_BITS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(hex(bit))
            rest &= ~bit
        bit <<= 1
    return names


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Device:
    """One NVML device and what we learned about it."""

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.name = "GPU"
        self.uuid = ""
        self.mem_total: int | None = None
        self.sm_clock_max: int | None = None
        self.unsupported: set[tuple] = set()
        self.lost = False
        self.gpm: _Gpm | None = None
        self.nvlink_prev: tuple[float, int, int] | None = None
        self.pcie_cache: tuple[float | None, float | None] = (None, None)
        self.reads = 0
        self.errors = 0                     # failed NVML calls for this device (its samples' ``errors``)
        self.failed: dict[str, str] = {}    # NVML call -> why its last try failed (cleared by a success)
        self.gpm_why: str | None = None     # why this device has no GPM session


class _Gpm:
    """Two reusable GPM sample buffers; metrics come from consecutive samples."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.prev = nv.nvmlGpmSampleAlloc()
        self.cur = nv.nvmlGpmSampleAlloc()
        self.prev_t: float | None = None

    def read(self, nvml: Nvml, dev: Device) -> dict[str, float | None]:
        values: dict[str, float | None] = {name: None for _, name, _ in GPM_METRICS}
        now = time.monotonic()
        if self.prev_t is not None and now - self.prev_t < GPM_MIN_INTERVAL:
            return values
        if nvml.call_raw(dev, "nvmlGpmSampleGet", dev.handle, self.cur) is None:
            return values
        if self.prev_t is not None:
            mg = self.nv.c_nvmlGpmMetricsGet_t()
            mg.version = self.nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            mg.sample1 = self.prev
            mg.sample2 = self.cur
            for i, (metric_id, _, _) in enumerate(GPM_METRICS):
                mg.metrics[i].metricId = metric_id
            if nvml.call_raw(dev, "nvmlGpmMetricsGet", mg) is not None:
                for i, (_, name, scale) in enumerate(GPM_METRICS):
                    metric = mg.metrics[i]
                    if metric.nvmlReturn == 0:
                        values[name] = float(metric.value) * scale
                    elif name == "sm_active":     # the fill reading: say why it is missing
                        dev.failed["nvmlGpmMetricsGet"] = _REASON.get(metric.nvmlReturn,
                                                                      f"NVML: error {metric.nvmlReturn}")
        self.prev, self.cur = self.cur, self.prev
        self.prev_t = now
        return values


class Nvml:
    """NVML session. ``status`` is None when at least one GPU is readable."""

    def __init__(self, module: Any | None = None) -> None:
        self.nv: Any = None
        self.status: str | None = None
        self.devices: list[Device] = []
        self.errors = 0
        self.driver: str | None = None
        try:
            self.nv = module if module is not None else importlib.import_module("pynvml")
        except ImportError:
            self.status = "no NVIDIA GPU: nvidia-ml-py (pynvml) is not installed"
            return
        try:
            self.nv.nvmlInit()
        except Exception as exc:
            code: Any = getattr(exc, "value", None)     # pynvml is untyped
            self.status = _STATUS.get(code, f"no NVIDIA GPU: NVML init failed ({_error_text(exc)})")
            self.nv = None
            return
        count = self._plain("nvmlDeviceGetCount") or 0
        for index in range(count):
            handle = self._plain("nvmlDeviceGetHandleByIndex", index)
            if handle is not None:
                self.devices.append(self._describe(Device(index, handle)))
        if not self.devices:
            self.status = "no NVIDIA GPU: NVML sees no device"
        driver = self._plain("nvmlSystemGetDriverVersion")
        self.driver = _text(driver) if driver is not None else None

    def shutdown(self) -> None:
        """Undo this session's ``nvmlInit`` (NVML counts them), for a probe taken out of a process
        that goes on (``perfmon detach``); the session reads nothing afterwards."""
        nv, self.nv = self.nv, None
        if nv is not None:
            self.status = "NVML shut down"
            try:
                nv.nvmlShutdown()
            except Exception as exc:
                self.errors += 1
                self.status = f"NVML shut down ({_error_text(exc)})"

    # -- the wrapper ------------------------------------------------------------------------
    def _plain(self, name: str, *args: Any) -> Any:
        """Device-less call: value or None."""
        fn = getattr(self.nv, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception:
            self.errors += 1
            return None

    def call(self, name: str, dev: Device, *args: Any) -> Any:
        """``pynvml.<name>(dev.handle, *args)`` -> value, or None on any error."""
        return self.call_raw(dev, name, dev.handle, *args)

    def call_raw(self, dev: Device, name: str, *args: Any) -> Any:
        """``pynvml.<name>(*args)`` on behalf of ``dev`` -> value, or None on any error.

        Remembers calls the device can never answer and a lost GPU, so neither is retried.
        """
        key = (name, *(a for a in args[1:] if isinstance(a, int)))
        if dev.lost or key in dev.unsupported:
            return None
        fn = getattr(self.nv, name, None)
        if fn is None:
            dev.unsupported.add(key)
            dev.failed[name] = _REASON[13]
            return None
        try:
            value = fn(*args)
        except Exception as exc:
            self.errors += 1
            dev.errors += 1
            code: Any = getattr(exc, "value", None)
            dev.failed[name] = _REASON.get(code) or f"NVML: {_error_text(exc)}"[:120]
            if code in _PERMANENT:
                dev.unsupported.add(key)
            elif code == _GPU_IS_LOST:
                dev.lost = True
            return None
        if dev.failed:
            dev.failed.pop(name, None)
        return value

    # -- per device -------------------------------------------------------------------------
    def _describe(self, dev: Device) -> Device:
        name = self.call("nvmlDeviceGetName", dev)
        dev.name = _text(name) if name is not None else "NVIDIA GPU"
        uuid = self.call("nvmlDeviceGetUUID", dev)
        dev.uuid = _text(uuid) if uuid is not None else ""
        mem = self.call("nvmlDeviceGetMemoryInfo", dev)
        dev.mem_total = int(mem.total) if mem is not None else None
        clock_sm = getattr(self.nv, "NVML_CLOCK_SM", 1)
        sm_max = self.call("nvmlDeviceGetMaxClockInfo", dev, clock_sm)
        dev.sm_clock_max = int(sm_max) if sm_max is not None else None
        support = self.call("nvmlGpmQueryDeviceSupport", dev)
        if support is not None and getattr(support, "isSupportedDevice", False):
            try:
                dev.gpm = _Gpm(self.nv)
            except Exception as exc:
                self.errors += 1
                dev.errors += 1
                dev.gpm = None
                dev.gpm_why = f"GPM: {_error_text(exc)}"[:120]
        elif support is not None:
            dev.gpm_why = GPM_UNSUPPORTED
        else:
            dev.gpm_why = dev.failed.get("nvmlGpmQueryDeviceSupport", GPM_UNSUPPORTED)
        return dev

    def read(self, dev: Device) -> dict[str, Any]:
        """One ``gpus[]`` entry. Base fields are always present (None when n/a);
        GPM fields only on GPM devices."""
        nv = self.nv
        dev.reads += 1
        out: dict[str, Any] = {"index": dev.index, "name": dev.name, "uuid": dev.uuid or None}
        if dev.lost:
            out["lost"] = True
        util = self.call("nvmlDeviceGetUtilizationRates", dev)
        out["util"] = util.gpu / 100.0 if util is not None else None
        mem = self.call("nvmlDeviceGetMemoryInfo", dev)
        out["mem_used"] = int(mem.used) if mem is not None else None
        out["mem_total"] = int(mem.total) if mem is not None else dev.mem_total
        power = self.call("nvmlDeviceGetPowerUsage", dev)
        out["power_w"] = power / 1000.0 if power is not None else None
        energy = self.call("nvmlDeviceGetTotalEnergyConsumption", dev)
        out["energy_mj"] = int(energy) if energy is not None else None
        limit = self.call("nvmlDeviceGetEnforcedPowerLimit", dev)
        out["power_limit_w"] = limit / 1000.0 if limit is not None else None
        clock = self.call("nvmlDeviceGetClockInfo", dev, getattr(nv, "NVML_CLOCK_SM", 1))
        out["sm_clock"] = int(clock) if clock is not None else None
        out["sm_clock_max"] = dev.sm_clock_max
        temp = self.call("nvmlDeviceGetTemperature", dev, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        out["temp_c"] = int(temp) if temp is not None else None
        reasons = self.call("nvmlDeviceGetCurrentClocksEventReasons", dev)
        if reasons is None:
            reasons = self.call("nvmlDeviceGetCurrentClocksThrottleReasons", dev)
        out["throttle"] = decode_throttle(int(reasons)) if reasons is not None else None
        gpm = self._gpm_values(dev)
        if gpm is not None:
            for name in GPM_ONLY:
                out[name] = gpm[name]
            links = (gpm["pcie_tx"], gpm["pcie_rx"], gpm["nvlink_tx"], gpm["nvlink_rx"])
        else:
            links = (*self._pcie(dev), *self._nvlink(dev))
        out["pcie_tx"], out["pcie_rx"], out["nvlink_tx"], out["nvlink_rx"] = links
        why = self._why(dev, out, gpm)
        if why:
            out["why"] = why
        if dev.errors:
            out["errors"] = dev.errors
        return out

    @staticmethod
    def _why(dev: Device, out: dict[str, Any], gpm: dict[str, float | None] | None) -> dict[str, str]:
        """Why the busy and fill readings are missing, in NVML's words: the viewer states it beside
        "not measured" (docs/verdict.md, "When something is not measured"). A GPM value missing only
        because the previous sample is under ``GPM_MIN_INTERVAL`` old has no reason: it is not missing."""
        why: dict[str, str] = {}
        lost = "NVML: GpuIsLost" if dev.lost else None
        if out["util"] is None:
            why["util"] = lost or dev.failed.get(UTIL_CALL, "NVML: no utilization reported")
        if gpm is None:
            why["sm_active"] = lost or dev.gpm_why or GPM_UNSUPPORTED
        elif out.get("sm_active") is None:
            failed = lost or next((dev.failed[c] for c in GPM_CALLS if c in dev.failed), None)
            if failed is not None:
                why["sm_active"] = failed
        return why

    def _gpm_values(self, dev: Device) -> dict[str, float | None] | None:
        if dev.gpm is None:
            return None
        try:
            return dev.gpm.read(self, dev)
        except Exception as exc:
            self.errors += 1
            dev.errors += 1
            dev.failed["nvmlGpmMetricsGet"] = f"GPM: {_error_text(exc)}"[:120]
            return {name: None for _, name, _ in GPM_METRICS}

    def _pcie(self, dev: Device) -> tuple[float | None, float | None]:
        """PCIe bytes/s; the NVML call samples over 20 ms, so it runs every PCIE_EVERY reads."""
        if (dev.reads - 1) % PCIE_EVERY == 0:
            nv = self.nv
            tx = self.call("nvmlDeviceGetPcieThroughput", dev, getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0))
            rx = self.call("nvmlDeviceGetPcieThroughput", dev, getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))
            dev.pcie_cache = (tx * 1024.0 if tx is not None else None, rx * 1024.0 if rx is not None else None)
        return dev.pcie_cache

    def _nvlink(self, dev: Device) -> tuple[float | None, float | None]:
        """NVLink bytes/s from the cumulative all-link KiB counters (rate between two reads)."""
        values = self.call("nvmlDeviceGetFieldValues", dev,
                           [(NVLINK_TX_FIELD, ALL_LINKS), (NVLINK_RX_FIELD, ALL_LINKS)])
        if values is None:
            return None, None
        try:
            if values[0].nvmlReturn != 0 or values[1].nvmlReturn != 0:
                dev.unsupported.add(("nvmlDeviceGetFieldValues",))
                return None, None
            now = time.monotonic()
            tx, rx = int(values[0].value.ullVal), int(values[1].value.ullVal)
        except Exception:
            self.errors += 1
            return None, None
        prev = dev.nvlink_prev
        dev.nvlink_prev = (now, tx, rx)
        if prev is None or now <= prev[0] or tx < prev[1] or rx < prev[2]:
            return None, None
        dt = now - prev[0]
        return (tx - prev[1]) * 1024.0 / dt, (rx - prev[2]) * 1024.0 / dt

    def process_used(self, dev: Device, pid: int | None = None) -> tuple[int | None, int]:
        """(device memory NVML attributes to ``pid``, number of compute processes on the device).

        Inside containers the driver may report host PIDs (nvidia-docker #1483), so a
        miss is normal; the caller decides what to do with the process count.
        """
        procs = self.call("nvmlDeviceGetComputeRunningProcesses", dev)
        if procs is None:
            return None, 0
        pid = os.getpid() if pid is None else pid
        for proc in procs:
            if getattr(proc, "pid", None) == pid:
                used = getattr(proc, "usedGpuMemory", None)
                return (int(used) if used is not None else None), len(procs)
        return None, len(procs)

    def memory_used(self, dev: Device) -> int | None:
        mem = self.call("nvmlDeviceGetMemoryInfo", dev)
        return int(mem.used) if mem is not None else None


def _error_text(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:
        return type(exc).__name__
