"""GPU counters against the SIMULATED NVML (tests/sim): no real GPU is involved.

What is verified: the probe reads every documented counter into the ``sample``
record with the right units, leaves GPM fields out on devices without GPM, turns
every NVML error into an absent value (never an exception), stops calling what a
device does not support, decodes throttle reasons, and reports "no GPU" as a state.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest
import torch

import probe
from probe import gpu
from probe.attachments import Attachments
from probe.gpu import cuda as gpu_cuda
from probe.gpu.nvml import GPM_ONLY, GPM_UNSUPPORTED, Nvml, decode_throttle
from probe.recording import read_recording
from probe.sampler import Sampler
from tests.sim.simulated_cuda import memory_stats
from tests.sim.simulated_pynvml import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNKNOWN,
    SimulatedGpu,
    build,
)

BASE_FIELDS = ("index", "name", "util", "mem_used", "mem_total", "power_w", "power_limit_w", "energy_mj", "sm_clock",
               "sm_clock_max", "temp_c", "throttle", "pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")


@pytest.fixture(autouse=True)
def restore_warning_filters():
    """Sync counting installs warnings filters; put the list back so no later test depends on them."""
    with warnings.catch_warnings():     # saves warnings.filters and puts them back on exit
        yield


class _Probe:
    """The attributes ``gpu.attach`` uses on a real Probe."""

    def __init__(self, local_rank: int = 0, world_size: int = 1) -> None:
        self.local_rank = local_rank
        self.world_size = world_size
        self.device = {"type": "cpu", "name": "test CPU", "count": 2}
        self.attached = Attachments()


def _sample(source) -> dict:
    records: list[dict] = []
    return Sampler([source], records.append).sample_once()


def _no_gpm_gpu(**kw) -> SimulatedGpu:
    return SimulatedGpu(name="NVIDIA A100-SXM4-80GB", uuid="GPU-aaaaaaaa-sim1", gpm=None, **kw)


def test_gpm_device_sample_carries_every_field(simulated_nvml):
    simulated_nvml([SimulatedGpu()])
    p = _Probe()
    gpu.attach(p)
    host = p.attached.gpu.host      # the hello's ``gpus``: the host has the GPU...
    assert host == {"count": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total": 80 * (1 << 30),
                    "driver": host["driver"], "status": None}
    assert p.device["type"] == "cpu"   # ...but this job holds nothing on it
    source = p.attached.gpu.source
    first = _sample(source)["gpus"][0]
    assert "sm_active" in first and first["sm_active"] is None    # no interval before the second sample
    source.devices[0].gpm.prev_t -= 1.0          # as if a second passed between samples
    entry = _sample(source)["gpus"][0]
    for key in BASE_FIELDS + GPM_ONLY:
        assert key in entry and entry[key] is not None, key
    assert entry["util"] == pytest.approx(0.87)
    assert entry["power_w"] == pytest.approx(512.0) and entry["power_limit_w"] == pytest.approx(700.0)
    assert entry["energy_mj"] == 1_000_000_000
    assert entry["mem_total"] == 80 * (1 << 30) and entry["mem_used"] == 30 * (1 << 30)
    assert (entry["sm_clock"], entry["sm_clock_max"], entry["temp_c"]) == (1755, 1980, 64)
    assert entry["throttle"] == ["sw_power_cap", "hw_thermal"]
    assert entry["sm_active"] == pytest.approx(0.71) and entry["sm_occupancy"] == pytest.approx(0.42)
    assert entry["tensor_active"] == pytest.approx(0.55) and entry["dram_bw"] == pytest.approx(0.63)
    assert entry["pcie_tx"] == pytest.approx(100 * (1 << 20)) and entry["nvlink_rx"] == pytest.approx(3000 * (1 << 20))


def test_non_gpm_device_has_no_gpm_fields_and_reads_links_directly(simulated_nvml):
    dev = _no_gpm_gpu()
    simulated_nvml([dev])
    nvml = Nvml()
    first = nvml.read(nvml.devices[0])
    for key in GPM_ONLY:
        assert key not in first
    assert first["pcie_tx"] == 2048 * 1024 and first["pcie_rx"] == 4096 * 1024
    assert first["nvlink_tx"] is None            # a rate needs two counter readings
    second = nvml.read(nvml.devices[0])
    assert second["nvlink_tx"] > 0 and second["nvlink_rx"] > 0
    assert dev.calls["nvmlDeviceGetPcieThroughput"] == 2   # tx + rx once: it samples 20 ms per call


def test_nvml_errors_become_absent_values_and_unsupported_calls_stop(simulated_nvml):
    dev = _no_gpm_gpu(errors={"nvmlDeviceGetUtilizationRates": NVML_ERROR_NOT_SUPPORTED,
                              "nvmlDeviceGetPowerUsage": NVML_ERROR_UNKNOWN,
                              "nvmlDeviceGetFieldValues": NVML_ERROR_NOT_SUPPORTED,
                              "nvmlDeviceGetCurrentClocksEventReasons": NVML_ERROR_FUNCTION_NOT_FOUND})
    simulated_nvml([dev])
    nvml = Nvml()
    for _ in range(3):
        entry = nvml.read(nvml.devices[0])
        assert entry["util"] is None and entry["power_w"] is None
        assert entry["nvlink_tx"] is None and entry["nvlink_rx"] is None
        assert entry["temp_c"] == 64          # the rest still reads
        assert entry["throttle"] == ["sw_power_cap", "hw_thermal"]   # from the older throttle call
    assert dev.calls["nvmlDeviceGetUtilizationRates"] == 1       # not supported: asked once
    assert dev.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert dev.calls["nvmlDeviceGetPowerUsage"] == 3             # transient error: asked again
    assert nvml.errors >= 5


def test_a_missing_busy_or_fill_reading_carries_nvmls_reason_and_the_error_count(simulated_nvml):
    """Nobody read ``Nvml.errors``: a busy not measured said only "not measured". Each GPU entry now says
    why its utilization and SM activity are missing, in NVML's words, and counts the failed calls."""
    denied = _no_gpm_gpu(errors={"nvmlDeviceGetUtilizationRates": NVML_ERROR_NO_PERMISSION})
    simulated_nvml([denied])
    nvml = Nvml()
    entry = nvml.read(nvml.devices[0])
    assert entry["why"] == {"util": "NVML: NoPermission", "sm_active": GPM_UNSUPPORTED}
    assert entry["errors"] == 1 and nvml.errors >= 1
    denied.errors.clear()                      # permanent: not asked again, the reason stays
    assert nvml.read(nvml.devices[0])["why"]["util"] == "NVML: NoPermission"


def test_a_lost_gpu_and_a_failing_gpm_metric_say_so(simulated_nvml):
    gpu = SimulatedGpu(errors={"nvmlGpmMetricsGet": NVML_ERROR_NOT_SUPPORTED})
    simulated_nvml([gpu])
    nvml = Nvml()
    dev = nvml.devices[0]
    assert "why" not in nvml.read(dev)               # the first GPM sample: nothing missing yet
    dev.gpm.prev_t -= 1.0
    entry = nvml.read(dev)
    assert entry["sm_active"] is None and entry["why"] == {"sm_active": "NVML: NotSupported on this GPU"}
    gpu.errors["nvmlDeviceGetUtilizationRates"] = NVML_ERROR_GPU_IS_LOST
    assert nvml.read(dev)["why"]["util"] == "NVML: GpuIsLost"
    entry = nvml.read(dev)
    assert entry["lost"] is True and entry["why"] == {"util": "NVML: GpuIsLost", "sm_active": "NVML: GpuIsLost"}


def test_gpm_metrics_failure_gives_none_fields_not_an_exception(simulated_nvml):
    dev = SimulatedGpu(errors={"nvmlGpmMetricsGet": NVML_ERROR_UNKNOWN})
    simulated_nvml([dev])
    nvml = Nvml()
    nvml.read(nvml.devices[0])
    nvml.devices[0].gpm.prev_t -= 1.0
    entry = nvml.read(nvml.devices[0])
    assert all(key in entry and entry[key] is None for key in GPM_ONLY)


def test_lost_gpu_is_marked_and_no_longer_queried(simulated_nvml):
    dev = _no_gpm_gpu()
    simulated_nvml([dev])
    nvml = Nvml()
    dev.errors["nvmlDeviceGetUtilizationRates"] = NVML_ERROR_GPU_IS_LOST
    entry = nvml.read(nvml.devices[0])
    assert entry["util"] is None
    before = sum(dev.calls.values())
    entry = nvml.read(nvml.devices[0])
    assert entry["lost"] is True and entry["mem_used"] is None
    assert sum(dev.calls.values()) == before


@pytest.mark.parametrize("init_error, status", [
    (12, "no NVIDIA GPU: NVML library not found"),
    (9, "no NVIDIA GPU: NVIDIA driver not loaded"),
])
def test_no_gpu_is_a_state_in_hello_and_samples(simulated_nvml, init_error, status):
    simulated_nvml([], init_error=init_error)
    p = _Probe()
    gpu.attach(p)
    assert p.device["type"] == "cpu" and p.attached.gpu.host["status"] == status
    assert _sample(p.attached.gpu.source)["gpu_status"] == status


def _real_pynvml():
    """A fresh copy of the installed nvidia-ml-py module, whatever ``sys.modules["pynvml"]`` holds."""
    import importlib.machinery
    import importlib.util
    spec = importlib.machinery.PathFinder.find_spec("pynvml")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gpu_host", [False, True], ids=["no-gpu-host", "simulated-gpu-host"])
def test_real_pynvml_without_the_driver_library_says_library_not_found(simulated_nvml, monkeypatch, gpu_host):
    """The real pynvml (not the simulation), on a machine where libnvidia-ml.so.1 cannot be loaded, must
    give the documented state. The library load is made to fail here, so the test holds on a GPU host
    too (``simulated-gpu-host``: an NVML that sees a GPU is installed as ``pynvml``)."""
    if gpu_host:
        simulated_nvml([SimulatedGpu()])
        assert Nvml().status is None                        # this "host" has a GPU
    real = _real_pynvml()
    assert "SIMULATED" not in (real.__doc__ or "") and hasattr(real, "_LoadNvmlLibrary")

    def no_library(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(real, "CDLL", no_library)
    nvml = Nvml(module=real)
    assert nvml.status == "no NVIDIA GPU: NVML library not found"
    assert nvml.devices == [] and nvml.nv is None


def test_throttle_decoding():
    assert decode_throttle(0) == []
    assert decode_throttle(0x1 | 0x8 | 0x80) == ["idle", "hw_slowdown", "hw_power_brake"]
    assert decode_throttle(0x4 | 0x1000) == ["sw_power_cap", "0x1000"]


def test_visible_devices_and_one_gpu_per_rank(simulated_nvml):
    devs = [SimulatedGpu(uuid=f"GPU-{i}aaaaaaa-sim") for i in range(4)]
    simulated_nvml(devs)
    nvml = Nvml()
    assert [d.index for d in gpu.visible_devices(nvml, env="2,3")] == [2, 3]
    assert [d.index for d in gpu.visible_devices(nvml, env="GPU-1a")] == [1]
    assert gpu.visible_devices(nvml, env="") == []
    assert [d.index for d in gpu.own_devices(nvml, local_rank=1, world_size=4)] == [1]


def test_refine_matches_the_torch_device_by_uuid(simulated_nvml, simulated_cuda, monkeypatch):
    devs = [SimulatedGpu(uuid=f"GPU-{i}bbbbbbb-sim") for i in range(2)]
    simulated_nvml(devs)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    p = _Probe()
    gpu.attach(p)
    backend = simulated_cuda(uuid="GPU-1bbbbbbb-sim")
    match = gpu.refine(p, 0, backend)
    assert match is not None and match.index == 1
    assert [d.index for d in p.attached.gpu.source.devices] == [1]


def test_default_backend_is_the_real_one():
    assert gpu_cuda.backend.name == "torch.cuda"


# -- simulated CUDA: device step time, host lead, host-device syncs ------------------------------

def test_step_timer_measures_device_time_and_lead_without_blocking(simulated_cuda):
    """Relies on: events take the time the stream reaches them. 50 ms of earlier work keeps the stream
    busy while the host records the step, so the step's events bracket exactly its 14 ms of kernels."""
    cuda = simulated_cuda()
    cuda.run(0.05)
    timer = gpu_cuda.StepTimer(cuda)
    timer.begin()
    cuda.run(0.004)
    timer.forward_end()
    cuda.run(0.008)
    timer.backward_end()
    cuda.run(0.002)
    timer.end(7)
    assert timer.poll() is True and timer.take() is None      # not complete yet: nothing read, nothing waited
    deadline = time.monotonic() + 5
    while timer.poll() and time.monotonic() < deadline:
        time.sleep(0.002)
    result = timer.take()
    assert result["gpu_step"] == 7
    assert result["gpu_time"] == pytest.approx(0.014)
    assert result["gpu_phases"] == pytest.approx({"forward": 0.004, "backward": 0.008, "optimizer": 0.002})
    assert result["lead"] >= 0.05                             # the host ran ahead by the queued work
    timer.begin()                                             # the event set went back to the pool
    assert cuda.events_created == 4


def test_sync_counter_counts_and_names_the_line(simulated_cuda):
    cuda = simulated_cuda()
    counter = gpu_cuda.SyncCounter()
    assert gpu_cuda.enable_sync_counting(cuda, counter) is None
    assert cuda.sync_mode == 1
    for _ in range(3):
        warnings.warn(gpu_cuda.SYNC_MESSAGE, stacklevel=1)  # sync-site-A: as TORCH_WARN raises it from the user's line
    warnings.warn(gpu_cuda.SYNC_MESSAGE, stacklevel=1)
    count, site = counter.take()
    assert count == 4 and site.endswith(f"test_nvml_sim.py:{_line_of('# sync-site-A')}")
    assert counter.take() == (0, None)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        warnings.warn("another warning", stacklevel=1)
    assert len(shown) == 1                          # other warnings pass through untouched


@pytest.mark.parametrize("action", ["error", "default"])
def test_switching_sync_counting_on_neither_raises_nor_prints_torchs_prototype_warning(simulated_cuda, action):
    cuda = simulated_cuda()
    counter = gpu_cuda.SyncCounter()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter(action)                # the user's filters: -W error, or every warning shown
        assert gpu_cuda.enable_sync_counting(cuda, counter) is None
        assert cuda.sync_mode == 1 and not shown
        if action == "error":                        # the user's filters still apply to everything else
            with pytest.raises(UserWarning):
                warnings.warn("the user's own warning", stacklevel=1)
        else:
            warnings.warn("the user's own warning", stacklevel=1)
            assert [str(w.message) for w in shown] == ["the user's own warning"]
    gpu_cuda.disable_sync_counting(cuda, counter)


def test_sync_counting_stays_off_when_the_script_uses_the_debug_mode(simulated_cuda):
    cuda = simulated_cuda(sync_mode=2)
    why = gpu_cuda.enable_sync_counting(cuda, gpu_cuda.SyncCounter())
    assert "already uses" in why and cuda.sync_mode == 2


def test_sync_counter_sees_warnings_raised_from_cpp():
    """The counting path on a real TORCH_WARN (a CPU one, same C++ -> Python route as the sync warning)."""
    counter = gpu_cuda.SyncCounter(message="An output with one or more elements was resized")
    counter.install_filter()
    for _ in range(2):
        torch.add(torch.ones(5), 1, out=torch.empty(3))   # sync-site-B
    count, site = counter.take()
    assert count == 2 and site.endswith(f"test_nvml_sim.py:{_line_of('# sync-site-B')}")


STEP_PAUSE = 0.1    # host time between the simulated GPU job's steps


def test_watch_on_a_simulated_gpu_fills_step_and_memory_records(simulated_cuda, simulated_nvml, monkeypatch,
                                                                 tmp_path, cuda_peak_resets):
    simulated_nvml([SimulatedGpu()])
    GiB = 1 << 30
    cuda = simulated_cuda(stats=memory_stats(allocated=10 * GiB, reserved=12 * GiB, peak=15 * GiB))
    mon = probe.start(job="simulated-gpu", record=tmp_path, serve=False, sample_hz=10)
    try:
        assert mon.device["type"] == "cuda"   # the process already allocates on the GPU
        model = torch.nn.Linear(4, 4).to(torch.bfloat16)
        cuda.place(model)                     # model.cuda(): a bf16 model on simulated cuda:0
        model.register_forward_hook(lambda *a: cuda.run(0.003))        # the forward's kernels
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model=model, optimizer=opt, syncs=True)              # sync counting is opt-in
        for _ in range(6):
            with mon.step():
                model(torch.randn(2, 4, dtype=torch.bfloat16)).sum().backward()
                cuda.run(0.006)                                         # backward kernels
                warnings.warn(gpu_cuda.SYNC_MESSAGE, stacklevel=1)  # sync-site-C: e.g. loss.item()
                opt.step()
                cuda.run(0.001)
            time.sleep(STEP_PAUSE)
        deadline = time.monotonic() + 10
        while not _memory_written(mon) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        mon.close()
    records = read_recording(mon.record_path).records
    steps = [r for r in records if r["k"] == "step"]
    assert len(steps) == 6
    assert all(s["syncs"] == 1 and s["sync_site"].endswith(f"test_nvml_sim.py:{_line_of('# sync-site-C')}")
               for s in steps), [(s.get("syncs"), s.get("sync_site")) for s in steps]
    timed = [s for s in steps if "gpu_time" in s]
    assert timed and all(s["gpu_step"] < s["step"] for s in timed)
    # events bracket the step on the GPU timeline: its 10 ms of kernels plus whatever the device idled
    # while the host ran Python between launches (so never less than the kernels, and never more than
    # the kernels plus the host's whole step, give or take the host being descheduled between reading
    # its clock and recording an event on a loaded machine: far less than the pause between steps,
    # which events that did not bracket the step would include)
    by_step = {s["step"]: s for s in steps}
    slack = STEP_PAUSE / 2
    assert all(0.010 - 1e-6 <= s["gpu_time"] <= 0.010 + by_step[s["gpu_step"]]["dur"] + slack for s in timed), \
        [(s["gpu_time"], by_step[s["gpu_step"]]["dur"]) for s in timed]
    # the lead (of the steps timed, one per StepTimer.TIME_EVERY; the others carry neither): from the host ending
    # step gpu_step to the poller seeing its end event complete. The poller can only see it after the host
    # ended the step, and must have seen it before the step whose record carries it ended (plus that step's
    # end hooks, well under 50 ms); never 0, as the clamp would make it
    leads = [s for s in timed if "lead" in s]
    assert leads and all(0 < s["lead"] < s["t"] - by_step[s["gpu_step"]]["t"] + 0.05 for s in leads)
    compute = [r["compute"] for r in records if r["k"] == "sample" and "compute" in r][-1]
    assert compute["dtype"] == "bf16" and compute["peak_flops"] == 989e12 and compute["device"] == "cuda:0"
    memory = [r for r in records if r["k"] == "memory"][-1]
    assert memory["device"] == "cuda:0" and memory["cache"] == 2 * GiB and memory["limit"] == 80 * GiB
    assert cuda.calls.count("set_sync_debug_mode(1)") == 1 and cuda_peak_resets == []   # never resets the user's peaks
    assert cuda.sync_mode == 0                   # close() switched the debug mode back off


def _memory_written(mon) -> bool:
    return any(r["k"] == "memory" for r in read_recording(mon.record_path).records)


def _line_of(text: str) -> int:
    source = Path(__file__).read_text().splitlines()
    return next(i + 1 for i, line in enumerate(source) if line.rstrip().endswith(text) or f"{text}:" in line)


def test_shutdown_undoes_the_sessions_init_once_and_reads_nothing_after():
    """``perfmon detach`` leaves NVML initialized as many times as it found it (NVML counts inits)."""
    nv = build([SimulatedGpu()])
    nv.nvmlInit()                       # the job's own NVML use, before perfmon came
    nvml = Nvml(nv)
    assert nv.initialized() == 2 and nvml.status is None
    nvml.shutdown()
    nvml.shutdown()                     # a second call does nothing: one init, one shutdown
    assert nv.initialized() == 1
    assert nvml.nv is None and nvml.status == "NVML shut down"
