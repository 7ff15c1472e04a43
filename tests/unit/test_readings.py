"""Typed readings (perfmon_analysis.readings): each wire key parsed once, unknown kept unknown, a
rank's own GPU chosen by its local rank, and each GPU listed once per host."""

from __future__ import annotations

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
