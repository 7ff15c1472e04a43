"""Typed readings (perfmon_analysis.readings): each wire key parsed once, unknown kept unknown, a
rank's own GPU chosen by its local rank, and each GPU listed once per host."""

from __future__ import annotations

from typing import Any

import pytest

from perfmon_analysis.readings import (
    GpuReading,
    SampleReading,
    gpu_reading,
    gpu_rows,
    host_reading,
    num,
    own_gpus,
    sample_reading,
    step_reading,
)
from perfmon_analysis.runmodel import RunModel
from probe import wire
from tests.helpers import records as R

FULL_GPU = {"index": 1, "name": "H100", "uuid": "GPU-5fd2", "util": 0.87, "sm_active": 0.5, "tensor_active": 0.25,
            "mem_used": 40e9, "mem_total": 80e9, "power_w": 512.5, "power_limit_w": 700.0, "sm_clock": 1980,
            "energy_mj": 12_345_678, "temp_c": 61, "throttle": ["sw_power_cap", 7, None, "hw_slowdown"]}


def test_every_gpu_field_is_read_under_its_own_name():
    g = gpu_reading(FULL_GPU)
    assert g == GpuReading(index=1, util=0.87, name="H100", uuid="GPU-5fd2", sm_active=0.5, tensor_active=0.25,
                           mem_used=40_000_000_000,
                           mem_total=80_000_000_000, power_w=512.5, power_limit_w=700.0, energy_mj=12_345_678.0,
                           sm_clock_mhz=1980.0,
                           temp_c=61.0, throttle=("sw_power_cap", "hw_slowdown"))


def test_gpu_values_unknown_stay_unknown_and_percent_becomes_a_fraction():
    g = gpu_reading({"index": 0, "util": 97, "sm_active": True, "tensor_active": "x", "throttle": "hot"})
    assert g.util == pytest.approx(0.97) and g.sm_active is None and g.tensor_active is None
    assert (g.mem_used, g.mem_total, g.power_w, g.power_limit_w, g.energy_mj, g.sm_clock_mhz, g.temp_c) == (None,) * 7
    assert g.throttle == ()
    assert gpu_reading({"util": 1.0}).util == 1.0 and gpu_reading({"util": 0}).util == 0.0
    assert gpu_reading({}).index is None and gpu_reading({"name": "", "uuid": 7}).uuid is None


def test_host_reading_and_its_unknowns():
    h = host_reading({"host": {"cpu": 1.5, "cpu_count": 8, "sys_cpu": 0.25, "rss": 123.0}})
    assert (h.cpu, h.cpu_count, h.sys_cpu, h.rss) == (1.5, 8, 0.25, 123)
    none = host_reading({"host": {"cpu_count": 0}})
    assert (none.cpu, none.cpu_count, none.sys_cpu, none.rss) == (None, None, None, None)
    assert host_reading({"host": "broken"}).cpu is None


def test_a_steps_bar_keeps_the_wire_order_and_reads_unknown_phases_as_zero():
    bar = step_reading({"step": 7, "dur": 0.5, "gap": 0.1, "phases": {"data": 0.1, "forward": None, "other": 0.3},
                        "sync_site": "train.py:9"}).bar()
    assert (bar.step, bar.dur, bar.gap, bar.sync_site) == (7, 0.5, 0.1, "train.py:9")
    assert bar.phases == (("data", 0.1), ("forward", 0.0), ("other", 0.3))
    assert bar.phase("other") == 0.3 and bar.phase("backward") is None
    empty = step_reading({"step": 0, "dur": 0.0, "phases": "bad", "sync_site": ""}).bar()
    assert (empty.step, empty.dur, empty.gap, empty.phases, empty.sync_site) == (0, 0.0, 0.0, (), None)


def test_a_step_without_its_number_or_duration_is_no_step():
    assert step_reading({"dur": 0.5}) is None
    assert step_reading({"step": True, "dur": 0.5}) is None
    assert step_reading({"step": 3, "dur": "0.5"}) is None


def test_a_step_without_gap_takes_the_blocking_seconds_before_it_up_to_its_duration():
    told = step_reading({"step": 1, "t": 10.0, "dur": 3.0, "gap": 0.5}, pending_gap=2.0)
    assert (told.gap, told.gap_inferred) == (0.5, False)          # the probe's own gap wins
    inferred = step_reading({"step": 1, "t": 10.0, "dur": 3.0}, pending_gap=2.0)
    assert (inferred.gap, inferred.gap_inferred, inferred.start) == (2.0, True, 7.0)
    assert step_reading({"step": 1, "t": 10.0, "dur": 1.5}, pending_gap=2.0).gap == 1.5
    assert step_reading({"step": 1, "t": 10.0, "dur": 1.5}).gap_inferred is False


def test_num_reads_numbers_only():
    assert [num(x) for x in (1, 2.5, True, "3", None, [1])] == [1.0, 2.5, None, None, None, None]


def test_a_rank_uses_the_gpu_of_its_local_rank_else_every_gpu_it_lists():
    two = (GpuReading(0, 0.1), GpuReading(1, 0.9))
    assert own_gpus(two, 1) == (GpuReading(1, 0.9),)
    assert own_gpus(two, 5) == two


def _sample(*gpus: dict) -> SampleReading:
    return sample_reading({"k": "sample", "gpus": list(gpus)})


def test_gpu_rows_list_each_gpu_once_per_host_with_its_history():
    samples0 = [_sample({"index": 0, "util": 0.2}), _sample({"index": 1, "util": 0.4}, {"index": 0, "util": 0.3})]
    samples1 = [_sample({"index": 0, "util": 0.5}, {"index": 1, "util": 0.6})]
    rows = gpu_rows([(0, "n1", 0, samples0), (1, "n1", 1, samples1), (2, "n1", 0, samples1),
                     (3, "n2", 0, samples1), (4, "n2", 0, [])])
    assert [(r.rank, r.gpu.index, r.gpu.util) for r in rows] == [(0, 0, 0.3), (1, 1, 0.6), (3, 0, 0.5)]
    assert rows[0].util_history == (0.2, 0.3)     # by index, whatever the order in each sample
    assert rows[1].util_history == (0.6,)


def _cuda_job(local_rank: int, gpus: list[dict]) -> RunModel:
    model = RunModel()
    model.ingest("s", R.hello(0, t=100.0, proto=[1, 0], local_rank=local_rank, device={"type": "cuda", "name": "GPU"}))
    for i in range(10):
        model.ingest("s", R.step(i, start=100.0 + i, dur=1.0, phases={"data": 0.0}))
        model.ingest("s", R.sample(101.0 + i, gpus=gpus))
    return model


def test_device_busy_is_the_utilization_of_the_ranks_own_gpu():
    gpus = [{"index": 0, "util": 0.2}, {"index": 1, "util": 90}]
    assert _cuda_job(1, gpus).view().metrics.device_busy == pytest.approx(0.9)
    assert _cuda_job(0, gpus).view().metrics.device_busy == pytest.approx(0.2)
    # its index not listed: the first GPU it lists, never a mean over the node
    assert _cuda_job(3, gpus).view().metrics.device_busy == pytest.approx(0.2)
    view = _cuda_job(1, gpus).view()
    assert [(r.rank, r.gpu.index) for r in view.gpus] == [(0, 1)]


def test_the_gpu_status_line_is_the_probes_own_words_from_the_hello_else_the_newest_sample():
    def model(device_status: str | None, samples: list[dict]) -> RunModel:
        m = RunModel()
        device = {"type": "cpu", "name": "CPU"}
        if device_status is not None:
            device["status"] = device_status
        m.ingest("s", R.hello(0, t=1.0, proto=[1, 0], device=device))
        for i, s in enumerate(samples):
            m.ingest("s", {"k": "sample", "t": 2.0 + i, **s})
        return m

    assert model("no NVIDIA GPU: none assigned", [{"gpu_status": "later"}]).view().device_status == \
        "no NVIDIA GPU: none assigned"
    assert model(None, [{"gpu_status": "NVML gone"}, {"host": {}}, {"gpu_status": "NVML back off"}, {}]).view() \
        .device_status == "NVML back off"
    assert model(None, [{"host": {}}]).view().device_status is None


def test_a_rank_without_samples_yet_does_not_hide_the_gpus_of_the_ranks_after_it():
    samples = [_sample({"index": 0, "util": 0.5})]
    rows = gpu_rows([(0, "n1", 0, []), (1, "n2", 0, samples)])
    assert [(r.rank, r.gpu.index) for r in rows] == [(1, 0)]


def test_an_old_probes_utilization_over_1_percent_is_a_percent():
    assert gpu_reading({"index": 0, "util": 1.5}).util == pytest.approx(0.015)


def test_a_hello_with_odd_values_reads_them_as_unknown_and_its_device_peaks_as_numbers_only():
    from perfmon_analysis.readings import hello_reading
    h = hello_reading({"k": "hello", "t": 5.0, "rank": True, "world_size": 4, "local_rank": "1", "pid": 9.5,
                       "host": "", "restart": 2, "job": "j", "gpus": {"status": "no NVML"},
                       "device": {"type": "cuda", "memory_total": 80e9, "peak_flops": {"bf16": 1e15, "fp8": "x"},
                                  "dtype": "bf16"}})
    assert (h.rank, h.world_size, h.local_rank, h.pid, h.host, h.restart, h.job) == (0, 4, 0, None, None, 2, "j")
    assert (h.gpus_status, h.answered, h.device.type) == ("no NVML", True, "cuda")
    assert h.device.memory_total == 80_000_000_000
    assert h.device.peak("bf16") == 1e15 and h.device.peak("fp8") is None
    held = hello_reading({"rank": 3, "pid": 7, "restart": 0})      # the place a live stream holds before its hello
    assert not held.answered and held.device.type is None
    assert held.same_process(hello_reading({"k": "hello", "rank": 3, "pid": 7, "restart": 0}))
    assert not held.same_process(hello_reading({"k": "hello", "rank": 3, "pid": 7, "restart": 1}))


def test_comm_bus_bytes_are_the_probes_else_busbw_times_seconds_else_unknown():
    from perfmon_analysis.readings import comm_reading
    c = comm_reading({"k": "comm", "t": 1.0, "ops": [
        {"op": "all_reduce", "count": 2, "bytes": 8, "seconds": 0.5, "busbytes": 12, "busbw": 1.0},
        {"op": "all_gather", "count": 1, "bytes": 4, "seconds": 2.0, "busbw": 3.0},
        {"op": "broadcast", "count": 1, "bytes": 4, "seconds": 1.0}, {"op": 7}, "x"]})
    assert [(o.op, o.busbytes) for o in c.ops] == [("all_reduce", 12.0), ("all_gather", 6.0), ("broadcast", None)]
    assert c.op("all_gather").count == 1 and c.op("reduce") is None


def test_a_sample_reads_its_host_gpus_device_and_compute():
    s = sample_reading({"k": "sample", "t": 3.0, "host": {"cpu": 1.5, "loader_workers": 4, "loader_cpu": 0.3,
                                                        "mem_limit": 0, "mem_limit_source": "cgroup"},
                        "gpus": [{"index": 0, "util": 50}], "device": {"type": "cuda", "status": "MIG"},
                        "gpu_status": "", "compute": {"dtype": "bf16", "peak_flops": True}})
    assert (s.t, s.host.cpu, s.host.loader_workers, s.host.loader_cpu) == (3.0, 1.5, 4, 0.3)
    assert (s.host.mem_limit, s.host.mem_limit_source) == (None, "cgroup")   # a 0 limit is no limit
    assert s.gpus[0].util == 0.5 and s.device.status == "MIG" and s.gpu_status is None
    assert (s.compute.dtype, s.compute.peak_flops) == ("bf16", None)
    bare = sample_reading({"k": "sample"})
    assert bare.device is None and bare.compute is None and bare.gpus == () and bare.host.cpu is None


# -- events: an exception's line, an evaluation's forwards, the job's exit ------------------------------
def test_an_exceptions_error_step_and_user_line_are_read_and_odd_values_are_unknown():
    from perfmon_analysis.readings import ExceptionReading, event_reading, exception_reading
    full = event_reading(R.event(5.0, "exception", error="ValueError", step=12, file="/x/train.py", line=40,
                                 function="main", call="loss.backward()"))
    assert exception_reading(full) == ExceptionReading(error="ValueError", step=12, file="/x/train.py", line=40,
                                                       function="main", call="loss.backward()")
    odd = event_reading(R.event(5.0, "oom", error="", step=3.0, file=7, line=True, function="", call=None))
    assert exception_reading(odd) == ExceptionReading(error=None, step=3, file=None, line=None, function=None,
                                                      call=None)


def test_an_evaluations_forwards_are_a_count_when_said():
    from perfmon_analysis.readings import eval_forwards, event_reading
    assert eval_forwards(event_reading(R.event(5.0, "eval", forwards=4, seconds=1.5))) == 4
    assert eval_forwards(event_reading(R.event(5.0, "eval", seconds=1.5))) is None
    assert eval_forwards(event_reading(R.event(5.0, "eval", forwards="4"))) is None


def test_the_exit_status_is_a_code_or_the_signal_that_ended_the_command():
    from perfmon_analysis.readings import JobExit, exit_reading
    assert exit_reading({"job": "j", "returncode": -9, "t": 5.0}) == JobExit(code=None, signal=9, t=5.0)
    assert exit_reading({"returncode": 1}) == JobExit(code=1, signal=None, t=None)
    assert exit_reading({"returncode": 0, "t": "x"}) == JobExit(code=0, signal=None, t=None)
    assert [exit_reading(r) for r in ({"returncode": True}, {"returncode": "1"}, {"returncode": 1.0}, {})] == \
        [None, None, None, None]


def test_an_exit_fails_unless_clean_or_the_users_interrupt_and_says_how_it_ended():
    from perfmon_analysis.readings import JobExit
    cases = [JobExit(0), JobExit(1), JobExit(130), JobExit(None, 2), JobExit(None, 9), JobExit(None, 99), JobExit(None)]
    assert [(e.failed, e.text) for e in cases] == [
        (False, "exit code 0"), (True, "exit code 1"), (False, "exit code 130"), (False, "killed by SIGINT"),
        (True, "killed by SIGKILL"), (True, "killed by signal 99"), (False, "exit code None")]


# -- layout: a rank's place and its steps' operations ------------------------------------------------------
def _layout(**fields) -> dict:
    return wire.validate({"k": "layout", "t": 5.0, **fields})


def test_a_layout_record_reads_its_dims_sizes_coordinate_and_source():
    from perfmon_analysis.readings import LayoutReading, layout_reading
    assert layout_reading(_layout(dims=["pp", "dp"], sizes=[2, 4], coord=[1, 3], source="pipeline")) == \
        LayoutReading(dims=("pp", "dp"), sizes=(2, 4), coord=(1, 3), source="pipeline")
    assert layout_reading(_layout(dims=["tp"], sizes=[8], coord=[0])) == LayoutReading(("tp",), (8,), (0,), "mesh")
    assert layout_reading(_layout(dims=["tp"], sizes=[8], coord=[0], source="")) == \
        LayoutReading(("tp",), (8,), (0,), "mesh")


@pytest.mark.parametrize("dims,sizes,coord", [
    ([], [], []),                          # no dims
    (["pp", ""], [2, 4], [1, 3]),          # a dim without a name
    (["pp", 3], [2, 4], [1, 3]),
    (["pp", "dp"], [2, 0], [1, 0]),        # a size that is none
    (["pp", "dp"], [2, True], [1, 0]),
    (["pp", "dp"], [2, 4.0], [1, 0]),
    (["pp", "dp"], [2, 4], [1, -1]),       # a coordinate that is none
    (["pp", "dp"], [2, 4], [1, 4]),        # past its dim
    (["pp", "dp"], [2, 4], [2, 3]),
    (["pp", "dp"], [2, 4], [1]),           # dims and coordinate do not line up
    (["pp", "dp"], [2], [1, 3]),
])
def test_a_layout_whose_dims_sizes_and_coordinate_do_not_line_up_is_no_layout(dims, sizes, coord):
    from perfmon_analysis.readings import layout_reading
    assert layout_reading(_layout(dims=dims, sizes=sizes, coord=coord)) is None


def test_a_layout_without_lists_is_no_layout():
    from perfmon_analysis.readings import layout_reading
    assert layout_reading({"k": "layout", "dims": ["pp"], "sizes": 2, "coord": [0]}) is None
    assert layout_reading({"k": "layout", "dims": "pp", "sizes": [2], "coord": [0]}) is None
    assert layout_reading({"k": "layout", "dims": ["pp"], "sizes": [2], "coord": 0}) is None


def test_a_steps_operations_are_read_in_issue_order_with_their_clock_body_and_waits():
    from perfmon_analysis.readings import Op, StepOps, step_ops
    rec = R.step(7, start=100.0, dur=1.0, phases={"data": 0.125}, gap=0.25, ops_dropped=3,
                 comm={"seconds": 0.5, "p2p_exposed": 0.0625}, ops=[
                     ["recv", 0.5, 0.25, 1, 0],
                     ["send", 0.5, 0.125, 1, 2, 0.5625],              # waited from 0.5625, inside its span
                     ["all_reduce", 0.75, 0.125, -1, "dp"],
                     ["fwd", 0.375, 0.125, 0, -1],
                     ["opt", 0.875, 0.0625],
                     ["send", 0.25, 0.125, 0, 3, 0.5],                # waited after it completed: not a wait
                     ["bwd", 0.625, 0.125, -1, -1, 9.0],
                 ])
    assert step_ops(rec) == StepOps(step=7, clock="host", body=(0.375, 1.0), dropped=3, p2p_wait=0.0625, ops=(
        Op("send", 0.25, 0.125, 0, 3), Op("fwd", 0.375, 0.125, 0), Op("send", 0.5, 0.125, 1, 2, waited=0.5625),
        Op("recv", 0.5, 0.25, 1, 0), Op("bwd", 0.625, 0.125), Op("all_reduce", 0.75, 0.125, group="dp"),
        Op("opt", 0.875, 0.0625)))


def test_malformed_operations_are_left_out_and_an_odd_clock_is_the_hosts():
    from perfmon_analysis.readings import Op, step_ops
    # hand-built: the probe's builder never sends these (tests/helpers/records.py would refuse them)
    rec = wire.validate({"k": "step", "t": 100.5, "step": 3, "start": 100.0, "dur": 0.5, "gap": 0.75,
                         "ops_clock": "gpu", "ops_dropped": -2, "ops": [
        "junk", ["fwd"], ["fwd", 0.1], [7, 0.0, 0.1], ["fwd", "0", 0.1], ["fwd", 0.0, None], ["fwd", 0.0, -0.1],
        ["send", 0.0, 0.1, 0, -1], ["recv", 0.0, 0.1, 0, "dp"], ["recv", 0.0, 0.1, 0, True],
        ["warp", 0.0, 0.1, -1, -1], ["warp", 0.0, 0.1, -1, ""],
        ["send", 0.0, 0.125, 0, 1, 0.2], ["send", 0.0, 0.125, 0, 1, -0.1], ["recv", 0.0, 0.125, -3, 1, 0.1],
        ["compute", 0.25, 0.0],
    ]})
    ops = step_ops(rec)
    assert ops is not None and (ops.clock, ops.body, ops.dropped, ops.p2p_wait) == ("host", (0.5, 0.5), 0, None)
    assert ops.ops == (Op("send", 0.0, 0.125, 0, 1), Op("send", 0.0, 0.125, 0, 1), Op("recv", 0.0, 0.125, None, 1),
                       Op("compute", 0.25, 0.0))
    assert [(o.p2p, o.collective, o.compute) for o in (ops.ops[0], Op("all_reduce", 0, 1, group="w"), ops.ops[3])] \
        == [(True, False, False), (False, True, False), (False, False, True)]
    device = step_ops(wire.validate({"k": "step", "t": 1.0, "step": 1, "dur": 0.5, "ops_clock": "device",
                                     "phases": {"data": 0.25}, "ops": []}))
    assert device is not None and (device.clock, device.body, device.ops) == ("device", (0.25, 0.5), ())


def test_a_step_without_operations_or_a_number_has_none():
    from perfmon_analysis.readings import step_ops
    assert step_ops(R.step(3, start=100.0, dur=0.5)) is None
    assert step_ops({"k": "step", "step": True, "dur": 0.5, "ops": []}) is None
    bare = step_ops({"k": "step", "step": 4, "ops": [["opt", 0.0, 0.25]]})
    assert bare is not None and (bare.body, bare.clock, bare.dropped, bare.p2p_wait) == ((0.0, 0.0), "host", 0, None)


# -- stalls ---------------------------------------------------------------------------------------------
def test_a_stall_record_reads_every_part_it_says_golden():
    from perfmon_analysis.readings import FlightEntry, InFlight, LoaderWorker, StallReading, stall_reading
    rec = wire.validate({
        "k": "stall", "t": 50.0, "since": 20.0, "seconds": 30.0, "threshold": 15.0, "step": 29, "where": "loader",
        "stack": ["/x/train.py:11 in <module>", 3, "/x/data.py:5 in load"], "moving": False,
        "inflight": [{"op": "all_reduce", "group": "dp", "seq": 20, "since": 21.5}, {"op": "", "seq": True}],
        "seq": {"dp": 20, "world": 7, "odd": 1.5}, "device": {"pending": True},
        "loader": {"waiting": 1, "awaited_pid": 41, "workers": [{"pid": 40, "alive": True, "cpu": 0.25},
                                                                  {"pid": 41, "alive": 0}, {"pid": "x"}]},
        "flight": {"source": "nccl+generic", "sources": ["nccl", 5, "generic"], "note": "n",
                   "groups": {"dp": {"enqueued": 21, "started": 20}, "tp": {"enqueued": 2.0}, "pp": "x"},
                   "entries": [{"op": "all_reduce", "group": "dp", "seq": 21, "state": "scheduled", "backend": "nccl"},
                               {"seq": 3}]},
    })
    assert stall_reading(rec) == StallReading(
        t=50.0, seconds=30.0, threshold=15.0, step=29, where="loader",
        stack=("/x/train.py:11 in <module>", "/x/data.py:5 in load"),
        inflight=(InFlight("all_reduce", "dp", 20, 21.5), InFlight("collective", "world", None, None)),
        seq={"dp": 20, "world": 7}, loader_waiting=True, awaited_pid=41,
        workers=(LoaderWorker(40, True, 0.25), LoaderWorker(41, False, None), LoaderWorker(None, False, None)),
        device_pending=True, flight_source="nccl+generic", moving=False,
        flight=(FlightEntry("all_reduce", "dp", 21, "scheduled", "nccl"),
                FlightEntry("collective", "world", 3, "enqueued", None)),
        flight_sources=("nccl", "generic"), flight_enqueued={"dp": 21}, flight_note="n")


def test_a_bare_stall_is_a_stall_in_a_step_with_nothing_else_known():
    from perfmon_analysis.readings import StallReading, stall_reading
    assert stall_reading(wire.validate({"k": "stall", "t": 50.0, "seconds": 30.0})) == StallReading(
        t=50.0, seconds=30.0, threshold=None, step=None, where="step", stack=(), inflight=(), seq={},
        loader_waiting=False, awaited_pid=None, workers=(), device_pending=None, flight_source=None)
    odd = stall_reading({"k": "stall", "t": 50.0, "seconds": 30.0, "seq": [1], "moving": 1, "device": {"pending": 0},
                         "flight": {"sources": "nccl", "groups": ["dp"], "source": "", "note": ""}})
    assert odd is not None
    assert (odd.seq, odd.moving, odd.device_pending, odd.flight_sources, odd.flight_enqueued, odd.flight_source,
            odd.flight_note) == ({}, None, None, (), {}, None, None)
    assert stall_reading({"k": "stall", "seconds": 30.0}) is None


def test_a_stall_lasts_on_the_probes_clock_and_names_the_awaited_worker():
    from perfmon_analysis.readings import LoaderWorker, stall_reading
    rec = wire.validate({"k": "stall", "t": 50.0, "seconds": 30.0, "loader": {
        "awaited_pid": 41, "workers": [{"pid": None, "alive": True}, {"pid": 40, "alive": True},
                                       {"pid": 41, "alive": False}]}})
    stall = stall_reading(rec)
    assert stall is not None
    assert (stall.lasted(60.0), stall.lasted(40.0)) == (40.0, 30.0)
    assert stall.awaited_worker == LoaderWorker(41, False, None)
    unawaited = stall_reading(wire.validate({"k": "stall", "t": 50.0, "seconds": 30.0,
                                             "loader": {"workers": [{"alive": True}]}}))
    assert unawaited is not None and unawaited.awaited_worker is None


# -- captures and module profiles --------------------------------------------------------------------------
def test_a_capture_record_reads_its_trace_top_operators_and_gaps_golden():
    from perfmon_analysis.readings import CaptureRecord, OpTime, capture_record
    rec = wire.validate({"k": "capture", "t": 9.0, "id": 1, "steps": 3, "first_step": 10, "last_step": 12,
                         "wall_s": 1.5, "path": "/tmp/t.json.gz", "device_busy": 0.75, "cost": {"thread_cpu_s": 0.25},
                         "top": [{"name": "aten::mm" + "x" * 130, "self_s": 0.5, "calls": 30}, {"name": "relu"}, "x"],
                         "gaps": [{"seconds": 0.125, "at_s": 0.5}, {}, 7]})
    assert capture_record(rec) == CaptureRecord(
        t=9.0, steps=3, first_step=10, last_step=12, wall_s=1.5, path="/tmp/t.json.gz",
        top=(OpTime("aten::mm" + "x" * 112, 0.5, 30), OpTime("relu", 0.0, 0)), device_busy=0.75,
        gaps=((0.125, 0.5), (0.0, 0.0)), error=None, thread_cpu_s=0.25)
    failed = capture_record(wire.validate({"k": "capture", "t": 9.0, "steps": 0, "error": "no profiler",
                                           "path": ""}))
    assert failed == CaptureRecord(t=9.0, steps=0, first_step=None, last_step=None, wall_s=None, path=None, top=(),
                                   device_busy=None, gaps=(), error="no profiler", thread_cpu_s=None)
    assert capture_record({"k": "capture"}) == CaptureRecord(0.0, 0, None, None, None, None, (), None, (), None, None)


def test_a_results_own_cpu_is_its_cost_else_the_reports_entry_never_negative():
    from perfmon_analysis.readings import window_cpu
    assert window_cpu({"cost": {"thread_cpu_s": 0.5}, "thread_cpu_s": 9.0}) == 0.5
    assert window_cpu({"thread_cpu_s": 0.25}) == 0.25
    assert window_cpu({"cost": {"thread_cpu_s": 0}}) == 0.0
    odd: list[dict[str, Any]] = [{"cost": {"thread_cpu_s": -1.0}}, {"cost": "x"}, {"cost": {}}, {}]
    assert [window_cpu(r) for r in odd] == [None, None, None, None]


def test_a_profile_record_reads_its_modules_and_how_they_were_timed_golden():
    from perfmon_analysis.readings import ModuleTimes, ProfileRecord, profile_record
    rec = wire.validate({
        "k": "profile", "t": 9.0, "id": 2, "steps": 5, "first_step": 20, "last_step": 24, "depth": 2, "step_s": 0.5,
        "timer": "cuda_events", "peak_flops": 1e15, "peak_source": "table", "flops_note": "n", "truncated": True,
        "cost": {"thread_cpu_s": 0.125},
        "modules": [{"name": "", "type": "Net", "depth": 0, "params": 1000, "calls": 1, "flops": 6e9, "fwd_flops": 2e9,
                     "fwd_s": 0.125, "bwd_s": 0.25},
                    {"name": "fc", "type": "", "depth": 1.0, "params": -3.5, "calls": -1, "flops": "x", "fwd_s": 0},
                    {"type": "Linear"}, "junk"]})
    assert profile_record(rec) == ProfileRecord(
        t=9.0, steps=5, first_step=20, last_step=24, depth=2, step_s=0.5, timer="cuda_events", peak_flops=1e15,
        peak_source="table", flops_note="n", error=None, truncated=True, thread_cpu_s=0.125, modules=(
            ModuleTimes("", "Net", 0, 1000, 1.0, 6e9, 2e9, 0.125, 0.25),
            ModuleTimes("fc", None, 0, 0, None, None, None, 0.0, None)))
    bare = profile_record(wire.validate({"k": "profile", "t": 9.0, "modules": [], "step_s": 0, "peak_flops": -1,
                                         "truncated": False, "error": "e"}))
    assert bare == ProfileRecord(t=9.0, steps=0, first_step=None, last_step=None, depth=0, step_s=None, timer=None,
                                 peak_flops=None, peak_source=None, modules=(), flops_note=None, error="e",
                                 truncated=False)


# -- where: the training thread's stack samples ----------------------------------------------------------
def test_a_where_record_reads_every_line_holder_and_share_golden():
    from perfmon_analysis.readings import HolderCount, WhereCount, WhereInterval, where_interval
    rec = {"k": "where", "t0": 10.0, "t1": 12.0, "hz": 50, "samples": 90, "other": 4, "runq": 0.25,
           "between_samples": 10, "between_runq": 0.5,
           "lines": [{"file": "train.py", "line": 7, "function": "step", "call": "torch.mm", "lib": "torch",
                      "state": "busy", "n": 60},
                     {"file": "train.py", "line": 9, "n": 26}],
           "between": [{"file": "train.py", "line": 20, "function": "log", "state": "waiting", "n": 10,
                        "before": 3, "after": 7}],
           "holders": [{"thread": "tokenizer", "file": "tok.py", "line": 3, "function": "encode", "call": "re.sub",
                        "span": "between", "n": 8},
                       {"file": "bg.py", "line": 5, "span": "step", "n": 2}]}
    assert where_interval(rec) == WhereInterval(
        t0=10.0, t1=12.0, hz=50, samples=90, other=4, runq=0.25, between_samples=10, between_runq=0.5,
        lines=(WhereCount("train.py", 7, "step", "torch.mm", "torch", "busy", 60),
               WhereCount("train.py", 9, "?", None, None, None, 26)),
        between=(WhereCount("train.py", 20, "log", None, None, "waiting", 10, span="between", before=3, after=7),),
        holders=(HolderCount("tokenizer", "tok.py", 3, "encode", "re.sub", "between", 8),
                 HolderCount("?", "bg.py", 5, "?", None, "step", 2)))


def test_a_where_records_odd_values_are_clamped_or_left_out():
    from perfmon_analysis.readings import where_interval
    line = {"file": "a.py", "line": 1, "function": "f", "n": 5}
    rec = {"k": "where", "t0": 0.0, "t1": 1.0, "samples": 0, "other": -3, "runq": 1.5, "between_runq": -0.5,
           "between_samples": -2, "between": [line],
           "lines": [line, {**line, "before": 9, "after": -1}, "junk", {**line, "file": None}, {**line, "line": "1"},
                     {**line, "n": 0}, {**line, "n": None}, {**line, "state": "sleeping"}, {**line, "function": None}],
           "holders": ["junk", {**line, "span": "elsewhere"}, {**line, "span": "step", "n": 0},
                       {**line, "span": "step", "file": None}, {**line, "span": "step", "line": None}]}
    w = where_interval(rec)
    assert w is not None
    assert (w.hz, w.samples, w.other, w.runq, w.between_runq, w.between_samples, w.between, w.holders) == \
        (None, 0, 0, 1.0, 0.0, 0, (), ())
    assert [(c.function, c.before, c.after) for c in w.lines] == [("f", 0, 0), ("f", 5, 0), ("?", 0, 0)]
    bare = where_interval({"k": "where", "t0": 0.0, "t1": 1.0, "samples": 3, "lines": "junk", "holders": {}})
    assert bare is not None and (bare.lines, bare.holders, bare.runq, bare.between_runq, bare.other) == \
        ((), (), None, None, 0)
    assert [where_interval({"t0": 0.0, "t1": 1.0, **r}) for r in ({"samples": -1}, {}, {"samples": "1"})] == \
        [None, None, None]
    assert where_interval({"t1": 1.0, "samples": 1}) is None and where_interval({"t0": 1.0, "samples": 1}) is None


def test_a_drops_record_counts_only_a_positive_whole_number():
    from perfmon_analysis.readings import dropped
    assert [dropped(r) for r in ({"count": 4}, {"count": 0}, {"count": -2}, {"count": None}, {}, {"count": 1.5})] \
        == [4, 0, 0, 0, 0, 0]


def test_a_clean_exit_keeps_the_time_it_was_written():
    from perfmon_analysis.readings import JobExit, exit_reading
    assert exit_reading({"returncode": 2, "t": 7.5}) == JobExit(code=2, signal=None, t=7.5)


# -- steps and events ---------------------------------------------------------------------------------
def test_a_step_reads_every_field_it_says_golden():
    rec = R.step(9, start=100.0, dur=1.0, phases={"data": 0.125, "forward": 0.25, "backward": 0.375}, gap=0.0625,
                 samples=32, tokens=4096, flops=1e12, data_cpu=0.03125, cpu=0.5,
                 comm={"seconds": 0.25, "exposed": 0.125, "estimated": True}, syncs=3, lead=0.01, gpu_time=0.75,
                 whole=True, sync_site="train.py:12", mem={"reserved": 7 << 30, "peak": 5 << 30}, gap_cpu=0.02)
    s = step_reading(rec)
    assert s is not None
    assert (s.step, s.t, s.start, s.dur, s.gap, s.has_data, s.data) == (9, 101.0, 100.0, 1.0, 0.0625, True, 0.125)
    assert (s.phase("forward"), s.phase("backward"), s.phase("optimizer"), s.bar().phase("backward")) == \
        (0.25, 0.375, None, 0.375)
    assert (s.comm_s, s.exposed, s.estimated) == (0.25, 0.125, True)
    assert (s.samples, s.tokens, s.flops, s.syncs, s.data_cpu, s.lead, s.gpu_time, s.whole, s.sync_site) == \
        (32, 4096, 1e12, 3, 0.03125, 0.01, 0.75, True, "train.py:12")
    assert (s.mem_peak, s.cpu, s.cpu_active, s.gap_cpu, s.gap_inferred, s.record) == \
        (7 << 30, 0.5, False, 0.02, False, rec)


def test_a_steps_odd_or_missing_fields_read_unknown():
    s = step_reading({**R.step(1, start=5.0, dur=0.5), "comm": "x", "whole": 1, "mem": {"peak": 3 << 30},
                      "start": None})
    assert s is not None
    assert (s.start, s.comm_s, s.exposed, s.estimated, s.whole, s.mem_peak, s.tokens, s.gap_cpu) == \
        (5.0, None, None, False, None, 3 << 30, None, None)
    assert step_reading({**R.step(1, start=5.0, dur=0.5), "comm": {"seconds": 0.1}}).estimated is False


def test_a_gap_taken_from_the_blocking_events_is_in_the_record_the_model_holds_and_priced_by_pauses():
    rec = R.step(2, start=10.0, dur=1.0)
    del rec["gap"]
    asked = []
    s = step_reading(rec, pending_gap=0.5, pauses=lambda gap, dur, marked: asked.append((gap, dur, marked)) or 0.25)
    assert s is not None and (s.gap, s.gap_inferred, s.pause, asked) == (0.5, True, 0.25, [(0.5, 1.0, 0.5)])
    assert s.record == {**rec, "gap": 0.5} and "gap" not in rec
    assert step_reading(rec, pending_gap=0.0).gap_inferred is False


def test_the_cpu_of_a_zero_code_step_leaves_its_loaders_out_and_zero_is_measured():
    from perfmon_analysis.readings import step_cpu
    active = R.step(1, start=0.0, dur=1.0, cpu=0.5, cpu_span="active")
    assert step_cpu(active) == (0.5, True)
    assert step_cpu({**active, "data_cpu": 0.125}) == (0.375, True)
    assert step_cpu({**active, "data_cpu": 0.75}) == (0.0, True)
    assert step_cpu(R.step(1, start=0.0, dur=1.0, cpu=0.0)) == (0.0, False)
    assert step_cpu(R.step(1, start=0.0, dur=1.0, cpu=0.25, cpu_others=1.5, intra_threads=4)) == (0.5, False)
    assert step_cpu(R.step(1, start=0.0, dur=1.0, cpu=0.25, cpu_others=1.5, intra_threads=1)) == (0.25, False)
    assert step_cpu({"cpu": -0.1}) == (None, False) and step_cpu({}) == (None, False)


def test_an_event_reads_its_name_seconds_unmeasured_quantity_and_message():
    from perfmon_analysis.readings import event_reading
    rec = R.event(3.0, "warning", message="no comm hooks", unmeasured="comm", seconds=1.5)
    e = event_reading(rec)
    assert (e.t, e.name, e.seconds, e.unmeasured, e.message, e.record) == (3.0, "warning", 1.5, "comm",
                                                                             "no comm hooks", rec)
    odd = event_reading({"k": "event", "t": "x", "name": 5, "unmeasured": 1, "message": None})
    assert (odd.t, odd.name, odd.seconds, odd.unmeasured, odd.message) == (None, "", None, None, "")


# -- samples: GPU health, device, memory, communication, the probe's cost -------------------------------
def test_a_gpus_reasons_errors_and_loss_are_read_and_odd_ones_are_unknown():
    g = gpu_reading({**FULL_GPU, "why": {"sm_active": "no DCGM", "temp_c": 5}, "errors": 2, "lost": True})
    assert (g.why, g.errors, g.lost) == ((("sm_active", "no DCGM"),), 2, True)
    assert g.why_not("sm_active") == "no DCGM"
    odd = gpu_reading({"why": ["x"], "errors": 1.0, "lost": "yes"})
    assert (odd.why, odd.errors, odd.lost) == ((), None, False)


def test_a_device_reads_its_dtype_peaks_and_offloaded_share():
    from perfmon_analysis.readings import DeviceReading, device_reading
    d = device_reading({"type": "cuda", "name": "H100", "status": "ok", "memory_total": 80 << 30, "dtype": "bf16",
                        "peak_flops": {"bf16": 989e12, "fp8": 0, "fp32": "x"}, "offloaded": 0.25})
    assert d == DeviceReading(type="cuda", name="H100", status="ok", memory_total=80 << 30, dtype="bf16",
                              peak_flops=(("bf16", 989e12),), offloaded=0.25)
    assert (d.peak("bf16"), d.peak("fp8")) == (989e12, None)
    assert device_reading({"dtype": 3, "offloaded": "x"}) == DeviceReading()
    assert device_reading("cuda") is None


def test_a_memory_record_reads_every_count_under_its_own_name():
    from perfmon_analysis.readings import MemoryReading, memory_reading
    names = ["rss", "peak", "limit", "reserved", "peak_reserved", "allocated", "alloc_retries", "ooms", "params",
             "grads", "optimizer", "activations", "cache", "other", "fragmentation"]
    counts = {n: i + 1 for i, n in enumerate(names)}
    rec = {"k": "memory", "t": 4.0, "device": "cuda", "limit_source": "cgroup", **counts}
    assert memory_reading(rec) == MemoryReading(t=4.0, on_host=False, limit_source="cgroup", record=rec, **counts)
    assert memory_reading(rec).record is rec
    bare = memory_reading({"k": "memory", "device": "cpu", "limit_source": 3})
    assert bare.on_host and bare.t is None and bare.limit_source is None
    assert all(getattr(bare, n) is None for n in names)


def test_a_comm_record_reads_each_collective_and_its_time_and_leaves_out_the_unnamed():
    from perfmon_analysis.readings import CommOp, comm_reading
    rec = R.comm(6.0, [{"op": 3}, {"op": "all_reduce", "count": 4, "bytes": 1024, "seconds": 0.5, "busbytes": 2048},
                       {"op": "broadcast", "count": 1, "bytes": 8, "seconds": 0.25, "busbw": 100.0}])
    c = comm_reading(rec)
    assert (c.t, c.record, c.ops) == (6.0, rec, (CommOp("all_reduce", 4, 1024, 0.5, 2048),
                                                 CommOp("broadcast", 1, 8, 0.25, 25.0)))
    assert c.op("broadcast") == CommOp("broadcast", 1, 8, 0.25, 25.0) and c.op("all_gather") is None


def test_a_samples_cost_is_read_with_the_samples_time():
    s = sample_reading(R.sample(8.0, cost={"train_s": 0.5, "train_steps": 10}))
    assert s.cost is not None and (s.cost.t, s.cost.train_s, s.cost.train_steps) == (8.0, 0.5, 10)
    assert sample_reading(R.sample(8.0)).cost is None


def test_the_probes_cost_reads_every_part_and_leaves_out_odd_ones_golden():
    from perfmon_analysis.readings import CostReading, cost_reading
    cost = {"train_s": 1.5, "train_steps": 100, "hooks": {"loader": 0.25, "bad": -1, "text": "x"},
            "threads": {"perfmon-sampler": 0.75}, "process_cpu": 9.0, "queue_items": 3, "viewer_bytes": 10,
            "backfill_bytes": 20, "sent_bytes": 30, "recorded_bytes": 40, "why": {"threads": "no clock"},
            "wrappers": {"step": [100, 2e-6], "loader": [5, -1.0], "phase": [True, 1e-6], "odd": [1],
                         "phase2": [0, 0.0]}}
    assert cost_reading(cost, 3.0) == CostReading(
        t=3.0, train_s=1.5, train_steps=100, hooks=(("loader", 0.25),), threads=(("perfmon-sampler", 0.75),),
        process_cpu=9.0, queue_items=3, viewer_bytes=10, backfill_bytes=20, sent_bytes=30, recorded_bytes=40,
        why=(("threads", "no clock"),), wrappers=(("step", 100, 2e-6), ("phase2", 0, 0.0)))
    assert cost_reading(cost, 3.0).unmeasured("threads", "-") == "no clock"
    assert cost_reading(cost, 3.0).unmeasured("process_cpu", "-") == "-"
    bare = cost_reading({"train_s": -1.0, "threads": ["x"], "hooks": [], "why": "x", "wrappers": []}, None)
    assert bare == CostReading(t=None, train_s=None, train_steps=None, hooks=(), threads=None, process_cpu=None,
                               queue_items=None, viewer_bytes=None, backfill_bytes=None, sent_bytes=None,
                               recorded_bytes=None, why=(), wrappers=None)
    assert cost_reading([], 1.0) is None
