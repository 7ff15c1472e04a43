"""Memory breakdown: exact state bytes on real CPU tensors; CUDA fields against the
SIMULATED CUDA backend and SIMULATED NVML (tests/sim), never a real GPU."""

from __future__ import annotations

import os

import torch

import probe
from probe.gpu.nvml import Nvml
from probe.memory import (
    MEMORY_PERIOD,
    MemorySource,
    SavedTensorMeter,
    StateWalker,
    cuda_memory,
    local_tensor,
    storage_bytes,
)
from probe.recording import read_recording
from tests.sim.simulated_cuda import memory_stats
from tests.sim.simulated_pynvml import SimulatedGpu


def _trained(model: torch.nn.Module) -> tuple[StateWalker, torch.optim.Optimizer]:
    opt = torch.optim.AdamW(model.parameters())
    walker = StateWalker()
    walker.add_model(model)
    walker.add_optimizer(opt)
    model(torch.randn(3, 16)).sum().backward()
    walker.capture_grads()            # where the optimizer pre-hook calls it
    opt.step()
    opt.zero_grad()                    # set_to_none: gradients are gone when the sampler walks
    return walker, opt


def test_params_grads_optimizer_state_are_exact_for_adamw():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    walker, _ = _trained(model)
    state = walker.measure()
    params = sum(p.numel() * 4 for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    assert state["params"] == params
    assert state["grads"] == params
    assert state["optimizer"] == 2 * params + 4 * n_tensors     # exp_avg, exp_avg_sq + float32 step counters
    assert state["trainable"] == params // 4


def test_shared_storage_counts_once():
    emb = torch.nn.Embedding(10, 8)
    head = torch.nn.Linear(8, 10, bias=False)
    head.weight = emb.weight                   # tied weights
    model = torch.nn.ModuleList([emb, head])
    walker = StateWalker()
    walker.add_model(model)
    assert walker.measure()["params"] == 10 * 8 * 4
    base = torch.zeros(100)
    seen: set = set()
    assert storage_bytes(base[:10], seen) == 400 and storage_bytes(base[50:], seen) == 0


def test_dtensor_counts_its_local_shard():
    class DTensor:                     # stands in for torch.distributed.tensor.DTensor's layout
        def __init__(self, local: torch.Tensor) -> None:
            self._local_tensor = local

    shard = torch.zeros(5)
    assert local_tensor(DTensor(shard)) is shard
    assert storage_bytes(DTensor(shard), set()) == 20


def test_cuda_record_fields_from_one_stats_read(simulated_cuda, simulated_nvml, cuda_peak_resets):
    GiB = 1 << 30
    stats = memory_stats(allocated=20 * GiB, reserved=26 * GiB, peak=31 * GiB, peak_reserved=33 * GiB,
                         inactive_split=3 * GiB, retries=2, ooms=1)
    cuda = simulated_cuda(stats=stats, total=80 * GiB)
    simulated_nvml([SimulatedGpu(processes=[(os.getpid(), 28 * GiB)])])
    nvml = Nvml()
    walker = StateWalker()
    walker.last = {"params": 4 * GiB, "grads": 4 * GiB, "optimizer": 8 * GiB, "trainable": 1}
    walker.models.append(lambda: object())          # something is watched
    walker.measure = lambda now=None: walker.last   # type: ignore[method-assign]
    out: list[dict] = []
    source = MemorySource(out.append, walker, device_type="cuda", index=0, cuda=cuda, nvml=nvml,
                          nvml_device=nvml.devices[0])
    assert source.read() == {}
    rec = out[0]
    assert rec["k"] == "memory" and rec["device"] == "cuda:0"
    assert (rec["params"], rec["grads"], rec["optimizer"]) == (4 * GiB, 4 * GiB, 8 * GiB)
    assert rec["activations"] == 31 * GiB - 16 * GiB              # peak minus resident state
    assert rec["cache"] == 6 * GiB and rec["fragmentation"] == 3 * GiB
    assert rec["other"] == 2 * GiB                                 # NVML process use beyond reserved
    assert (rec["limit"], rec["peak"], rec["peak_reserved"]) == (80 * GiB, 31 * GiB, 33 * GiB)
    assert (rec["alloc_retries"], rec["ooms"]) == (2, 1)
    assert cuda.calls.count("memory_stats") == 1
    assert cuda_peak_resets == []                                # never resets the user's peaks
    source.read()                                                # within MEMORY_PERIOD: no new read
    assert cuda.calls.count("memory_stats") == 1
    source.last_read -= MEMORY_PERIOD
    source.read()                                                # nothing changed: no new record
    assert len(out) == 1
    cuda.stats["num_ooms"] = 2
    source.last_read -= MEMORY_PERIOD
    source.read()
    assert len(out) == 2 and out[1]["ooms"] == 2
    assert cuda_peak_resets == []


def test_peak_reset_recorder_sees_torch_reset_entry_points(cuda_peak_resets):
    """The recorder behind ``cuda_peak_resets`` would notice the probe resetting the user's peaks."""
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory.reset_max_memory_allocated()
    assert cuda_peak_resets == ["torch.cuda.reset_peak_memory_stats", "torch.cuda.memory.reset_max_memory_allocated"]


def test_cuda_other_falls_back_to_device_use_when_pid_is_not_visible(simulated_nvml):
    simulated_nvml([SimulatedGpu(mem_used=30 << 30, processes=[(999_999, 28 << 30)])])   # host PID namespace
    nvml = Nvml()
    source = MemorySource(lambda r: None, StateWalker(), device_type="cuda", nvml=nvml, nvml_device=nvml.devices[0])
    assert source._nvml_used() == 30 << 30


def test_cuda_fields_without_a_model():
    rec = cuda_memory(memory_stats(allocated=100, reserved=300, peak=250), None, 1000, None)
    assert rec["cache"] == 200 and rec["other"] is None and "activations" not in rec


def test_cpu_record_uses_rss_and_the_memory_limit(monkeypatch):
    monkeypatch.setenv("PERFMON_MEMORY_LIMIT", "8G")
    model = torch.nn.Linear(16, 4)
    walker, _ = _trained(model)
    out: list[dict] = []
    source = MemorySource(out.append, walker, device_type="cpu")
    source.read()
    rec = out[0]
    assert rec["device"] == "cpu" and rec["limit"] == 8 << 30 and rec["limit_source"] == "PERFMON_MEMORY_LIMIT"
    assert rec["rss"] > 0 and rec["peak"] >= rec["rss"]
    assert rec["params"] == 68 * 4
    assert rec["other"] == rec["rss"] - rec["params"] - rec["grads"] - rec["optimizer"]


def test_saved_tensor_meter_counts_activations_not_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    walker = StateWalker()
    walker.add_model(model)
    walker.measure()
    meter = SavedTensorMeter(lambda: walker.param_keys)
    meter.start()
    model(torch.randn(5, 8)).sum().backward()
    meter.stop(0.0)
    # addmm saves its input (5x8) and ReLU its output (5x16, shared with the second addmm's input)
    assert meter.result == (5 * 8 + 5 * 16) * 4
    assert not meter.due(1.0) and meter.due(1e9)


def test_oom_raised_through_step_is_recorded_before_it_propagates(tmp_path):
    mon = probe.start(job="oom-test", record=tmp_path, serve=False)
    try:
        raised = False
        try:
            with mon.step():
                raise torch.OutOfMemoryError("CUDA out of memory (raised by the test)")
        except torch.OutOfMemoryError:
            raised = True
        assert raised
    finally:
        mon.close()
    events = [r for r in read_recording(mon.record_path).records if r["k"] == "event"]
    assert any(e["name"] == "oom" and e["error"] == "OutOfMemoryError" for e in events)
