"""FLOPs per step (counted with FlopCounterMode, real CPU torch) and the peak table."""

from __future__ import annotations

import collections
import sys
import time

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode  # a submodule: `import torch` alone does not load it

import probe
from probe import flops
from probe.recording import read_recording


def _transformer(d: int = 128, layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.1, batch_first=True), layers,
        enable_nested_tensor=False)
    return torch.nn.Sequential(enc, torch.nn.Linear(d, d))


def _steps_until_counted(mon, model, opt, x, tokens, limit_s=30.0) -> None:
    deadline = time.monotonic() + limit_s
    watcher = mon.attached.watcher
    while time.monotonic() < deadline:
        with mon.step(samples=x.shape[0], tokens=tokens):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        if watcher.flops.cache and watcher.flops.counting is None:
            with mon.step(samples=x.shape[0], tokens=tokens):     # one step that uses the cached count
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
            return
    raise AssertionError("FLOPs were not counted in time")


def test_transformer_step_flops_agree_with_6_n_tokens(tmp_path):
    model = _transformer()
    opt = torch.optim.AdamW(model.parameters())
    batch, seq = 4, 16
    x = torch.randn(batch, seq, 128)
    mon = probe.start(job="flops-test", record=tmp_path, serve=False)
    try:
        mon.watch(model=model, optimizer=opt)
        _steps_until_counted(mon, model, opt, x, tokens=batch * seq)
    finally:
        mon.close()
    steps = [r for r in read_recording(mon.record_path).records if r["k"] == "step"]
    counted = [s for s in steps if s.get("flops_source") == "counted"]
    assert counted, [s.get("flops_source") for s in steps]
    n = sum(p.numel() for p in model.parameters())
    six_n = 6 * n * batch * seq
    assert counted[-1]["flops"] == pytest.approx(six_n, rel=0.15)
    # before the background count finished, steps fell back to 6·N·tokens, labelled as such
    assert all(s.get("flops_source") in ("6N", "counted") for s in steps)


def test_meta_count_equals_a_real_count_and_touches_nothing():
    model = _transformer(d=64, layers=1)
    x = torch.randn(2, 8, 64)
    with FlopCounterMode(display=False) as real:
        model(x).sum().backward()
    for p in model.parameters():
        p.grad = None
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    replica = flops.meta_replica(model)
    forward, total = flops.count_meta(replica, flops.to_meta((x,)), {}, backward=True)
    assert total == real.get_total_flops() and 0 < forward < total
    assert torch.equal(rng, torch.get_rng_state())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_unreplayable_model_is_counted_on_one_real_step(tmp_path, monkeypatch):
    # the live count stays off in a process where dynamo has compiled a frame (probe.tracing.dynamo_has_compiled):
    # start from "nothing compiled", whatever tests ran before in this process (tests/compat compiles models)
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is not None:
        monkeypatch.setitem(dynamo_utils.counters, "frames", collections.Counter())
    class FSDPLikeWrapper(torch.nn.Module):     # class name marks it as sharded: no meta replay
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    model = FSDPLikeWrapper()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 32)
    mon = probe.start(job="flops-live", record=tmp_path, serve=False)
    try:
        mon.watch(model=model, optimizer=opt)
        for _ in range(3):
            with mon.step():
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
    finally:
        mon.close()
    steps = [r for r in read_recording(mon.record_path).records if r["k"] == "step"]
    # forward 2·8·32·32, weight gradient the same; no input gradient
    assert [s.get("flops") for s in steps] == [2 * 2 * 8 * 32 * 32] * 3


def test_user_flops_win(tmp_path):
    model = torch.nn.Linear(4, 4)
    mon = probe.start(job="flops-user", record=tmp_path, serve=False)
    try:
        mon.watch(model=model, flops_per_step=1e9)
        with mon.step():
            model(torch.randn(2, 4)).sum().backward()
        with mon.step(flops=5.0):
            model(torch.randn(2, 4)).sum().backward()
    finally:
        mon.close()
    steps = [r for r in read_recording(mon.record_path).records if r["k"] == "step"]
    assert (steps[0]["flops"], steps[0]["flops_source"]) == (1e9, "user")
    assert steps[1]["flops"] == 5.0


@pytest.mark.parametrize("name, dtype, peak", [
    ("NVIDIA GB200", "bf16", 2500e12),
    ("NVIDIA B200", "bf16", 2250e12),
    ("NVIDIA H200", "bf16", 989e12),
    ("NVIDIA H20", "bf16", 148e12),
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
    ("NVIDIA H100 PCIe", "bf16", 756e12),
    ("NVIDIA H100 NVL", "bf16", 835e12),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156e12),
    ("NVIDIA A10G", "bf16", 125e12),
    ("NVIDIA L40S", "fp8", 733e12),
    ("NVIDIA L4", "bf16", 121e12),
    ("Tesla V100-SXM2-16GB", "fp16", 125e12),
    ("Tesla T4", "bf16", None),          # no bf16 tensor cores: no peak, not a guess
    ("Intel(R) Xeon(R) Processor", "fp32", None),
    (None, "fp32", None),
])
def test_peak_table(name, dtype, peak):
    assert flops.peak_flops(name, dtype) == peak


def test_compute_dtype():
    assert flops.compute_dtype(torch.float32, "cpu") == "fp32"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert flops.compute_dtype(torch.float32, "cpu") == "bf16"
    assert flops.dtype_name(torch.float16) == "fp16"


def test_six_n():
    assert flops.six_n(1000, 64) == 384_000
    assert flops.six_n(1000, None) is None
