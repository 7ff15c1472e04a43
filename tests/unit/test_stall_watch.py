"""The probe's stall watch: when no progress is a stall, what a stall record holds, and
the collective ledger and flight-recorder reading it draws on. Driven with an explicit clock."""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path

import pytest

from probe import flight as F, stall as S
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


# Flight-recorder dumps: the two gloo ones are ``_dump_fr_trace_json(True, True)`` as torch 2.13
# (CPU) wrote them in a 2-rank gloo job (rank 0 waiting in all_reduce #4 of the world group, rank 1
# stopped after #3; group 1 is a ``new_group([0, 1])``). gloo records no start event, so torch
# writes "scheduled" for every entry, retired ones included.
DUMPS = json.loads((Path(__file__).parent / "flight_dumps.json").read_text())
WAITING, BEHIND = DUMPS["gloo_rank0_waits_in_world_4"], DUMPS["gloo_rank1_stopped_after_world_3"]


def nccl_dump(started: bool) -> dict:
    """The same job on NCCL, as ProcessGroupNCCL's recorder writes it (no GPU here to capture one:
    both recorders serialize with the same ``FlightRecorder::dump_json``; NCCL's sets
    ``comm_lib_version`` and ``nccl_comm_state``, names ops ``nccl:``, and with start events
    (``TORCH_NCCL_ENABLE_TIMING=1``) marks a started entry ``started`` with the time it saw it)."""
    dump = copy.deepcopy(WAITING)
    dump.update(comm_lib_version="2.27.5", nccl_comm_state={})
    for entry in dump["entries"]:
        entry["profiling_name"] = entry["profiling_name"].replace("gloo:", "nccl:")
        if entry["retired"]:
            entry.update(state="completed", time_discovered_started_ns=entry["time_created_ns"] + 10 if started else 0,
                         time_discovered_completed_ns=entry["time_created_ns"] + 20)
        elif started:
            entry.update(state="started", time_discovered_started_ns=entry["time_created_ns"] + 10)
    return dump


def test_a_real_gloo_dump_gives_per_group_progress_and_the_call_enqueued_not_completed():
    flight = F.parse_flight(WAITING, source="generic")
    assert flight["groups"] == {"world": {"enqueued": 4, "started": -1, "completed": 3, "backend": "gloo"},
                                "1": {"enqueued": 1, "started": -1, "completed": 1, "backend": "gloo"}}
    # torch says "scheduled"; gloo never records a start, so the call is only known not completed
    assert flight["entries"] == [{"op": "all_reduce", "group": "world", "seq": 4, "state": "enqueued",
                                  "backend": "gloo"}]
    assert F.from_flight(flight) == {"seq": {"world": 4, "1": 1},
                                     "inflight": [{"op": "all_reduce", "group": "world", "seq": 4}]}
    behind = F.parse_flight(BEHIND, source="generic")
    assert behind["groups"]["world"]["enqueued"] == 3 and [e["group"] for e in behind["entries"]] == ["1"]
    assert F.parse_flight({}, source="generic") == {"source": "generic", "groups": {}, "entries": []}


def test_nccl_only_states_follow_its_start_events(monkeypatch):
    monkeypatch.delenv("TORCH_NCCL_ENABLE_TIMING", raising=False)
    unseen = F.parse_flight(nccl_dump(started=False), source="nccl")
    assert unseen["entries"] == [{"op": "all_reduce", "group": "world", "seq": 4, "state": "enqueued",
                                  "backend": "nccl"}]
    started = F.parse_flight(nccl_dump(started=True), source="nccl")
    assert [e["state"] for e in started["entries"]] == ["started"]
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")            # starts are recorded: not started yet
    assert [e["state"] for e in F.parse_flight(nccl_dump(started=False), source="nccl")["entries"]] == ["scheduled"]
    assert started["groups"]["world"]["backend"] == "nccl"


def test_both_recorders_merge_with_each_entry_tagged_and_a_group_both_report_kept_once_per_backend():
    nccl_world, gloo_only = nccl_dump(started=True), copy.deepcopy(WAITING)     # world on NCCL, group 1 on gloo
    nccl_world["pg_status"] = {"0": nccl_world["pg_status"]["0"]}
    nccl_world["entries"] = [e for e in nccl_world["entries"] if e["pg_id"] == 0]
    gloo_only["pg_status"] = {"1": gloo_only["pg_status"]["1"]}
    gloo_only["entries"] = [dict(e, retired=False) for e in gloo_only["entries"] if e["pg_id"] == 1]
    flight = F.merge([F.parse_flight(nccl_world, source="nccl"), F.parse_flight(gloo_only, source="generic")])
    assert (flight["source"], flight["sources"]) == ("nccl+generic", ["nccl", "generic"])
    assert [(e["group"], e["seq"], e["state"], e["backend"]) for e in flight["entries"]] == [
        ("world", 4, "started", "nccl"), ("1", 1, "enqueued", "gloo")]
    assert {g: s["backend"] for g, s in flight["groups"].items()} == {"world": "nccl", "1": "gloo"}
    # the default cpu:gloo,cuda:nccl world: both recorders number its calls, each its own. Before, the
    # merge dropped the group (its number ambiguous) and the stall record lost both sequences
    both = F.merge([F.parse_flight(nccl_world, source="nccl"), F.parse_flight(WAITING, source="generic")])
    assert both["groups"] == {"world:nccl": {"enqueued": 4, "started": -1, "completed": 3, "backend": "nccl"},
                              "world:gloo": {"enqueued": 4, "started": -1, "completed": 3, "backend": "gloo"},
                              "1": {"enqueued": 1, "started": -1, "completed": 1, "backend": "gloo"}}
    assert [(e["group"], e["seq"], e["backend"]) for e in both["entries"]] == [
        ("world:nccl", 4, "nccl"), ("world:gloo", 4, "gloo")] and "note" not in both
    assert F.from_flight(both)["seq"] == {"world:nccl": 4, "world:gloo": 4, "1": 1}


def test_an_empty_recorder_says_why(monkeypatch):
    for var in F._BUFFER_VARS:
        monkeypatch.delenv(var, raising=False)
    assert F.merge([F.parse_flight({}, source="generic")])["note"] == "no collective recorded yet"
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert F.merge([F.parse_flight({}, source="generic")])["note"].startswith(
        "TORCH_FR_BUFFER_SIZE=0 at process start turned the flight recorder off")
    assert "note" not in F.merge([F.parse_flight(WAITING, source="generic")])


def test_outside_a_process_group_there_is_no_recorder_to_read():
    import torch.distributed as dist
    assert not dist.is_initialized() and F.flight_recorder() is None


@pytest.fixture
def world_of_one():
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_in_a_real_gloo_group_the_generic_recorder_is_read_and_nccls_too_where_torch_has_it(world_of_one,
                                                                                            monkeypatch):
    import torch
    from torch._C import _distributed_c10d as c10d
    for _ in range(2):
        world_of_one.all_reduce(torch.ones(4))
    flight = F.flight_recorder()["flight"]
    assert flight["sources"] == (["nccl", "generic"] if hasattr(c10d, "_dump_nccl_trace_json") else ["generic"])
    # this test run may have made process groups before: the recorder names this one "world" all the same
    name, world = "world", flight["groups"]["world"]
    assert world["enqueued"] >= 2 and world["backend"] == "gloo"
    assert all((e["op"], e["backend"]) == ("all_reduce", "gloo") for e in flight["entries"])
    # gloo retires an entry and counts it completed on its own thread, after the call returned: wait for both
    deadline = time.monotonic() + 10
    while (flight["entries"] or flight["groups"][name]["completed"] != world["enqueued"]) \
            and time.monotonic() < deadline:
        flight = F.flight_recorder()["flight"]
    assert flight["entries"] == [] and flight["groups"][name]["completed"] == world["enqueued"]
    # a CUDA build adds ProcessGroupNCCL's recorder (this CPU build has none: stand one in)
    monkeypatch.setattr(c10d, "_dump_nccl_trace_json", lambda *a: json.dumps(nccl_dump(True)).encode(), raising=False)
    both = F.flight_recorder()["flight"]
    assert both["sources"] == ["nccl", "generic"] and both["source"] == "nccl+generic"
    assert [(e["backend"], e["state"]) for e in both["entries"]] == [("nccl", "started")]


def test_the_recorder_completes_the_ledger_only_where_their_numbers_agree():
    flight = F.merge([F.parse_flight(WAITING, source="generic")])
    unknown = {"flight": flight, "seq": {}, "inflight": []}             # no ledger (calls from C++)
    F.fill_from_flight(unknown)
    assert unknown["seq"] == {"world": 4, "1": 1} and [c["seq"] for c in unknown["inflight"]] == [4]
    returned = {"flight": flight, "seq": {"world": 4}, "inflight": []}   # gloo: a call that returned is done
    F.fill_from_flight(returned)
    assert returned["inflight"] == [] and returned["seq"] == {"world": 4, "1": 1}
    on_nccl = F.merge([F.parse_flight(nccl_dump(started=True), source="nccl")])
    enqueued = {"flight": on_nccl, "seq": {"world": 4, "1": 1}, "inflight": []}   # NCCL: returned once enqueued
    F.fill_from_flight(enqueued)
    assert [(c["group"], c["seq"]) for c in enqueued["inflight"]] == [("world", 4)]
    counted = {"flight": on_nccl, "seq": {"world": 6}, "inflight": []}    # torch counted other calls too
    F.fill_from_flight(counted)
    assert counted["inflight"] == [] and counted["seq"]["world"] == 6
    own = [{"op": "barrier", "group": "world", "seq": 4}]
    waiting = {"flight": on_nccl, "seq": {"world": 4}, "inflight": list(own)}
    F.fill_from_flight(waiting)
    assert waiting["inflight"] == own


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
