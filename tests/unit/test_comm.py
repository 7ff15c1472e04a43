"""Communication accounting (probe.comm): pure bookkeeping, and the NCCL-side paths against
the SIMULATED CUDA backend and stand-in Work objects (no GPU, no NCCL here)."""

from __future__ import annotations

import pytest

from probe import comm
from probe.comm import CollectiveCall, CommState, CommTracker, EventPairPoller, WorkPoller
from probe.wire import busbw_factor as bus_factor


def _host(op: str, launch: float, done: float, nbytes: int = 100, n: int = 2, **kw) -> CollectiveCall:
    """A host-timed collective (gloo): launched and seen complete at these perf_counter times."""
    return CollectiveCall(op, 1, nbytes, n, done - launch, 0.0, launch=launch, done=done, **kw)


def test_queued_host_collectives_are_charged_once():
    tracker = CommTracker()
    for end in (1.0, 2.0, 3.0):                     # launched together, served one after another
        tracker.add(_host("all_reduce", 0.0, end))
    summary = tracker.drain()
    assert summary["seconds"] == pytest.approx(3.0)   # busy time, not 1 + 2 + 3
    assert summary["ops"] == 3 and summary["bytes"] == 300
    count, nbytes, seconds, _, _ = tracker.totals["all_reduce"]
    assert (count, nbytes, seconds) == (3, 300, pytest.approx(3.0))
    assert tracker.drain() is None


def test_ddp_pass_exposed_is_the_tail_after_the_last_bucket():
    tracker = CommTracker()
    tracker.add(_host("all_reduce", 0.0, 1.2, pass_id=0))
    tracker.add(_host("all_reduce", 1.0, 1.5, pass_id=0, last=True))
    summary = tracker.drain()
    assert summary["exposed"] == pytest.approx(0.5) and summary["estimated"] is False
    assert summary["seconds"] == pytest.approx(1.5)


def test_ddp_pass_split_over_two_drains():
    tracker = CommTracker()
    tracker.add(_host("all_reduce", 0.0, 1.0, pass_id=3))
    assert tracker.drain()["exposed"] is None            # the pass is not over yet
    tracker.add(_host("all_reduce", 0.9, 1.4, pass_id=3, last=True))
    summary = tracker.drain()
    # the tail is 0.9-1.4, but 0.9-1.0 was already charged to the previous step's seconds:
    # a step's exposed time never exceeds its communication time
    assert summary["seconds"] == pytest.approx(0.4) and summary["exposed"] == pytest.approx(0.4)


def test_bus_bandwidth_uses_nccl_tests_factors():
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 4) == 1.0 and bus_factor("barrier", 4) is None
    tracker = CommTracker()
    tracker.add(CollectiveCall("all_reduce", 1, 100_000_000, 4, 1.0, 1.0))
    tracker.drain()
    tracker.add(CollectiveCall("all_reduce", 1, 100_000_000, 2, 1.0, 1.0))     # a 2-rank subgroup: factor 1
    tracker.drain()
    (op,) = tracker.record()["ops"]
    # bus bytes keep each call's own group factor, so a viewer's window busbw stays right
    assert op["busbytes"] == pytest.approx(150_000_000 + 100_000_000)
    assert op["busbw"] == pytest.approx(op["busbytes"] / 2.0)


def test_untimed_collectives_flag_their_exposed_part_as_unknown():
    tracker = CommTracker()
    tracker.add(CollectiveCall("all_gather", 1, 64, 8, None, None))
    summary = tracker.drain()
    assert summary["seconds"] is None and summary["exposed"] is None and summary["estimated"] is True
    (op,) = tracker.record()["ops"]
    assert op["seconds"] is None and op["busbw"] is None


class _Work:
    """Stand-in for a ProcessGroupNCCL Work: completes after ``polls`` checks."""

    def __init__(self, polls: int, duration_ms: float | None) -> None:
        self.polls = polls
        self.duration_ms = duration_ms

    def is_completed(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def _get_duration(self) -> float:
        if self.duration_ms is None:
            raise RuntimeError("getDuration only works if timing was enabled")
        return self.duration_ms


def test_nccl_async_durations_are_read_only_after_completion():
    tracker = CommTracker()
    poller = WorkPoller(tracker)
    poller.add(_Work(2, 12.5), CollectiveCall("reduce_scatter", 1, 1000, 8, None, None))
    assert poller() is True and poller() is True and not tracker.done     # not complete: not read
    assert poller() is False
    summary = tracker.drain()
    assert summary["seconds"] == pytest.approx(0.0125)
    assert summary["exposed"] is None and summary["estimated"] is True


def test_nccl_without_timing_still_counts_and_stops_asking():
    tracker = CommTracker()
    poller = WorkPoller(tracker)
    poller.add(_Work(0, None), CollectiveCall("all_reduce", 1, 10, 2, None, None))
    poller()
    assert poller.broken
    poller.add(_Work(5, 1.0), CollectiveCall("all_reduce", 1, 10, 2, None, None))   # recorded at once, untimed
    summary = tracker.drain()
    assert summary["ops"] == 2 and summary["seconds"] is None


def test_sync_cuda_collective_is_bracketed_by_reused_events(simulated_cuda):
    cuda = simulated_cuda()

    class _Probe:
        closed = False

        def event(self, *a, **k):
            pass

    state = CommState(_Probe())
    state.event_backend = cuda
    state._event_poller = EventPairPoller(state.tracker)

    def collective(x):
        cuda.run(0.004)              # the collective runs on the current stream
        return x

    for _ in range(3):
        item = CollectiveCall("all_reduce", 1, 8, 2, None, None)
        assert state._sync_cuda(collective, ("result",), {}, item, 0) == "result"
        cuda.synchronize()           # the test waits for the stream; the poller itself never does
        state._event_poller()
    summary = state.tracker.drain()
    # each pair brackets 4 ms of kernels plus the microseconds the host took to launch them
    assert summary["ops"] == 3 and summary["seconds"] == pytest.approx(0.012, abs=1e-3)
    assert summary["exposed"] == pytest.approx(0.012, abs=1e-3) and summary["estimated"] is False
    assert cuda.events_created == 2                 # one pair, reused


def test_install_is_idempotent_and_uninstall_restores():
    import torch.distributed as dist

    class _Probe:
        closed = False

        def event(self, *a, **k):
            pass

    probe = _Probe()
    comm.uninstall()                 # start from torch's own functions whatever ran before
    before = dist.all_reduce
    try:
        state = comm.install(probe)
        assert comm.install(probe) is state
        assert dist.all_reduce is not before and dist.all_reduce.__wrapped__ is before
        assert dist.distributed_c10d.all_reduce is dist.all_reduce
    finally:
        comm.uninstall()
    assert dist.all_reduce is before and dist.distributed_c10d.all_reduce is before
