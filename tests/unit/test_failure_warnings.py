"""The probe's own failures that a training loop would never notice reach the stream as ``warning`` events, and
``close()`` takes a last sample. Each case plants the failure through the code a user runs (a
sampler source, a torch API that raises, a tensor the meter cannot size, a CUDA UUID lookup that
fails on the SIMULATED device layer) and reads the warning back from the recording."""

from __future__ import annotations

import torch

import probe
from probe import flops, gpu
from probe.gpu import cuda as gpu_cuda
from probe.memory import SavedTensorMeter, StateWalker
from probe.recording import read_recording
from probe.sampler import Sampler
from tests.sim.simulated_cuda import SimulatedCuda
from tests.sim.simulated_pynvml import SimulatedGpu


def _records(mon) -> list[dict]:
    return read_recording(mon.record_path).records


def _warnings(mon, where: str | None = None) -> list[dict]:
    return [r for r in _records(mon) if r["k"] == "event" and r.get("name") == "warning"
            and (where is None or r.get("where") == where)]


class _Unmergeable:
    """A source whose sections are not a mapping: merging them fails outside ``read``."""

    name = "unmergeable"

    def read(self):
        return ["not", "a", "dict"]


class _FailingFlush:
    name = "failing-flush"

    def read(self):
        return {}

    def flush(self):
        raise OSError("flush failed")


# -- sampler ------------------------------------------------------------------------------------

def test_a_failing_sampler_tick_is_a_warning_and_the_next_tick_still_runs():
    out: list[dict] = []
    errors: list[tuple[str, BaseException]] = []
    sampler = Sampler([_Unmergeable()], out.append, on_error=lambda where, exc: errors.append((where, exc)))
    sampler.tick()
    sampler.tick()
    assert [w for w, _ in errors] == ["sampler tick", "sampler tick"]
    assert isinstance(errors[0][1], AttributeError)


def test_tick_and_flush_failures_reach_the_recording_and_close_takes_a_last_sample(tmp_path):
    # 0.1 Hz: the sampler thread never ticks during this job; only close's last sample runs
    mon = probe.start(job="silent-sampler", record=tmp_path, serve=False, sample_hz=0.1)
    try:
        mon.sampler.add(_Unmergeable())
        mon.sampler.add(_FailingFlush())
        for _ in range(3):
            with mon.step():
                pass
    finally:
        mon.close()
    assert "AttributeError" in _warnings(mon, "sampler tick")[0]["message"]
    assert "flush failed" in _warnings(mon, "failing-flush flush")[0]["message"]


def test_a_job_shorter_than_one_sampling_period_records_its_peak(tmp_path):
    """The peak FLOP/s (and so the MFU) is in the ``compute`` section of samples: without a sample
    taken at close, a job that ends before the first tick has none."""
    mon = probe.start(job="short-job", record=tmp_path, serve=False, sample_hz=0.1)
    try:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model, opt, peak_flops=5e12)
        for _ in range(2):
            with mon.step():
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
    finally:
        mon.close()
    records = _records(mon)
    samples = [r for r in records if r["k"] == "sample"]
    assert samples and samples[-1]["compute"]["peak_flops"] == 5e12
    assert records.index(samples[-1]) > max(i for i, r in enumerate(records) if r["k"] == "step")


# -- compute dtype (autocast / TF32) -------------------------------------------------------------

def _raise(*args, **kwargs):
    raise RuntimeError("query failed")


def test_a_failing_autocast_query_leaves_the_dtype_unknown_and_says_why(monkeypatch):
    monkeypatch.setattr(torch, "is_autocast_enabled", _raise)
    errors: list[str] = []
    assert flops.compute_dtype(torch.float32, "cpu", lambda where, exc: errors.append(where)) is None
    assert errors == ["compute dtype"]


def test_a_failing_tf32_query_leaves_the_dtype_unknown_not_fp32(monkeypatch):
    monkeypatch.setattr(torch, "get_float32_matmul_precision", _raise)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    errors: list[str] = []
    assert flops.compute_dtype(torch.float32, "cuda", lambda where, exc: errors.append(where)) is None
    assert errors == ["compute dtype"]
    assert flops.compute_dtype(torch.float32, "cpu") == "fp32"    # no TF32 question on a CPU


def test_the_watcher_reports_a_failing_dtype_query_and_picks_no_peak(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMON_PEAK_TFLOPS", "")
    mon = probe.start(job="dtype-fails", record=tmp_path, serve=False, sample_hz=0.1)
    try:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model, opt)
        monkeypatch.setattr(torch, "is_autocast_enabled", _raise)
        with mon.step():
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    finally:
        monkeypatch.undo()
        mon.close()
    assert "query failed" in _warnings(mon, "compute dtype")[0]["message"]
    compute = [r for r in _records(mon) if r["k"] == "sample"][-1]["compute"]
    assert compute["dtype"] is None and compute["peak_flops"] is None


# -- saved-tensor meter --------------------------------------------------------------------------

class _Unsized(torch.Tensor):
    """A tensor subclass that can be neither located nor counted (some wrapper subclasses)."""

    def untyped_storage(self):
        raise RuntimeError("no storage here")

    def numel(self):
        raise RuntimeError("no size here")


def test_a_saved_tensor_the_meter_cannot_size_makes_the_result_unknown_and_a_warning():
    model = torch.nn.Linear(4, 4)
    walker = StateWalker()
    walker.add_model(model)
    walker.measure()
    errors: list[tuple[str, BaseException]] = []
    meter = SavedTensorMeter(lambda: walker.param_keys, lambda where, exc: errors.append((where, exc)))
    x = torch.randn(3, 4).as_subclass(_Unsized)
    meter.start()
    model(x * 2.0)
    meter.stop(0.0)
    assert meter.result is None               # a short total would read as fewer activations
    assert [w for w, _ in errors] == ["saved-tensor meter"]
    assert "no size here" in repr(errors[0][1])
    meter.next_due = 0.0
    meter.start()                              # the next forward measures afresh
    model(torch.randn(3, 4))
    meter.stop(0.0)
    assert meter.result == 3 * 4 * 4 and len(errors) == 1


# -- GPU UUID lookup (SIMULATED NVML and CUDA) ---------------------------------------------------

class _NoUuidCuda(SimulatedCuda):
    def device_uuid(self, index: int) -> str | None:
        raise RuntimeError("cudaGetDeviceProperties failed")


def test_a_failed_uuid_lookup_with_several_gpus_warns_that_sampling_covers_them_all(
        simulated_nvml, tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    simulated_nvml([SimulatedGpu(uuid=f"GPU-{i}ccccccc-sim") for i in range(3)])
    mon = probe.start(job="uuid-fails", record=tmp_path, serve=False, sample_hz=0.1)
    try:
        assert gpu.refine(mon, 0, _NoUuidCuda()) is None
        assert [d.index for d in mon.attached.gpu.source.devices] == [0, 1, 2]
    finally:
        mon.close()
    assert "cudaGetDeviceProperties failed" in _warnings(mon, "GPU UUID lookup")[0]["message"]
    assert "every visible GPU (3)" in _warnings(mon, "GPU selection")[0]["message"]


def test_a_failed_uuid_lookup_with_one_own_gpu_samples_that_one_and_warns(simulated_nvml, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    simulated_nvml([SimulatedGpu(uuid=f"GPU-{i}ddddddd-sim") for i in range(3)])
    mon = probe.start(job="uuid-fails-one", record=tmp_path, serve=False, sample_hz=0.1)
    try:
        match = gpu.refine(mon, 0, _NoUuidCuda())
        assert match is not None and match.index == 1
        assert [d.index for d in mon.attached.gpu.source.devices] == [1]
    finally:
        mon.close()
    warned = _warnings(mon, "GPU UUID lookup")
    assert len(warned) == 1 and "cudaGetDeviceProperties failed" in warned[0]["message"]
    assert _warnings(mon, "GPU selection") == []


# -- device poller clients -----------------------------------------------------------------------

def test_a_failing_poller_client_is_reported_at_its_first_failure():
    errors: list[str] = []
    poller = gpu_cuda.Poller(alive=lambda: True, on_error=lambda where, exc: errors.append(where))

    def broken():
        raise RuntimeError("event query failed")
    poller.clients = [broken]     # not started: polled by hand
    poller.poll_once()
    assert errors == ["device poller"] and poller.dropped == 0
    for _ in range(gpu_cuda.Poller.MAX_ERRORS - 1):
        poller.poll_once()
    assert len(errors) == gpu_cuda.Poller.MAX_ERRORS and poller.dropped == 1 and poller.clients == []
