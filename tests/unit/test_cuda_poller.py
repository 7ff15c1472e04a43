"""The CUDA completion poller, the step timer's lead sampling, pooled profile events and ``tokens=``
given as a device tensor, against the SIMULATED CUDA backend (tests/sim/simulated_cuda.py: one
stream on the host's clock; events complete when the stream reaches them). No GPU is involved."""

from __future__ import annotations

import math
import statistics
import threading
import time

import pytest
import torch
import torch.nn as nn

import probe
from probe import flops, records
from probe.gpu.cuda import EventPool, Poller, StepTimer
from probe.recording import read_recording
from tests.sim.simulated_cuda import SimulatedCuda, SimulatedDeviceTensor, SimulatedKernel


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


# -- the poller's schedule -----------------------------------------------------------------------

def test_the_poller_sleeps_while_idle_backs_off_without_an_estimate_and_follows_one():
    answer: list = [False]
    poller = Poller(alive=lambda: True)
    poller.clients = [lambda: answer[0]]          # not started: polled by hand
    assert poller.poll_once() is None             # nothing pending: sleep until woken (or IDLE)
    answer[0] = True                              # pending, no idea when: 1, 2, 4 ... 50 ms
    assert [poller.poll_once() for _ in range(8)] == [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05]
    poller.wake()                                 # new work: the back-off starts again
    assert poller.poll_once() == 0.001
    answer[0] = 0.02                              # pending, expected done in 20 ms
    assert poller.poll_once() == 0.02
    answer[0] = 5.0                               # far off: still looked at every MAX_WAIT
    assert poller.poll_once() == Poller.MAX_WAIT
    answer[0] = 0.0
    assert poller.poll_once() == Poller.MIN_WAIT


class OnTime:
    """The host clock (``time.perf_counter``, which the simulated device runs on) moved by hand, and
    the poller's thread as one that is never late: each poll runs exactly when the poller's schedule
    (its clients' answers, ``wake()``) says, as ``Poller.run`` waits for it. On a real thread a
    loaded machine delays every poll; what the schedule buys is what these tests judge, whatever the
    load (bench/bench_poller.py measures it on real threads)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, poller: Poller) -> None:
        self.now, self.poller = 1000.0, poller
        monkeypatch.setattr(time, "perf_counter", lambda: self.now)
        monkeypatch.setattr(time, "sleep", self.advance)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass, the polls due meanwhile each at its time."""
        end = self.now + max(0.0, seconds)
        poller = self.poller
        while min(poller.due, poller.requested) <= end:
            self.now = max(self.now, min(poller.due, poller.requested))
            poller.due = poller.requested = math.inf
            wait = poller.poll_once()
            poller.due = self.now + (poller.idle_wait() if wait is None else wait)
        self.now = end


def _on_time_poller(monkeypatch: pytest.MonkeyPatch) -> tuple[Poller, OnTime]:
    poller = Poller(alive=lambda: False)     # its own thread ends at once: the polls run on OnTime's clock
    return poller, OnTime(monkeypatch, poller)


def _gpu_bound_job(cuda: SimulatedCuda, timer: StepTimer, clock: OnTime, seconds: float, gpu_s: float,
                   host_s: float = 0.001) -> dict[int, float]:
    """Steps of ``gpu_s`` kernels after ``host_s`` of host work; the host blocks while more than one
    step is queued (it reads an older step's loss). Returns each step's true lead: its end event's
    device time - the host time it ended."""
    truth = {}
    t0 = time.perf_counter()
    step = 0
    while time.perf_counter() - t0 < seconds:
        clock.advance(host_s)
        timer.begin()
        timed = timer.cur is not None
        cuda.run(gpu_s)
        timer.end(step)
        if timed:
            truth[step] = max(0.0, timer.pending[-1].events[3].device_t - timer.pending[-1].host_end)
        step += 1
        behind = cuda.free_at - time.perf_counter() - gpu_s
        if behind > 0:
            clock.advance(behind)       # the simulated host-device sync (the device model is on the host clock)
    return truth


def test_a_gpu_bound_job_wakes_the_poller_far_less_than_every_5_ms_and_leads_stay_accurate(monkeypatch):
    poller, clock = _on_time_poller(monkeypatch)
    cuda = SimulatedCuda()
    timer = StepTimer(cuda, poller=poller)
    t0 = time.perf_counter()
    truth = _gpu_bound_job(cuda, timer, clock, seconds=1.5, gpu_s=0.010)
    elapsed = time.perf_counter() - t0
    wakeups = poller.wakeups
    clock.advance(cuda.free_at - time.perf_counter() + Poller.MAX_WAIT)     # the device drains, a poll looks
    assert not timer.pending
    got = list(timer.results)
    # the previous poller woke every 5 ms while anything was pending: ~200 times a second here
    assert wakeups / elapsed < 100, f"{wakeups / elapsed:.0f} wake-ups/s"
    errors = [r["lead"] - truth[r["gpu_step"]] for r in got if "lead" in r]
    assert len(errors) >= 5
    true_lead = statistics.median(truth.values())
    assert all(e >= -1e-6 for e in errors)     # a lead is never read short
    assert statistics.median(errors) <= max(0.004, 0.3 * true_lead), errors


def test_an_idle_poller_sees_a_new_step_at_once_not_after_its_idle_sleep(monkeypatch):
    """The real poller thread, asleep with nothing pending for a minute: a step that ends wakes it,
    so the step is seen within the wait below, far sooner than the idle sleep would have ended."""
    monkeypatch.setattr(Poller, "IDLE", 60.0)
    cuda = SimulatedCuda()
    poller = Poller(alive=lambda: True)
    timer = StepTimer(cuda, poller=poller)
    try:
        _wait_for(lambda: poller.wakeups >= 1 and poller.due > time.perf_counter() + Poller.IDLE / 2)  # asleep
        timer.begin()
        cuda.run(0.002)
        t0 = time.perf_counter()
        timer.end(0)
        _wait_for(lambda: len(timer.results) == 1)      # 10 s at most: the idle sleep had a minute left
        seen_after = time.perf_counter() - t0
    finally:
        poller.stop()
    assert 0.002 <= timer.results[0]["lead"] <= seen_after     # read by the poll that saw the step done


def test_an_idle_poller_wakes_at_most_once_per_idle_period():
    poller = Poller(alive=lambda: True)
    poller.add(lambda: False, wakes=True)
    try:
        t0 = time.perf_counter()
        time.sleep(0.6)                     # the measuring window (nothing is waited for)
        wakeups, elapsed = poller.wakeups, time.perf_counter() - t0
    finally:
        poller.stop()
    assert wakeups <= elapsed / Poller.IDLE + 2     # the previous poller: every 50 ms


def test_a_client_that_never_calls_wake_keeps_the_idle_poller_looking_as_often_as_before():
    """Communication pollers add work without calling wake(): their collectives go to the step that
    drains them, so the idle poller must still look every 50 ms while one is registered."""
    poller = Poller(alive=lambda: True)
    timer = StepTimer(SimulatedCuda(), poller=poller)
    try:
        assert poller.idle_wait() == Poller.IDLE == 0.25
        comm_like = lambda: False   # noqa: E731
        poller.add(comm_like)
        assert poller.idle_wait() == Poller.IDLE_POLLING == 0.05
        assert timer.poll() is False
    finally:
        poller.stop()


def test_only_one_step_per_timing_period_records_events_and_it_carries_device_time_and_lead():
    """The sampled subset: steps back to back within one TIME_EVERY record no event after the first, so a
    5 ms step pays for the four records once in twenty steps."""
    cuda = SimulatedCuda()
    timer = StepTimer(cuda)
    for step in range(3):                  # back to back: well within one TIME_EVERY
        timer.begin()
        cuda.run(0.003)
        timer.forward_end()
        timer.backward_end()
        timer.end(step)
    cuda.synchronize()
    assert timer.poll() is False
    assert cuda.calls.count("record") == 4 and cuda.events_created == 4
    results = list(timer.results)
    assert [r["gpu_step"] for r in results] == [0]
    assert results[0]["gpu_time"] == pytest.approx(0.003, abs=1e-3) and results[0]["lead"] >= 0


def test_the_step_timer_asks_for_its_first_look_at_half_the_previous_lead():
    cuda = SimulatedCuda()
    timer = StepTimer(cuda)
    timer.last_lead = 0.080                 # what the previous timed step read
    cuda.run(0.2)
    timer.begin()
    timer.end(0)
    assert timer.poll() == pytest.approx(StepTimer.FIRST_LOOK * 0.080, abs=0.01)


# -- module profile events come from a pool ------------------------------------------------------

def _profile(mon, model, opt, request_id: int) -> dict:
    got: list[dict] = []
    emit = mon.emit
    mon.emit = lambda rec: got.append(rec) if rec.get("k") == "profile" else emit(rec)
    try:
        assert mon.handle_request({"k": "request", "t": 0.0, "id": request_id, "op": "profile", "steps": 2,
                                   "depth": 1}) is None
        deadline = time.monotonic() + 20
        while not got or mon.attached.profiler.state != "idle":
            assert time.monotonic() < deadline, "no profile record"
            with mon.step():
                model(torch.ones(4)).sum().backward()
                opt.step()
    finally:
        mon.emit = emit
    return got[0]


def test_a_second_profile_reuses_the_first_ones_cuda_events(simulated_cuda):
    device = simulated_cuda()
    mon = probe.start(job="profile-pool", serve=False)
    try:
        model = nn.Sequential(SimulatedKernel(device, 0.002), SimulatedKernel(device, 0.001))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model, opt)
        mon.attached.watcher.device_type = "cuda"        # the model stands for a CUDA one
        first = _profile(mon, model, opt, 1)
        created = device.events_created
        pool = mon.attached.profiler.event_pool
        assert len({id(e) for e in pool.free}) == len(pool.free) > 0    # each event given back once
        second = _profile(mon, model, opt, 2)
    finally:
        mon.close()
    assert first["timer"] == second["timer"] == "cuda_events"
    assert device.events_created == created               # the second profile made no new event
    assert {m["name"]: m["fwd_s"] for m in second["modules"]}["0"] == pytest.approx(0.002, abs=0.004)


def test_the_event_pool_keeps_a_bounded_number_of_free_events():
    cuda = SimulatedCuda()
    pool = EventPool(cuda, keep=3)
    events = [pool.take() for _ in range(5)]
    assert cuda.events_created == 5
    pool.give(events)
    assert len(pool.free) == 3
    assert pool.take() in events and cuda.events_created == 5


# -- tokens given as a tensor --------------------------------------------------------------------

def test_cuda_tokens_are_not_read_on_the_training_thread_and_reach_the_record(simulated_cuda, tmp_path):
    cuda = simulated_cuda()
    mon = probe.start(job="device-tokens", record=tmp_path, serve=False)
    try:
        cuda.run(0.5)                                   # the device is 500 ms behind the host
        queued_until = cuda.free_at
        tokens = SimulatedDeviceTensor(cuda, 4096.0)
        with mon.step(tokens=tokens):
            pass
        assert "sync" not in cuda.calls and tokens.reads == []     # no host-device sync on this thread
        assert time.perf_counter() < queued_until                  # the step ended before the work queued before it
        with mon.step(tokens=torch.tensor(128)):                   # a CPU tensor: its number, at once
            pass
    finally:
        mon.close()
    steps = [r for r in read_recording(mon.record_path).records if r["k"] == "step"]
    assert [s.get("tokens") for s in steps] == [4096.0, 128.0]
    assert tokens.reads == []                   # the sender read the pinned copy, not the tensor


def test_six_n_of_device_tokens_is_read_with_them_and_zero_tokens_give_no_flops():
    cuda = SimulatedCuda()
    host, event = cuda.copy_to_host(SimulatedDeviceTensor(cuda, 10.0))
    estimate = flops.six_n(1000, records.DeviceScalar(host, event))
    item = records.StepItem(0, 3, 1.0, 2.0, 0.0, {}, None, records.DeviceScalar(host, event), None,
                            {"flops": estimate, "flops_source": "6N"}, 0.0, None, None, None)
    rec = records.step_record(item, 0.0)
    assert rec["tokens"] == 10.0 and rec["flops"] == 60_000.0 and rec["flops_source"] == "6N"
    zero_host, zero_event = cuda.copy_to_host(SimulatedDeviceTensor(cuda, 0.0))
    item = records.StepItem(0, 4, 1.0, 2.0, 0.0, {}, None, records.DeviceScalar(zero_host, zero_event), None,
                            {"flops": flops.six_n(1000, records.DeviceScalar(zero_host, zero_event)),
                             "flops_source": "6N"}, 0.0, None, None, None)
    rec = records.step_record(item, 0.0)
    assert rec["tokens"] == 0.0 and "flops" not in rec and "flops_source" not in rec


class _NeverDone:
    """The event of a copy queued on a hung device."""

    def __init__(self) -> None:
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return False


def test_a_hung_device_leaves_tokens_unknown_and_does_not_hold_the_sender(monkeypatch):
    monkeypatch.setattr(records, "DEVICE_WAIT", 0.05)
    errors: list[str] = []
    reads = records.DeviceReads(lambda where, exc: errors.append(where))
    first, second = _NeverDone(), _NeverDone()
    assert reads.read(records.DeviceScalar(1.0, first)) is None
    assert reads.read(records.DeviceScalar(2.0, second)) is None
    assert errors == ["device step value", "device step value"]
    assert first.queries > 1 and second.queries == 1      # the second read did not wait again
    done = SimulatedCuda()
    host, event = done.copy_to_host(SimulatedDeviceTensor(done, 7.0))
    assert reads.read(records.DeviceScalar(host, event)) == 7.0 and not reads.hung


def test_the_training_thread_is_not_the_one_that_reads_a_non_cuda_device_tensor(tmp_path):
    """A device tensor the CUDA backend cannot copy is handed to the sender thread as it is."""

    class OtherDevice:
        device = type("device", (), {"type": "xla"})()
        reads: list[int] = []

        def __float__(self) -> float:
            self.reads.append(threading.get_ident())
            return 33.0

    tokens = OtherDevice()
    mon = probe.start(job="xla-tokens", record=tmp_path, serve=False)
    try:
        with mon.step(tokens=tokens):
            pass
    finally:
        mon.close()
    steps = [r for r in read_recording(mon.record_path).records if r["k"] == "step"]
    assert steps[0]["tokens"] == 33.0
    assert tokens.reads and threading.get_ident() not in tokens.reads
