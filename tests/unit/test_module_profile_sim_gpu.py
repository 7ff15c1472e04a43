"""The profile's GPU timer on the simulated device layer (tests/sim/simulated_cuda.py, which says
it is a simulation): module times come from CUDA events, i.e. the device timeline, not from the
host, which only enqueues the work and returns at once. The ``gpu`` tests run the same on a real
GPU (``python -m pytest -m gpu``; skipped without one)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn

import probe
from probe.gpu.cuda import EventPool
from probe.module_profile import _EventClock
from tests.sim.simulated_cuda import SimulatedKernel


def test_an_event_span_is_the_device_time_between_two_marks(simulated_cuda):
    device = simulated_cuda()
    clock = _EventClock(EventPool(device))
    a = clock.mark()
    device.run(0.03)             # the host goes on at once; the device is busy for 30 ms
    b = clock.mark()
    assert clock.seconds(a, b) == pytest.approx(0.03, abs=0.005)


def test_a_profile_on_a_cuda_job_times_modules_on_the_device_timeline(simulated_cuda):
    device = simulated_cuda()
    mon = probe.start(job="sim-gpu", serve=False)
    try:
        model = nn.Sequential(SimulatedKernel(device, 0.020), SimulatedKernel(device, 0.005))
        device.place(model)                              # model.cuda() on the simulated device
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model, opt)
        assert mon.attached.watcher.device_type == "cuda"
        got = []
        mon.emit = got.append                            # the profile record, as the sender would get it
        assert mon.handle_request({"k": "request", "t": 0.0, "id": 9, "op": "profile", "steps": 2, "depth": 1}) is None
        deadline = time.monotonic() + 20
        while not any(r.get("k") == "profile" for r in got):   # a job steps on until the profile is out
            assert time.monotonic() < deadline, "no profile record"
            with mon.step():
                model(torch.ones(4)).sum().backward()
                opt.step()
    finally:
        mon.close()
    rec = next(r for r in got if r.get("k") == "profile")
    rows = {m["name"]: m for m in rec["modules"]}
    assert rec["timer"] == "cuda_events"
    assert rows["0"]["fwd_s"] == pytest.approx(0.020, abs=0.004)
    assert rows["1"]["fwd_s"] == pytest.approx(0.005, abs=0.004)
    assert rows[""]["fwd_s"] == pytest.approx(0.025, abs=0.006)


def _cuda_job(mon, request, steps_until):
    """A CUDA MLP watched by ``mon``; ``request`` is asked once the model is watched (a profile needs
    one), then the job steps until ``steps_until()``."""
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, opt)
    assert mon.handle_request(request) is None
    x = torch.randn(256, 1024, device="cuda")
    deadline = time.monotonic() + 60
    while not steps_until():
        assert time.monotonic() < deadline, "no result"
        with mon.step():
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    return model


@pytest.mark.gpu
def test_on_a_real_gpu_a_profile_times_modules_with_cuda_events_and_counts_their_flops():
    mon = probe.start(job="gpu-profile", serve=False)
    got = []
    mon.emit = got.append
    try:
        model = _cuda_job(mon, {"k": "request", "t": 0.0, "id": 1, "op": "profile", "steps": 5, "depth": 1},
                          lambda: any(r.get("k") == "profile" for r in got))
    finally:
        mon.close()
    rec = next(r for r in got if r.get("k") == "profile")
    rows = {m["name"]: m for m in rec["modules"]}
    assert rec["timer"] == "cuda_events" and rec["peak_flops"] is not None
    assert rows["0"]["flops"] == 2 * (2 * 256 * 1024 * 1024)     # forward and grad weight: x needs no grad
    assert all(rows[n]["fwd_s"] > 0 and rows[n]["bwd_s"] > 0 for n in ("0", "2"))
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0


@pytest.mark.gpu
def test_on_a_real_gpu_a_capture_measures_the_device_busy_share():
    mon = probe.start(job="gpu-capture", serve=False)
    got = []
    mon.emit = got.append
    try:
        _cuda_job(mon, {"k": "request", "t": 0.0, "id": 2, "op": "capture", "steps": 3},
                  lambda: any(r.get("k") == "capture" for r in got))
    finally:
        mon.close()
    rec = next(r for r in got if r.get("k") == "capture")
    assert rec.get("error") is None and 0 < rec["device_busy"] <= 1
    assert any("gemm" in op["name"].lower() or "mm" in op["name"] for op in rec["top"])
