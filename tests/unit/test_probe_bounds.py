"""Every container the probe keeps is bounded and released at close(); close() returns within
2 s in every state; counted internal failures become rate-limited warning events."""

from __future__ import annotations

import socket
import threading
import time

import torch

import probe
from probe import comm, core, flops, health
from probe.gpu import cuda as gpu_cuda
from probe.recording import read_recording


class _Iter:
    """A weakly referable iterator (DataLoader iterators are)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n <= 0:
            raise StopIteration
        self.n -= 1
        return self.n


def test_loader_iterators_are_bounded_weak_and_released_at_close():
    mon = probe.start(job="bounds", serve=False)
    try:
        kept = [_Iter(2) for _ in range(100)]
        for it in kept:
            list(mon.loader(it))
        for _ in range(100):
            list(mon.loader([1, 2, 3]))        # list iterators: not weakly referable, not kept
        assert len(mon.loader_iterators) == core.LOADER_ITERATORS
        assert all(ref() is not None for ref in mon.loader_iterators)
        del kept, it
        assert all(ref() is None for ref in mon.loader_iterators)   # weak: nothing kept alive
    finally:
        mon.close()
    assert len(mon.loader_iterators) == 0


def test_close_returns_within_2s_during_a_flop_count(monkeypatch):
    started, release = threading.Event(), threading.Event()

    def slow_count(replica, margs, mkwargs, backward):
        started.set()
        release.wait(30)          # a count that takes far longer than close() may
        return 1, 3

    monkeypatch.setattr(flops, "count_meta", slow_count)
    mon = probe.start(job="flops-close", serve=False)
    model = torch.nn.Linear(4, 4)
    mon.watch(model=model)
    try:
        with mon.step():
            model(torch.randn(2, 4))
        assert started.wait(10), "the FLOP count never started"
        t0 = time.monotonic()
        mon.close()
        elapsed = time.monotonic() - t0
    finally:
        release.set()
    assert elapsed < core.CLOSE_SECONDS
    assert model._forward_hooks == {} and model._forward_pre_hooks == {}   # hooks removed at close


def test_close_returns_within_2s_with_a_stalled_viewer_and_a_full_buffer(perfmon_dir):
    mon = probe.start(job="stalled-close")
    viewer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    viewer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    viewer.connect(str(mon.socket_path))         # never reads
    try:
        for _ in range(core.QUEUE_ITEMS):
            with mon.step(samples=1):
                pass
        t0 = time.monotonic()
        mon.close()
        assert time.monotonic() - t0 < core.CLOSE_SECONDS
    finally:
        viewer.close()


def test_work_poller_takes_nothing_after_close():
    tracker = comm.CommTracker()
    poller = comm.WorkPoller(tracker)
    state = comm.CommState(probe=None)
    state._work_poller = poller
    item = comm.CollectiveCall("all_reduce", 1, 8, 2, None, None)
    poller.add(object(), item)
    assert len(poller.pending) == 1
    state.async_works[1] = (object(), item)
    state.close()
    assert not poller.pending and not state.async_works
    poller.add(object(), item)                   # a DDP hook still firing after close
    assert not poller.pending
    assert poller.pending.maxlen == comm.MAX_ASYNC


def test_async_works_are_released_when_they_complete_without_wait():
    """Gloo works nobody waits on used to stay referenced (up to 4,096)."""
    import torch.distributed as dist
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    mon = probe.start(job="async", serve=False)
    try:
        state = comm.install(mon)
        works = [dist.all_reduce(torch.ones(4), async_op=True) for _ in range(50)]
        deadline = time.monotonic() + 10
        while state.async_works and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not state.async_works
        works[-1].wait()
    finally:
        mon.close()
        comm.uninstall()
        dist.destroy_process_group()


def _warnings(path):
    return [r for r in read_recording(path).records if r["k"] == "event" and r.get("name") == "warning"]


def test_a_failing_step_hook_is_one_warning_per_interval_with_its_count(tmp_path):
    mon = probe.start(job="hook-errors", record=tmp_path, serve=False)

    def broken(extras, phases):
        raise ValueError("broken hook")
    mon.add_step_hooks(end=broken)
    for _ in range(500):
        with mon.step():
            pass
    mon.close()
    events = [e for e in _warnings(mon.record_path) if e.get("where") == "step hook"]
    # the first failure at once, the other 499 in one event at close (rate limit: one per 10 s)
    assert [e["count"] for e in events] == [1, 500]
    assert "broken hook" in events[0]["message"]


def test_failure_counters_kept_elsewhere_reach_the_stream(tmp_path):
    mon = probe.start(job="counters", record=tmp_path, serve=False)
    state = comm.install(mon)
    try:
        state.tracker.error()
        state.tracker.error()
        poller = gpu_cuda.poller_for(mon)

        def bad_client():
            raise RuntimeError("event query failed")
        poller.add(bad_client)
        deadline = time.monotonic() + 10
        while poller.dropped == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert poller.dropped == 1
    finally:
        mon.close()
        comm.uninstall()
    by_where = {e["where"]: e for e in _warnings(mon.record_path) if e.get("source") == "perfmon"}
    assert by_where["communication tracker"]["count"] == 2
    assert by_where["device poller (client dropped)"]["count"] == 1


def test_reporter_rate_limit():
    out = []
    rep = health.FailureReporter(out.append)
    for _ in range(5):
        rep.failed("x", ValueError())
    assert [e["count"] for e in out] == [1]
    rep.report("x", None, now=time.monotonic() + health.INTERVAL + 1)
    assert [e["count"] for e in out] == [1, 5]


def test_nvml_errors_become_a_warning(simulated_nvml, monkeypatch):
    """SIMULATED NVML: a device whose queries fail; the NVML wrapper counts, the health source reports."""
    from tests.sim.simulated_pynvml import SimulatedGpu

    module = simulated_nvml([SimulatedGpu()])
    out: list[dict] = []
    mon = probe.start(job="nvml-errors", serve=False, sample_hz=0.1)
    try:
        nvml = mon.attached.gpu.nvml
        before = nvml.errors
        monkeypatch.setattr(module, "nvmlDeviceGetUtilizationRates",
                            lambda handle: (_ for _ in ()).throw(module.NVMLError(999)), raising=False)
        nvml.read(mon.attached.gpu.devices[0])
        assert nvml.errors > before
        mon.failures.emit = out.append
        health.HealthSource(mon).read()
    finally:
        mon.close()
    # close's last sample reads the failing device again: its errors arrive in a later event
    assert {e["where"] for e in out} == {"NVML"} and out[-1]["count"] == nvml.errors


def test_a_viewer_queue_drops_whole_batches_and_a_dropped_drops_record_hands_its_count_on(monkeypatch):
    """Frames travel in batches; a batch dropped to fit the queue counts all its frames, and a
    ``drops`` record dropped in turn passes its count to the next one (no loss goes unannounced)."""
    from probe import server
    monkeypatch.setattr(server, "VIEWER_QUEUE_BYTES", 100)
    a, b = socket.socketpair()
    try:
        v = server.Viewer(a, tcp=False)
        v.enqueue(b"x" * 60, 6)
        v.enqueue(b"y" * 60, 6)                  # over the bound: x (6 frames) goes
        assert (v.dropped, list(v.out)) == (6, [b"y" * 60])
        v.enqueue(b"d", 1, announces=6)          # the sender's drops record for them
        v.dropped = 0
        v.enqueue(b"z" * 60, 6)                  # y goes; the drops record survives
        assert v.dropped == 6 and list(v.out) == [b"d", b"z" * 60]
        v.enqueue(b"e", 1, announces=6)
        v.dropped = 0
        v.enqueue(b"w" * 39, 3)                  # the first drops record goes: its 6 are owed again, plus itself
        assert v.dropped == 7 and list(v.out) == [b"z" * 60, b"e", b"w" * 39]
        assert v.dropped_total == 13 and v.out_bytes == 100
    finally:
        a.close()
        b.close()


def test_a_stalled_viewer_loses_its_oldest_steps_never_the_newest_whatever_is_in_flight():
    """Three ticks of 20,000 steps (~3 MB each) reach a viewer that has stopped reading: its queue
    drops the oldest data at the grain of a chunk, never the batch in flight, so once it reads again
    it gets the newest steps, all but two chunks' worth of its 4 MiB, and a drops count for every step missing."""
    import collections
    import selectors

    from probe import server, wire

    queue: collections.deque = collections.deque()
    sender = server.Sender(queue=queue, build=lambda item: item, hello={"k": "hello"}, listener=None)
    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        viewer = server.Viewer(ours, tcp=False)
        sender.viewers[ours.fileno()] = viewer
        sender.sel.register(ours, selectors.EVENT_READ, viewer)
        def step(n: int) -> dict:
            return {"k": "step", "t": 1e9 + n, "step": n, "dur": 0.01, "phases": {"forward": 0.004, "data": 0.001}}

        step_bytes = len(wire.encode(step(0)))
        for tick in range(3):
            queue.extend(step(n) for n in range(tick * 20_000, (tick + 1) * 20_000))
            sender._drain()
            sender._flush(viewer)          # the socket's buffer fills; what is left stays queued
        assert viewer.head_sent > 0 and viewer.out_bytes <= server.VIEWER_QUEUE_BYTES
        received = bytearray()
        theirs.setblocking(False)
        while True:                        # the viewer reads again, until all is read
            try:
                while chunk := theirs.recv(1 << 20):
                    received += chunk
            except BlockingIOError:
                if not viewer.out:
                    break
            sender._flush(viewer)
        records = list(wire.FrameDecoder().feed(bytes(received)))
        got = [r["step"] for r in records if r["k"] == "step"]
        dropped = sum(r["count"] for r in records if r["k"] == "drops")
        assert got == sorted(got) and got[-1] == 59_999
        newest = (server.VIEWER_QUEUE_BYTES - 2 * server.CHUNK_BYTES) // step_bytes   # less the chunk in flight
        assert got[-newest:] == list(range(60_000 - newest, 60_000))
        assert 60_000 - len(got) == dropped > 0
    finally:
        ours.close()
        theirs.close()


def test_chunks_keep_every_frame_in_order_within_the_bound():
    from probe import server

    frames = [bytes([n % 251]) * (1 + n * 997 % 5000) for n in range(400)] + [b"B" * (server.CHUNK_BYTES + 1)]
    batches = server.chunks(frames)
    assert b"".join(b for b, _ in batches) == b"".join(frames)
    assert sum(n for _, n in batches) == len(frames)
    assert all(len(b) <= server.CHUNK_BYTES for b, _ in batches[:-1]) and batches[-1] == (frames[-1], 1)
    assert server.chunks([]) == [] and server.chunks([b"x"]) == [(b"x", 1)]
