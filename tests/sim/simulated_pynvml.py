"""SIMULATED NVML: a stand-in for the ``pynvml`` module that plays scripted values.

It implements the subset of the nvidia-ml-py API the probe calls, with the same
names, argument order, return shapes and error classes (``NVMLError`` carrying
``.value``, the NVML_ERROR_* code). Devices are ``SimulatedGpu`` objects whose
fields tests change between samples, or whose utilization is measured on a
``SimulatedCuda`` timeline (``timeline=``); ``errors`` maps a function name to the NVML
error code that call raises. Nothing here talks to a GPU or a driver.
"""

from __future__ import annotations

import time
import types
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    """Same shape as pynvml's: ``.value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"simulated NVML error {value}")
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


@dataclass
class SimulatedGpu:
    """One simulated GPU. Units as NVML returns them (mW, MHz, KB/s, KiB, percent)."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-sim0-0000-0000-000000000000"
    mem_total: int = 80 * (1 << 30)
    mem_used: int = 30 * (1 << 30)
    util: int = 87
    power_mw: int = 512_000
    power_limit_mw: int = 700_000
    sm_clock: int = 1755
    sm_clock_max: int = 1980
    temp_c: int = 64
    clock_events: int = 0x4 | 0x40            # sw_power_cap + hw_thermal
    pcie_kbs: tuple[int, int] = (2048, 4096)  # tx, rx
    nvlink_kib_per_read: tuple[int, int] | None = (1 << 20, 1 << 19)
    # GPM metric id -> percent or MiB/s; None: the device does not support GPM (pre-Hopper)
    gpm: dict[int, float] | None = field(default_factory=lambda: {
        2: 71.0, 3: 42.0, 5: 55.0, 10: 63.0, 20: 100.0, 21: 200.0, 60: 3000.0, 61: 2500.0})
    processes: list[tuple[int, int]] = field(default_factory=list)   # (pid, used bytes)
    errors: dict[str, int] = field(default_factory=dict)             # function -> NVML error code
    # A SimulatedCuda whose kernels this GPU runs: utilization is then measured on its timeline
    # over the last ``util_period`` seconds (NVML: "percent of time over the past sample period
    # during which one or more kernels was executing", a period of 1/6 s to 1 s by product), and,
    # when ``gpm`` lists SM_UTIL (2), GPM's SM activity over the time between the two GPM samples
    # (the kernels' SM fill weighted by their time, idle time counting 0).
    timeline: Any = None
    util_period: float = 1 / 6
    sm_from_timeline: bool = True     # False: GPM's SM activity stays the scripted value (a GPM that disagrees)
    calls: dict[str, int] = field(default_factory=dict)              # function -> times called
    nvlink_counters: list[int] = field(default_factory=lambda: [0, 0])
    # total energy since the driver loaded, mJ (nvmlDeviceGetTotalEnergyConsumption): tests advance it
    # as the GPU would (power x time) or leave it at None for a GPU without the counter (pre-Volta)
    energy_mj: int | None = 1_000_000_000


class _Struct(types.SimpleNamespace):
    pass


class _GpmSample:
    def __init__(self) -> None:
        self.device: SimulatedGpu | None = None
        self.t = 0.0


class _GpmMetric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0


class c_nvmlGpmMetricsGet_t:
    """Like pynvml's ctypes structure: metrics is a fixed array of metric slots."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_GpmMetric() for _ in range(98)]


def build(devices: list[SimulatedGpu] | None = None, *, init_error: int | None = None,
          driver: str = "550.00-simulated") -> types.ModuleType:
    """A module object to install as ``sys.modules["pynvml"]``."""
    nv = types.ModuleType("pynvml")
    nv.__doc__ = "SIMULATED NVML (tests/sim/simulated_pynvml.py)"
    devs = list(devices or [])
    state = {"init": 0}      # NVML counts nvmlInit calls; each nvmlShutdown undoes one

    for name, value in globals().items():
        if name.startswith("NVML_") or name.startswith("NVMLError"):
            setattr(nv, name, value)
    nv.c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t
    nv.NVML_GPM_METRICS_GET_VERSION = 1
    nv.NVML_CLOCK_SM = 1
    nv.NVML_TEMPERATURE_GPU = 0
    nv.NVML_PCIE_UTIL_TX_BYTES = 0
    nv.NVML_PCIE_UTIL_RX_BYTES = 1
    nv.simulated = True
    nv.devices = devs

    def device_call(fname: str):
        def decorator(fn):
            def wrapper(handle: SimulatedGpu, *args: Any) -> Any:
                handle.calls[fname] = handle.calls.get(fname, 0) + 1
                code = handle.errors.get(fname)
                if code is not None:
                    raise NVMLError(code)
                return fn(handle, *args)
            wrapper.__name__ = fname
            setattr(nv, fname, wrapper)
            return wrapper
        return decorator

    def nvmlInit() -> None:
        if init_error == NVML_ERROR_LIBRARY_NOT_FOUND:
            raise NVMLError_LibraryNotFound()
        if init_error is not None:
            raise NVMLError(init_error)
        state["init"] += 1

    def nvmlShutdown() -> None:
        if state["init"] == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        state["init"] -= 1

    def nvmlDeviceGetCount() -> int:
        return len(devs)

    def nvmlDeviceGetHandleByIndex(index: int) -> SimulatedGpu:
        return devs[index]

    def nvmlSystemGetDriverVersion() -> str:
        return driver

    nv.nvmlInit = nvmlInit
    nv.nvmlShutdown = nvmlShutdown
    nv.initialized = lambda: state["init"]
    nv.nvmlDeviceGetCount = nvmlDeviceGetCount
    nv.nvmlDeviceGetHandleByIndex = nvmlDeviceGetHandleByIndex
    nv.nvmlSystemGetDriverVersion = nvmlSystemGetDriverVersion

    @device_call("nvmlDeviceGetName")
    def _name(h: SimulatedGpu) -> str:
        return h.name

    @device_call("nvmlDeviceGetUUID")
    def _uuid(h: SimulatedGpu) -> str:
        return h.uuid

    @device_call("nvmlDeviceGetMemoryInfo")
    def _mem(h: SimulatedGpu, version: Any = None) -> _Struct:
        return _Struct(total=h.mem_total, used=h.mem_used, free=h.mem_total - h.mem_used)

    @device_call("nvmlDeviceGetMaxClockInfo")
    def _max_clock(h: SimulatedGpu, kind: int) -> int:
        return h.sm_clock_max

    @device_call("nvmlDeviceGetClockInfo")
    def _clock(h: SimulatedGpu, kind: int) -> int:
        return h.sm_clock

    @device_call("nvmlDeviceGetUtilizationRates")
    def _util(h: SimulatedGpu) -> _Struct:
        if h.timeline is not None:
            now = time.perf_counter()
            return _Struct(gpu=round(100 * h.timeline.busy_fraction(now - h.util_period, now)), memory=40)
        return _Struct(gpu=h.util, memory=40)

    @device_call("nvmlDeviceGetPowerUsage")
    def _power(h: SimulatedGpu) -> int:
        return h.power_mw

    @device_call("nvmlDeviceGetTotalEnergyConsumption")
    def _energy(h: SimulatedGpu) -> int:
        if h.energy_mj is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.energy_mj

    @device_call("nvmlDeviceGetEnforcedPowerLimit")
    def _limit(h: SimulatedGpu) -> int:
        return h.power_limit_mw

    @device_call("nvmlDeviceGetTemperature")
    def _temp(h: SimulatedGpu, sensor: int) -> int:
        return h.temp_c

    @device_call("nvmlDeviceGetCurrentClocksEventReasons")
    def _events(h: SimulatedGpu) -> int:
        return h.clock_events

    @device_call("nvmlDeviceGetCurrentClocksThrottleReasons")
    def _throttle(h: SimulatedGpu) -> int:
        return h.clock_events

    @device_call("nvmlDeviceGetPcieThroughput")
    def _pcie(h: SimulatedGpu, counter: int) -> int:
        return h.pcie_kbs[counter]

    @device_call("nvmlDeviceGetFieldValues")
    def _fields(h: SimulatedGpu, field_ids: list) -> list:
        out = []
        for fid in field_ids:
            fid = fid[0] if isinstance(fid, tuple) else fid
            if h.nvlink_kib_per_read is None or fid not in (138, 139):
                out.append(_Struct(fieldId=fid, nvmlReturn=NVML_ERROR_NOT_SUPPORTED, value=_Struct(ullVal=0)))
                continue
            slot = 0 if fid == 138 else 1
            h.nvlink_counters[slot] += h.nvlink_kib_per_read[slot]
            out.append(_Struct(fieldId=fid, nvmlReturn=NVML_SUCCESS, value=_Struct(ullVal=h.nvlink_counters[slot])))
        return out

    @device_call("nvmlDeviceGetComputeRunningProcesses")
    def _procs(h: SimulatedGpu) -> list:
        return [_Struct(pid=pid, usedGpuMemory=used) for pid, used in h.processes]

    @device_call("nvmlGpmQueryDeviceSupport")
    def _gpm_support(h: SimulatedGpu) -> _Struct:
        return _Struct(version=1, isSupportedDevice=1 if h.gpm is not None else 0)

    def nvmlGpmSampleAlloc() -> _GpmSample:
        return _GpmSample()

    @device_call("nvmlGpmSampleGet")
    def _gpm_get(h: SimulatedGpu, sample: _GpmSample) -> _GpmSample:
        if h.gpm is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        sample.device = h
        sample.t = time.perf_counter()
        return sample

    def nvmlGpmMetricsGet(mg: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        dev = mg.sample2.device
        if dev is None or mg.sample1.device is not dev:
            raise NVMLError(NVML_ERROR_UNKNOWN)
        dev.calls["nvmlGpmMetricsGet"] = dev.calls.get("nvmlGpmMetricsGet", 0) + 1
        code = dev.errors.get("nvmlGpmMetricsGet")
        if code is not None:
            raise NVMLError(code)
        for i in range(mg.numMetrics):
            slot = mg.metrics[i]
            value = (dev.gpm or {}).get(slot.metricId)
            if slot.metricId == 2 and value is not None and dev.timeline is not None and dev.sm_from_timeline:
                value = 100.0 * dev.timeline.sm_active_fraction(mg.sample1.t, mg.sample2.t)
            if value is None:
                slot.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            else:
                slot.nvmlReturn = NVML_SUCCESS
                slot.value = float(value)
        return mg

    nv.nvmlGpmSampleAlloc = nvmlGpmSampleAlloc
    nv.nvmlGpmMetricsGet = nvmlGpmMetricsGet
    return nv
