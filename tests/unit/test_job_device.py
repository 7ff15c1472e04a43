"""The job's device comes from the job, through the probe's real detection, on the SIMULATED device
layer (tests/sim): a simulated NVML host GPU whose utilization is measured on a simulated CUDA
stream, and models "moved to the GPU" with ``SimulatedCuda.place`` (what ``model.cuda()`` does to
where ``tensor.device`` says a parameter lives). Nothing here talks to a GPU.

Semantics relied on: NVML utilization is the share of recent time a kernel ran on the stream;
the caching allocator's counters say whether this process allocated on a GPU."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import probe
from perfmon_analysis import verdict as V
from perfmon_analysis.runmodel import RunModel
from probe.recording import read_recording
from tests.sim.simulated_pynvml import NVML_ERROR_NOT_SUPPORTED, SimulatedGpu
from tests.unit.verdict_synth import Rank, records


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, cuda=None, kernels_s: float = 0.0) -> None:
    x = torch.randn(256, 64)
    for _ in range(4):                      # a few ms of real CPU work
        model(x).sum().backward()
    if cuda is not None and kernels_s:
        cuda.run(kernels_s)                 # what the step would launch on a GPU
    opt.step()
    opt.zero_grad()


def _train(mon, model, opt, steps: int, cuda=None, kernels_s: float = 0.0, samples: int = 3) -> None:
    """``steps`` steps, then on until the probe sent ``samples`` more samples (seen through a tap on
    its sender thread), so the job's device was sampled after the steps whatever the machine's load."""
    seen = threading.Semaphore(0)
    mon.add_tap(lambda rec: seen.release() if rec.get("k") == "sample" else None)
    for _ in range(steps):
        with mon.step():
            _step(model, opt, cuda, kernels_s)
    deadline = time.monotonic() + 30
    for _ in range(samples):
        while not seen.acquire(blocking=False):   # steps back to back: a wait here is time between steps
            assert time.monotonic() < deadline, "the sampler sent no sample"
            with mon.step():
                _step(model, opt, cuda, kernels_s)


def _view(path) -> tuple[RunModel, list[dict]]:
    records = read_recording(path).records
    model = RunModel()
    for rec in records:
        model.ingest("r0", rec)
    return model, records


def _cuda_job(name: str, cuda, tmp_path) -> tuple[RunModel, list[dict]]:
    """A watched model placed on the simulated GPU, trained and sampled; its recording read back."""
    model, opt = _model()
    cuda.place(model)
    mon = probe.start(job=name, record=tmp_path, serve=False, sample_hz=20)
    try:
        mon.watch(model=model, optimizer=opt)
        _train(mon, model, opt, 30, cuda, 0.001)
    finally:
        mon.close()
    return _view(mon.record_path)


def test_a_cpu_model_on_a_gpu_host_is_a_cpu_job(simulated_cuda, simulated_nvml, tmp_path):
    """The host's GPU idles (0% busy); the job trains on the CPU. Judging the host's GPU would read
    0% busy and call the job host-bound; the job's device is the CPU."""
    cuda = simulated_cuda()
    simulated_nvml([SimulatedGpu(timeline=cuda, gpm=None)])
    model, opt = _model()
    mon = probe.start(job="cpu-on-gpu-host", record=tmp_path, serve=False, sample_hz=20)
    try:
        mon.watch(model=model, optimizer=opt)
        _train(mon, model, opt, 30)
    finally:
        mon.close()
    run, records = _view(mon.record_path)
    hello = records[0]
    assert hello["device"]["type"] == "cpu" and hello["gpus"]["count"] == 1
    assert hello["gpus"]["name"] == "NVIDIA H100 80GB HBM3"     # the host's GPU, shown as the host's
    assert all(r["device"]["type"] == "cpu" for r in records if r["k"] == "sample")
    view = run.view()
    verdict = V.evaluate(view)
    assert view.device_type == "cpu" and view.metrics.device_busy_source == "thread_cpu"
    # judged as the CPU job it is, on its thread's CPU; never from the idle host GPU (host_overhead,
    # low fill, syncs), whatever a loaded machine's scheduler took from the thread between its steps
    assert verdict.bottleneck not in ("host_overhead", "low_fill", "host_sync", "not_measured"), verdict.headline
    assert "GPU" not in verdict.headline and "CUDA" not in verdict.headline, verdict.headline


def test_watch_before_cuda_follows_the_model_to_the_gpu(simulated_cuda, simulated_nvml, tmp_path):
    """``mon.watch(model)`` before ``model.cuda()``: the job starts as a CPU job and becomes a CUDA job
    once the model moved, with CUDA events, sync counting and device memory from then on."""
    cuda = simulated_cuda()
    simulated_nvml([SimulatedGpu(timeline=cuda, gpm=None)])
    model, opt = _model()
    mon = probe.start(job="watch-then-cuda", record=tmp_path, serve=False, sample_hz=20)
    try:
        mon.watch(model=model, optimizer=opt, syncs=True)
        watcher = mon.attached.watcher
        _train(mon, model, opt, 3, samples=1)            # sampled while on the CPU
        assert (watcher.device_type, watcher.timer, watcher.syncs) == ("cpu", None, None)
        cuda.place(model)                                   # model.cuda()
        deadline = time.monotonic() + 30
        while watcher.device_type != "cuda":                # the sampler notices; the next step applies it
            assert time.monotonic() < deadline, "the move to the GPU was never seen"
            with mon.step():
                _step(model, opt, cuda, 0.002)
        assert watcher.device_index == 0 and watcher.timer is not None and watcher.syncs is not None
        while not watcher.timer.free:        # until the poller has read one step's events back
            assert time.monotonic() < deadline, "no step's CUDA events completed"
            with mon.step():
                _step(model, opt, cuda, 0.002)
        _train(mon, model, opt, 1, cuda, 0.002)
    finally:
        mon.close()
    run, records = _view(mon.record_path)
    assert records[0]["device"]["type"] == "cpu"
    devices = [r["device"]["type"] for r in records if r["k"] == "sample"]
    assert devices[0] == "cpu" and devices[-1] == "cuda" and devices.index("cuda") > 0
    last = [r for r in records if r["k"] == "sample"][-1]["device"]
    assert last["name"] == "NVIDIA H100 80GB HBM3" and last["peak_flops"]["bf16"] == 989e12 and last["status"] is None
    assert any("gpu_time" in r for r in records if r["k"] == "step")       # CUDA events time the steps
    view = run.view()
    # busy measured, from NVML or, where every timed step was queued whole, the steps' own timeline
    assert view.device_type == "cuda" and view.metrics.device_busy_source in ("nvml_util", "cuda_timeline")


def test_a_cuda_job_whose_utilization_is_not_supported_is_never_healthy(simulated_cuda, simulated_nvml, tmp_path):
    """NVML lists the GPU but answers NotSupported for utilization (MIG, some vGPUs), no GPM: the job is
    still a CUDA job, its busy is not measured, and the verdict says so instead of calling it healthy."""
    cuda = simulated_cuda()
    simulated_nvml([SimulatedGpu(timeline=cuda, gpm=None,
                                 errors={"nvmlDeviceGetUtilizationRates": NVML_ERROR_NOT_SUPPORTED})])
    run, _ = _cuda_job("util-not-supported", cuda, tmp_path)
    view = run.view()
    verdict = V.evaluate(view)
    assert view.device_type == "cuda" and view.metrics.device_busy is None
    assert view.metrics.device_busy_unknown["0"].startswith("NVML: NotSupported on this GPU")
    assert verdict.bottleneck == "not_measured" and verdict.severity == "warn"
    assert "device_busy" in verdict.as_json()["unknown"]


def test_two_gpus_and_a_failing_uuid_lookup_leave_busy_unmeasured(simulated_cuda, simulated_nvml, tmp_path,
                                                                  monkeypatch):
    """Two visible GPUs, and torch cannot give the UUID that ties cuda:0 to one of them: which GPU's
    counters are the job's is unknown, so its busy is not measured (never the first GPU's by guess)."""
    cuda = simulated_cuda()
    busy_gpu = SimulatedGpu(uuid="GPU-00000000-sim0-0000-0000-000000000000", util=95, gpm=None)
    idle_gpu = SimulatedGpu(uuid="GPU-11111111-sim1-0000-0000-000000000000", util=3, gpm=None)
    simulated_nvml([idle_gpu, busy_gpu])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def no_uuid(index: int) -> str:
        raise RuntimeError("device properties unavailable")

    monkeypatch.setattr(cuda, "device_uuid", no_uuid)
    run, records = _cuda_job("uuid-fails", cuda, tmp_path)
    device = [r for r in records if r["k"] == "sample"][-1]["device"]
    assert device["type"] == "cuda" and "not measured" in device["status"]
    view = run.view()
    assert view.device_type == "cuda" and view.metrics.device_busy is None


@pytest.mark.parametrize("sm_active,util,busy,fill", [
    (0.05, 100, 1.00, 0.05),      # one small kernel: a kernel ran all the time (busy), on 5% of the SMs (fill)
    (0.35, 40, 0.40, 0.875),      # kernels 40% of the time filling most of the device while they ran
    (None, 60, 0.60, None),       # no GPM (pre-Hopper): busy from utilization, fill not measured
])
def test_gpu_busy_is_time_a_kernel_ran_and_sm_activity_is_fill(sm_active, util, busy, fill):
    """Busy answers "did a kernel run" (NVML utilization); SM activity over it is the fill. Before the
    split, SM activity was read as busy: the first row read 5% busy on a device that never idled."""
    model = RunModel()
    for rec in records(Rank(gpu_util=util, sm_active=sm_active), device="cuda"):
        model.ingest("r0", rec)
    m = model.view().metrics
    assert m.device_busy == pytest.approx(busy) and m.device_busy_source == "nvml_util"
    assert m.device_fill == (None if fill is None else pytest.approx(fill))
    assert m.sm_active == (None if sm_active is None else pytest.approx(sm_active))


class _Hybrid(torch.nn.Module):
    """A CPU embedding in front of layers on the (simulated) GPU: the embedding's lookups run on the host,
    the layers' kernels on the device, as a model too large for device memory is often split."""

    def __init__(self, cuda) -> None:
        super().__init__()
        self.cuda = cuda
        self.embed = torch.nn.Embedding(256, 256)                       # 256 KiB of fp32, left on the CPU
        self.layers = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
        cuda.place(self.layers)                                          # self.layers.cuda()

    def forward(self, x):
        out = self.layers(self.embed(x))
        self.cuda.run(0.001)                                             # the layers' kernels
        return out


class _Offloaded(torch.nn.Module):
    """Parameters kept in host memory and the compute on the GPU (FSDP CPUOffload, ZeRO-offload): no
    parameter is on CUDA, the step's tensors are."""

    def __init__(self, cuda) -> None:
        super().__init__()
        self.cuda = cuda
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        out = self.lin(x)
        self.cuda.place(out)                  # the output tensor lives on the device
        self.cuda.run(0.001)
        return out


def _offload_job(name, module, inputs, tmp_path):
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    mon = probe.start(job=name, record=tmp_path, serve=False, sample_hz=20)
    seen = threading.Semaphore(0)
    mon.add_tap(lambda rec: seen.release() if rec.get("k") == "sample" and
                rec.get("device", {}).get("type") == "cuda" else None)
    try:
        mon.watch(model=module, optimizer=opt)
        deadline = time.monotonic() + 30
        steps = 0
        for _ in range(2):                              # two samples that saw the job on CUDA, 10 steps
            while not seen.acquire(timeout=0.01) or steps < 10:
                assert time.monotonic() < deadline, "the job was never seen on CUDA"
                with mon.step():
                    module(inputs).sum().backward()
                    opt.step()
                    opt.zero_grad()
                steps += 1
        watcher = mon.attached.watcher
        timed = watcher.device_type == "cuda" and watcher.timer is not None
    finally:
        mon.close()
    run, records = _view(mon.record_path)
    return run, [r for r in records if r["k"] == "sample"][-1]["device"], timed


def test_a_cpu_embedding_in_front_of_gpu_layers_is_a_cuda_job_with_its_host_share(simulated_cuda, simulated_nvml,
                                                                                   tmp_path):
    """Before: the job's device was its first parameter's, the CPU embedding's: a CUDA job judged as a CPU
    one, with no CUDA timing. Any parameter on CUDA makes it a CUDA job; the embedding's bytes are stated
    as the share of parameters in host memory."""
    cuda = simulated_cuda()
    simulated_nvml([SimulatedGpu(timeline=cuda, gpm=None)])
    model = _Hybrid(cuda)
    run, device, timed = _offload_job("hybrid", model, torch.randint(0, 256, (32,)), tmp_path)
    embed = 256 * 256 * 4
    layers = 2 * (256 * 256 + 256) * 4
    assert device["type"] == "cuda" and device["offloaded"] == pytest.approx(embed / (embed + layers), abs=1e-4)
    assert timed                                                      # CUDA events time its steps
    view = run.view()
    assert view.device_type == "cuda" and view.metrics.params_offloaded == pytest.approx(0.3325, abs=1e-3)


def test_parameters_offloaded_to_the_cpu_with_the_compute_on_cuda_is_a_cuda_job(simulated_cuda, simulated_nvml,
                                                                               tmp_path):
    """Every parameter in host memory, the forward's output on the device: the job computes on CUDA, all
    of its parameter bytes offloaded. Before: a CPU job (its first parameter's device)."""
    cuda = simulated_cuda()
    simulated_nvml([SimulatedGpu(timeline=cuda, gpm=None)])
    run, device, timed = _offload_job("offload", _Offloaded(cuda), torch.randn(8, 64), tmp_path)
    assert device["type"] == "cuda" and device["offloaded"] == 1.0 and timed
    assert run.view().device_type == "cuda"


def test_job_placement_counts_every_parameter_and_the_step_output():
    from probe.gpu.job import job_placement, output_placement

    cpu = [torch.zeros(10), torch.zeros(30)]
    assert job_placement(cpu, None) == (("cpu", None), None)
    assert job_placement(cpu, ("cuda", 0)) == (("cuda", 0), 1.0)
    assert job_placement([], None) is None
    assert job_placement(cpu + cpu, None) == (("cpu", None), None)         # a shared parameter counts once
    assert output_placement({"logits": torch.zeros(2), "loss": None}) == ("cpu", None)
    assert output_placement((torch.zeros(1),)) == ("cpu", None) and output_placement(3) is None
