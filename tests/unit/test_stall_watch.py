"""The probe's stall watch (issue 14): when no progress is a stall, what a stall record holds, and
the collective ledger and flight-recorder reading it draws on. Driven with an explicit clock."""

from __future__ import annotations

import threading
import time

import pytest

from probe import stall as S
from probe.comm.tracker import Ledger


class FakeProbe:
    """The part of ``Probe`` the watch reads, with progress set by the test."""

    def __init__(self) -> None:
        self.steps, self.last, self.in_step = 0, None, False
        self.thread = threading.get_ident()
        self.loader_iterators: list = []
        self.device = {"type": "cpu"}
        self.local_rank = 0
        self.errors: list = []

    def progress(self):
        return self.steps, self.last, self.in_step, self.thread, None

    def report_error(self, where, exc):
        self.errors.append((where, exc))


def run_steps(probe: FakeProbe, watch: S.StallWatch, n: int, dur: float, t: float) -> float:
    """``n`` steps of ``dur`` seconds, the watch looking after each; returns the time after them."""
    for _ in range(n):
        t += dur
        probe.steps += 1
        probe.last = t
        assert watch.tick(t) is None
    return t


def test_threshold_is_the_warm_up_until_three_steps_are_timed_then_ten_medians_with_a_floor():
    policy = S.StallPolicy()
    assert policy.threshold() == S.WARMUP_S
    for i, end in enumerate((1.0, 3.0, 5.0, 7.0)):
        policy.observe(i + 1, end)
    assert policy.threshold() == pytest.approx(20.0)  # 10 x the 2 s median, over the 15 s floor
    policy = S.StallPolicy()
    for i in range(5):
        policy.observe(i + 1, 0.5 * (i + 1))
    assert policy.threshold() == S.FLOOR_S            # 10 x 0.5 s = 5 s, under the floor
    slow = S.StallPolicy()
    for i in range(5):
        slow.observe(i + 1, 4.0 * (i + 1))
    assert slow.threshold() == pytest.approx(40.0)    # 10 x 4 s
    assert S.StallPolicy(fixed=2.5).threshold() == 2.5
    fast = S.StallPolicy()            # 50 quick steps between two looks: one sample, but 50 steps timed
    fast.observe(10, 1.0)
    fast.observe(60, 1.5)
    assert fast.threshold() == S.FLOOR_S
    burst = S.StallPolicy()           # every step so far between two looks: the mean since step 0's end
    burst.observe(49, 10.0, first_end=9.0)
    assert burst.threshold() == S.FLOOR_S
    slow_burst = S.StallPolicy()
    slow_burst.observe(5, 10.0, first_end=2.0)     # 2 s per step over four steps
    assert slow_burst.threshold() == pytest.approx(20.0)
    assert S.StallPolicy().threshold() == S.WARMUP_S
    few = S.StallPolicy()             # only two steps ended: still warming up (compile, first loads)
    few.observe(2, 10.0, first_end=9.0)
    assert few.threshold() == S.WARMUP_S


def test_several_steps_between_looks_count_as_their_mean_and_no_advance_adds_nothing():
    policy = S.StallPolicy()
    policy.observe(10, 1.0)
    policy.observe(20, 2.0)       # ten steps in one second
    policy.observe(20, 2.0)
    policy.observe(20, 2.5)       # same count, later time: not a step
    assert list(policy.per_step) == [pytest.approx(0.1)]


def test_stall_threshold_env_is_read_in_seconds_and_ignored_when_not_positive(monkeypatch):
    monkeypatch.setenv("PERFMON_STALL_S", "7.5")
    assert S.fixed_threshold() == 7.5
    for bad in ("0", "-3", "soon", ""):
        monkeypatch.setenv("PERFMON_STALL_S", bad)
        assert S.fixed_threshold() is None


def test_a_job_three_times_slower_is_not_stalled_but_a_stop_is_reported_repeated_and_resumed():
    probe, out = FakeProbe(), []
    watch = S.StallWatch(probe, out.append, S.StallPolicy())
    t = run_steps(probe, watch, 20, 0.5, 0.0)
    t = run_steps(probe, watch, 20, 1.5, t)          # 3x slower: never over 10 x median nor the floor
    assert out == []
    threshold = watch.policy.threshold()
    assert watch.tick(t + threshold - 0.01) is None
    first = watch.tick(t + threshold + 0.01)
    assert first["k"] == "stall" and first["n"] == 1 and first["step"] == 39 and first["where"] == "between"
    assert first["seconds"] == pytest.approx(threshold + 0.01) and first["threshold"] == threshold
    assert any("test_stall_watch.py" in f and "in test_a_job_three_times" in f for f in first["stack"])
    assert watch.tick(t + threshold + 1.0) is None                     # repeats only every REPEAT_S
    again = watch.tick(t + threshold + 0.01 + S.REPEAT_S)
    assert again["n"] == 2
    probe.steps += 1
    probe.last = t + threshold + 5.0
    resumed = watch.tick(t + threshold + 5.1)
    assert resumed["k"] == "resumed" and resumed["step"] == 40
    assert resumed["seconds"] == pytest.approx(threshold + 5.0)
    assert watch.tick(t + threshold + 5.2) is None and len(out) == 3


def test_nothing_is_watched_before_the_first_step_and_inside_a_step_says_so():
    probe, out = FakeProbe(), []
    watch = S.StallWatch(probe, out.append, S.StallPolicy(fixed=1.0))
    assert watch.tick(1e6) is None                     # no step begun: startup is not a stall
    probe.last, probe.in_step = 10.0, True
    rec = watch.tick(12.0)
    assert rec["where"] == "step" and rec["step"] == -1 and rec["seconds"] == pytest.approx(2.0)


def test_a_part_that_fails_is_named_missing_and_the_record_still_goes(monkeypatch):
    probe, out = FakeProbe(), []
    watch = S.StallWatch(probe, out.append, S.StallPolicy(fixed=1.0))
    monkeypatch.setattr(S, "flight_recorder", lambda: 1 / 0)
    probe.steps, probe.last = 3, 0.0
    rec = watch.tick(5.0)
    assert rec["k"] == "stall" and rec["missing"] == ["flight"]


class FakeIterator:
    """The private state of torch's ``_MultiProcessingDataLoaderIter`` the watch reads."""

    def __init__(self, workers, task_info, rcvd_idx):
        self._workers, self._task_info, self._rcvd_idx = workers, task_info, rcvd_idx
        self._shutdown = False


class Proc:
    def __init__(self, pid):
        self.pid = pid


def test_the_loader_part_names_the_worker_whose_batch_is_awaited_and_reads_its_cpu(monkeypatch):
    import os
    probe, out = FakeProbe(), []
    me = os.getpid()
    it = FakeIterator([Proc(2 ** 22 + 7), Proc(me)], {5: (1,), 6: (0, "data")}, 5)
    probe.loader_iterators = [lambda: it]
    watch = S.StallWatch(probe, out.append, S.StallPolicy(fixed=1.0))
    wall_before_first, cpu_before_first = time.monotonic(), time.process_time()
    loader = watch._loader(True)["loader"]
    assert loader["waiting"] is True and loader["awaited_pid"] == me
    assert loader["workers"][0] == {"pid": 2 ** 22 + 7, "alive": False, "cpu": None}
    assert loader["workers"][1]["alive"] is True and loader["workers"][1]["cpu"] is None   # first look
    # second look: this process's CPU share over the time between the looks. Planted: at least 0.2 s
    # of CPU burned between them. psutil reads user and system time in whole 10 ms ticks: 0.04 s slack
    cpu_before, wall_after_first = time.process_time(), time.monotonic()
    while time.process_time() - cpu_before < 0.2:
        pass
    cpu_burned, wall_before_second = time.process_time() - cpu_before, time.monotonic()
    share = watch._loader(True)["loader"]["workers"][1]["cpu"]
    wall_max = time.monotonic() - wall_before_first
    cpu_max = time.process_time() - cpu_before_first
    assert (cpu_burned - 0.04) / wall_max <= share <= (cpu_max + 0.04) / (wall_before_second - wall_after_first)
    it._rcvd_idx = 6                                                                    # its data arrived
    assert "awaited_pid" not in watch._loader(False)["loader"]
    it._shutdown = True
    assert watch._loader(False) is None


def test_ledger_numbers_calls_per_group_and_keeps_only_the_unreturned_bounded():
    ledger = Ledger()
    a = ledger.begin("all_reduce", "world", 0, 2, 100)
    b = ledger.begin("all_gather", "3", 1, 4, 50)
    c = ledger.begin("all_reduce", "world", 0, 2, 100)
    ledger.end(a)
    inflight, issued = ledger.snapshot()
    assert issued == {"world": 2, "3": 1}
    assert [(x["op"], x["group"], x["seq"]) for x in inflight] == [("all_gather", "3", 1), ("all_reduce", "world", 2)]
    ledger.end(b), ledger.end(c), ledger.end(c)
    assert ledger.snapshot()[0] == []
    for _ in range(Ledger.MAX_OPEN + 10):
        ledger.begin("barrier", "world", 0, 2, 0)
    assert len(ledger.open) == Ledger.MAX_OPEN and ledger.issued["world"] == 2 + Ledger.MAX_OPEN + 10


# SIMULATED flight-recorder dump: the keys of torch's ``_dump_fr_trace_json`` (torch 2.13 wrote
# the same for a gloo job here), with one all_reduce enqueued and not completed on the world group.
SIMULATED_DUMP = {
    "pg_status": {"0": {"last_enqueued_collective": "20", "last_started_collective": "-1",
                        "last_completed_collective": "19"},
                  "1": {"last_enqueued_collective": "4", "last_started_collective": "4",
                        "last_completed_collective": "4"}},
    "entries": [{"collective_seq_id": 19, "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce",
                 "retired": True, "state": "completed"},
                {"collective_seq_id": 20, "process_group": ["0", "default_pg"], "profiling_name": "nccl:all_reduce",
                 "retired": False, "state": "scheduled"}],
}


def test_flight_dump_gives_per_group_progress_and_what_is_in_flight():
    flight = S.parse_flight(SIMULATED_DUMP, source="simulated")
    assert flight["groups"] == {"world": {"enqueued": 20, "started": -1, "completed": 19},
                                "1": {"enqueued": 4, "started": 4, "completed": 4}}
    assert flight["entries"] == [{"op": "all_reduce", "group": "world", "seq": 20, "state": "scheduled"}]
    assert S.from_flight(flight) == {"seq": {"world": 20, "1": 4},
                                     "inflight": [{"op": "all_reduce", "group": "world", "seq": 20}]}
    assert S.parse_flight({}, source="simulated") == {"source": "simulated", "groups": {}, "entries": []}


def test_thread_stack_is_innermost_last_and_bounded():
    def deep(n):
        return S.thread_stack(threading.get_ident()) if n == 0 else deep(n - 1)
    stack = deep(S.MAX_FRAMES + 10)
    assert len(stack) == S.MAX_FRAMES
    assert stack[-1].endswith("in thread_stack")          # asked from the thread itself: its own frame
    assert stack[-2].endswith("in deep") and "test_stall_watch.py:" in stack[-2]
    assert S.thread_stack(-1) == []


def test_the_first_stall_record_already_has_the_workers_cpu_looked_at_just_before():
    import os
    probe, out = FakeProbe(), []
    it = FakeIterator([Proc(os.getpid())], {3: (0,)}, 3)
    probe.loader_iterators = [lambda: it]
    probe.steps, probe.last = 2, 100.0
    watch = S.StallWatch(probe, out.append, S.StallPolicy(fixed=2.0))
    assert watch.tick(100.0 + 2.0 - S.PRIME_S - 0.1) is None and watch._worker_cpu == {}
    assert watch.tick(100.0 + 2.0 - S.PRIME_S + 0.1) is None and os.getpid() in watch._worker_cpu
    first = watch.tick(102.1)
    assert first["n"] == 1 and first["loader"]["workers"][0]["cpu"] is not None


def test_on_cuda_the_record_says_whether_the_device_still_has_queued_work(monkeypatch):
    """SIMULATED CUDA (tests/sim): a stream with kernels queued past now is pending, a drained one not."""
    import sys
    from probe.gpu import cuda
    from tests.sim.simulated_cuda import SimulatedCuda
    sim = SimulatedCuda()
    monkeypatch.setattr(cuda, "backend", sim)
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    probe = FakeProbe()
    probe.device = {"type": "cuda"}
    watch = S.StallWatch(probe, lambda r: None, S.StallPolicy(fixed=1.0))
    sim.run(30.0)                                   # a kernel that has not finished
    assert watch._device() == {"device": {"pending": True}} and "pending" in sim.calls
    sim.free_at = 0.0                               # the stream drained
    assert watch._device() == {"device": {"pending": False}}
    probe.device = {"type": "cpu"}
    assert watch._device() is None


def test_the_record_says_whether_the_stack_moved_at_any_look_since_the_previous_report(monkeypatch):
    probe, out = FakeProbe(), []
    seen = iter([["a.py:1 in f"]] * 4 + [["a.py:1 in f"], ["a.py:2 in g"], ["a.py:1 in f"], ["a.py:1 in f"]])
    monkeypatch.setattr(S, "thread_stack", lambda thread_id: next(seen))
    probe.steps, probe.last = 3, 100.0
    watch = S.StallWatch(probe, out.append, S.StallPolicy(fixed=2.0))
    assert watch.tick(100.0 + 2.0 - S.PRIME_S - 0.1) is None      # not near the threshold: no look
    watch.tick(101.1), watch.tick(101.6)                          # looks before the threshold: f, f
    first = watch.tick(102.1)                                     # look f, and the record's own stack f
    assert first["moving"] is False                               # one stack at every look: hung
    assert watch.tick(102.6) is None and watch.tick(103.1) is None   # looks f, g
    again = watch.tick(104.2)                                     # look f: g came and went in between
    assert again["moving"] is True
    probe.steps, probe.last = 4, 104.5                            # progress: the looks start over
    assert watch.tick(104.6)["k"] == "resumed" and watch._looks == 0
