"""Run model: windows, derived metrics and their formulas, ranks and generations."""

from __future__ import annotations

import pytest

from perfmon_analysis.buffers import RECENT_SECONDS
from perfmon_analysis.runmodel import MIN_STEPS, RunModel
from probe.wire import busbw_factor
from tests.unit.verdict_synth import T0, Rank, job, records

GB = 1 << 30


# -- window ----------------------------------------------------------------------------------
def test_window_is_last_50_steps():
    view = job(Rank(steps=200, dur=0.1)).view()
    assert view.window["steps"] == 50
    assert view.ranks[0].window_steps == 50 and view.metrics.steps == 200


def test_window_is_30_seconds_when_that_is_fewer_steps():
    view = job(Rank(steps=100, dur=1.0)).view()
    assert view.window["steps"] == 31          # steps ending in [last-30 s, last]
    assert view.window["seconds"] == pytest.approx(31.0)


def test_window_keeps_at_least_five_slow_steps():
    view = job(Rank(steps=20, dur=20.0)).view()
    assert view.window["steps"] == MIN_STEPS and not view.warming_up


def test_custom_window():
    model = job(Rank(steps=100, dur=0.1), model=RunModel(window_steps=10))
    assert model.view().window["steps"] == 10


def test_first_step_is_left_out_of_the_window():
    recs = records(Rank(steps=8, dur=0.1))
    recs[1] = dict(recs[1], dur=5.0)            # step 0: lazy init
    model = RunModel()
    for r in recs:
        model.ingest("s", r)
    m = model.view().metrics
    assert m.step_time_median_s == pytest.approx(0.1) and model.view().window["steps"] == 7


def test_warming_up_before_five_steps_after_the_first():
    assert job(Rank(steps=5)).view().warming_up
    assert not job(Rank(steps=6)).view().warming_up


# -- derived metrics --------------------------------------------------------------------------
def test_shares_and_cpu_device_busy_formula():
    m = job(Rank(0, dur=0.1, data=0.02, comm=0.03, exposed=0.01), Rank(1, dur=0.1, data=0.02, comm=0.03,
                                                                      exposed=0.01)).view().metrics
    assert m.data_wait_frac == pytest.approx(0.2)
    assert m.comm_frac == pytest.approx(0.3) and m.comm_exposed_frac == pytest.approx(0.1)
    # busy = (step - data wait - exposed comm) / step
    assert m.device_busy == pytest.approx(0.7) and m.device_busy_source == "step_accounting"


def test_every_share_is_of_the_iteration_and_time_between_every_step_is_the_loops_not_ettrs():
    """One whole: a 100 ms iteration with 20 ms of data wait and 20 ms between every two steps reads data
    wait 20%, busy 60%, loop work 20%; recurring on every step, that time is no pause: ETTR stays 100%."""
    m = job(Rank(dur=0.1, data=0.02, gap=0.02, steps=40)).view().metrics
    assert m.data_wait_frac == pytest.approx(0.2)
    assert m.device_busy == pytest.approx(0.6)
    assert m.loop_frac == pytest.approx(0.2) and m.gap_frac == pytest.approx(0.2)
    assert m.ettr == pytest.approx(1.0, abs=1e-6) and m.pause_frac == pytest.approx(0.0, abs=1e-6)


def test_pauses_are_measured_over_the_run_and_shares_of_the_loop_keep_their_part_of_the_whole():
    """A 0.5 s checkpoint every 10 steps of 100 ms: a pause whether the window ends on one or not (its share
    is the run's, so ETTR = 1 - pauses), and the data wait, 20% of the loop, is 20% x (1 - pauses) of the whole."""
    for steps in (50, 55):
        m = job(Rank(dur=0.1, data=0.02, pause=0.5, pause_every=10, steps=steps)).view().metrics
        paused = steps // 10 * 0.5
        assert m.ettr == pytest.approx(1 - m.pause_frac, abs=1e-6)
        assert m.pause_frac == pytest.approx(paused / (steps * 0.1 + paused), abs=1e-6)
        assert m.data_wait_frac == pytest.approx(0.2 * (1 - m.pause_frac), abs=1e-6)
        assert m.loop_frac == pytest.approx(0.0, abs=1e-6)


def test_ettr_falls_back_to_blocking_event_seconds_without_gap_key():
    recs = records(Rank(dur=0.1, steps=20))
    for r in recs:
        r.pop("gap", None)
    # a 1.0 s checkpoint event before step 10, whose dur includes it
    idx = next(i for i, r in enumerate(recs) if r.get("step") == 10)
    recs.insert(idx, {"k": "event", "t": recs[idx]["start"] + 1.0, "name": "checkpoint", "seconds": 1.0})
    recs[idx + 1] = dict(recs[idx + 1], dur=1.1)
    for r in recs[idx + 2:]:
        for key in ("t", "start"):
            if key in r:
                r[key] += 1.0
    model = RunModel()
    for r in recs:
        model.ingest("s", r)
    view = model.view()
    assert view.metrics.ettr == pytest.approx(2.0 / 3.0, abs=1e-6)    # 2 s of steps in 3 s
    assert view.traces[0].steps[10].gap == pytest.approx(1.0)
    assert view.metrics.step_time_median_s == pytest.approx(0.1)


def test_ettr_counts_an_ongoing_stall_live_but_not_after_the_end():
    model = job(Rank(steps=20, dur=0.1))
    last = T0 + 2.0
    assert model.view(now=last).metrics.ettr == pytest.approx(1.0)
    # the step in progress (up to one typical step, 0.1 s) is not lost time...
    assert model.view(now=last + 0.1).metrics.ettr == pytest.approx(1.0)
    # ...but a stall beyond it is, as it happens: 2 s in steps over 2 + (2 - 0.1) s
    assert model.view(now=last + 2.0).metrics.ettr == pytest.approx(2.0 / 3.9)
    model.end_stream(model.view().ranks[0].stream)
    assert model.view(now=last + 2.0).metrics.ettr == pytest.approx(1.0)


def test_steps_lost_to_drops_do_not_count_as_gaps():
    recs = [r for r in records(Rank(steps=30, dur=0.1)) if not (r["k"] == "step" and 10 <= r["step"] < 20)]
    model = RunModel()
    for r in recs:
        model.ingest("s", r)
    assert model.view().metrics.ettr == pytest.approx(1.0)


def test_mfu_from_flops_and_peak_never_on_cpu_without_peak():
    m = job(Rank(dur=0.1, flops=4e12, gpu_util=99), device="cuda", peak=100e12).view().metrics
    assert m.mfu == pytest.approx(0.4) and m.flops_per_s == pytest.approx(40e12)
    assert job(Rank(dur=0.1, flops=4e12)).view().metrics.mfu is None


def test_gpu_device_busy_is_measured_activity_never_event_elapsed_time():
    """CUDA events bracket the step on the GPU timeline, idle gaps included: 60 ms of 100 ms says
    nothing about how busy the device was. NVML's utilization does; without it busy is unknown."""
    m = job(Rank(dur=0.1, gpu_time=0.06, gpu_util=55), device="cuda").view().metrics
    assert m.device_busy == pytest.approx(0.55) and m.device_busy_source == "nvml_util"
    m = job(Rank(dur=0.1, gpu_time=0.06), device="cuda").view().metrics
    assert m.device_busy is None and m.device_busy_source is None


def test_throughput_summed_step_time_from_slowest_rank():
    m = job(Rank(0, dur=0.1, samples=32, comm=0.0), Rank(1, dur=0.2, samples=32, comm=0.0)).view().metrics
    assert m.samples_per_s == pytest.approx(320 + 160)
    assert m.step_time_median_s == pytest.approx(0.2)


def test_syncs_and_loader_numbers():
    m = job(Rank(syncs=2, loader_workers=3, loader_cpu=0.8, data=0.01, data_cpu=0.005)).view().metrics
    assert m.syncs_per_step == 2 and m.loader_workers == 3 and m.loader_cpu == pytest.approx(0.8)
    assert m.data_cpu_frac == pytest.approx(0.5)


def test_unknowns_stay_none():
    m = job(Rank(0), Rank(1)).view().metrics       # two ranks, comm not measured, no loader
    assert m.comm_frac is None and m.comm_exposed_frac is None and m.data_wait_frac is None
    assert m.mfu is None and m.syncs_per_step is None and m.loader_cpu is None and m.compute_ratio is None
    single = job(Rank(0)).view().metrics               # one process: no peers, so no communication
    assert single.comm_frac == 0.0 and single.comm_exposed_frac == 0.0


# -- straggler --------------------------------------------------------------------------------
def test_straggler_is_the_slowest_computing_rank():
    view = job(Rank(0, comm=0.05, exposed=0.05), Rank(1, comm=0.0), Rank(2, comm=0.05, exposed=0.05)).view()
    assert view.straggler_rank == 1 and view.metrics.compute_ratio == pytest.approx(0.5)
    by_rank = {r.rank: r for r in view.ranks}
    assert by_rank[1].compute_s == pytest.approx(0.1) and by_rank[0].compute_s == pytest.approx(0.05)


def test_no_straggler_at_ratio_0_7():
    view = job(Rank(0, comm=0.03, exposed=0.03), Rank(1, comm=0.0)).view()
    assert view.metrics.compute_ratio == pytest.approx(0.7) and view.straggler_rank is None


# -- comm ops and busbw -----------------------------------------------------------------------
@pytest.mark.parametrize("op,n,factor", [("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("allreduce", 4, 1.5),
                                         ("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875),
                                         ("all_to_all", 2, 0.5), ("broadcast", 8, 1.0), ("reduce", 8, 1.0),
                                         ("gloo:all_reduce", 4, 1.5), ("send", 4, 1.0), ("all_reduce", 1, 1.0)])
def test_busbw_factors_follow_nccl_tests(op, n, factor):
    assert busbw_factor(op, n) == pytest.approx(factor)


def test_a_barrier_or_an_unknown_group_has_no_busbw():
    assert busbw_factor("barrier", 8) is None and busbw_factor("gloo:barrier", 4) is None
    assert busbw_factor("all_reduce", None) is None and busbw_factor("all_reduce", 0) is None


def test_comm_rows_are_window_deltas_of_cumulative_records():
    """busbw from the probe's bus bytes, which carry each call's own group size: here the all-reduces
    ran in 2-rank groups (factor 1) inside a 4-rank job, so the job's world size (factor 1.5) is wrong."""
    comm = [{"k": "comm", "t": T0 + 0.05, "world_size": 4,
             "ops": [{"op": "all_reduce", "count": 100, "bytes": 100 << 20, "seconds": 9.0,
                      "busbytes": float(100 << 20)}]},
            {"k": "comm", "t": T0 + 3.0, "world_size": 4,
             "ops": [{"op": "all_reduce", "count": 130, "bytes": 130 << 20, "seconds": 9.3,
                      "busbytes": float(130 << 20)},
                     {"op": "broadcast", "count": 1, "bytes": 1 << 20, "seconds": 0.01}]}]
    ranks = [Rank(i, comm=0.01, extra_records=comm if i == 0 else []) for i in range(4)]
    view = job(*ranks).view()
    rows = {r.op: r for r in view.comm_ops}
    ar = rows["all_reduce"]
    assert (ar.count, ar.bytes) == (30, 30 << 20) and ar.seconds == pytest.approx(0.3)
    assert ar.algbw == pytest.approx((30 << 20) / 0.3) and ar.busbw == pytest.approx(ar.algbw * busbw_factor(
        "all_reduce", 2))
    assert rows["broadcast"].busbw is None          # neither busbytes nor busbw: unknown, not invented
    assert view.comm_ops[0].op == "all_reduce" and view.metrics.comm_op == "all_reduce"
    assert view.metrics.busbw == pytest.approx(ar.busbw)


def test_busbw_of_a_record_without_busbytes_comes_from_its_cumulative_busbw():
    comm = [{"k": "comm", "t": T0 + 0.05, "ops": [{"op": "all_gather", "count": 10, "bytes": 10 << 20,
                                                  "seconds": 1.0, "busbw": 0.75 * (10 << 20)}]},
            {"k": "comm", "t": T0 + 3.0, "ops": [{"op": "all_gather", "count": 20, "bytes": 20 << 20,
                                                 "seconds": 2.0, "busbw": 0.75 * (20 << 20) / 2.0}]}]
    view = job(Rank(0, comm=0.01, extra_records=comm), Rank(1, comm=0.01)).view()
    (row,) = view.comm_ops
    assert row.busbw == pytest.approx(0.75 * row.algbw)   # the group factor the probe used, (n-1)/n for n=4


# -- memory -----------------------------------------------------------------------------------
def test_cpu_memory_is_rss_against_the_limit():
    m = job(Rank(rss=4 * GB, mem_limit=16 * GB)).view().metrics
    assert m.memory.source == "host" and m.memory.peak_frac == pytest.approx(0.25)
    assert m.memory_headroom == pytest.approx(0.75) and m.memory.limit_source == "machine"


def test_device_memory_breakdown_and_retries():
    def mem(t, retries):
        return {"k": "memory", "t": t, "params": 1, "grads": 2, "optimizer": 3, "activations": 4,
                "cache": 5, "fragmentation": 6, "other": 7, "limit": 100, "peak": 85,
                "peak_reserved": 95, "reserved": 90, "allocated": 80, "alloc_retries": retries,
                "ooms": 0}
    m = job(Rank(gpu_util=90, extra_records=[mem(T0 + 1, 1), mem(T0 + 2, 4)]), device="cuda").view().metrics.memory
    assert (m.params_bytes, m.grads_bytes, m.optimizer_bytes, m.activations_bytes, m.cache_bytes,
            m.other_bytes) == (1, 2, 3, 4, 5, 7)
    assert m.peak_frac == pytest.approx(0.95) and m.alloc_retries == 4 and m.alloc_retries_rising
    steady = job(Rank(gpu_util=90, extra_records=[mem(T0 + 1, 4), mem(T0 + 2, 4)]), device="cuda").view()
    assert not steady.metrics.memory.alloc_retries_rising


def test_oom_events_are_counted_across_ranks():
    oom = {"k": "event", "t": T0 + 2.5, "name": "oom", "message": "x"}
    m = job(Rank(0, extra_records=[oom], comm=0.0), Rank(1, extra_records=[oom], comm=0.0)).view().metrics
    assert m.memory.ooms == 2


# -- ranks, generations, stream state -----------------------------------------------------------
def test_restarted_rank_is_a_new_generation():
    model = job(Rank(0, steps=20, pid=11))
    for rec in records(Rank(0, steps=8, pid=22, restart=1, start=T0 + 100)):
        model.ingest("/tmp/new.sock", rec)
    view = model.view()
    (r,) = view.ranks
    assert (r.pid, r.generation, r.restart, r.steps) == (22, 1, 1, 8)
    assert view.restarted == [0] and model.retired[0][1]["pid"] == 11


def test_older_generation_read_after_the_newer_one_is_kept_aside():
    model = RunModel()
    for rec in records(Rank(0, steps=8, pid=22, restart=1, start=T0 + 100)):
        model.ingest("new", rec)
    for rec in records(Rank(0, steps=20, pid=11)):
        model.ingest("old", rec)
    (r,) = model.view().ranks
    assert r.pid == 22 and r.steps == 8 and r.generation == 1
    assert [h["pid"] for _, h in model.retired] == [11]


def test_repeated_hello_on_the_same_stream_is_not_a_restart():
    model = job(Rank(0, steps=10))
    stream = model.view().ranks[0].stream
    model.ingest(stream, records(Rank(0))[0])
    assert model.view().ranks[0].generation == 0 and model.view().ranks[0].steps == 10


def test_ended_when_every_rank_said_bye_or_closed():
    model = job(Rank(0), Rank(1, comm=0.0))
    assert not model.view().ended
    model.ingest(model.view().ranks[0].stream, {"k": "bye", "t": T0 + 5})
    assert not model.view().ended
    model.end_stream(model.view().ranks[1].stream)
    assert model.view().ended


def test_drops_orphans_and_events():
    model = job(Rank(0, extra_records=[{"k": "drops", "t": T0 + 3, "count": 5, "total": 5},
                                       {"k": "event", "t": T0 + 3.1, "name": "warning", "message": "m"}]))
    model.ingest("unknown-stream", {"k": "step", "t": T0, "step": 0, "dur": 0.1})
    view = model.view()
    assert view.drops_total == 5 and model.orphans == 1
    assert view.events[-1]["name"] == "warning" and view.events[-1]["rank"] == 0


def test_timeline_and_data_history_for_the_panes():
    view = job(Rank(steps=200, dur=0.1, data=0.025)).view()
    steps = view.traces[0].steps
    assert len(steps) == 120 and steps[-1].step == 199
    assert steps[-1].dur == pytest.approx(0.1) and steps[-1].phase("data") == pytest.approx(0.025)
    assert view.traces[0].data_wait[-1] == pytest.approx(0.25)
    assert view.hosts[0].rss == 1 << 30 and view.traces[0].cpu


def test_view_recomputes_only_after_new_records():
    model = job(Rank(steps=20))
    a, b = model.view(), model.view()
    assert a.metrics == b.metrics
    stream = a.ranks[0].stream
    model.ingest(stream, {"k": "step", "t": T0 + 10, "step": 20, "start": T0 + 2.0, "dur": 8.0,
                          "phases": {"data": 8.0}})
    assert model.view().metrics.data_wait_frac > 0


def test_comm_with_unknown_exposed_part_is_not_taken_as_exposed():
    recs0 = records(Rank(0, comm=0.05), world=2)
    recs1 = records(Rank(1, comm=0.05), world=2)
    model = RunModel()
    for stream, recs in (("a", recs0), ("b", recs1)):
        for r in recs:
            if r["k"] == "step":
                r["comm"] = {"seconds": 0.05, "exposed": None, "bytes": 1, "ops": 1, "estimated": False}
            model.ingest(stream, r)
    m = model.view().metrics
    assert m.comm_frac == pytest.approx(0.5) and m.comm_exposed_frac is None and m.compute_ratio is None


def test_steps_without_collectives_count_as_zero_comm():
    model = RunModel()
    for r in records(Rank(0), world=2):
        if r["k"] == "step":
            r["comm"] = {"seconds": None, "exposed": None, "bytes": 0, "ops": 0}
        model.ingest("a", r)
    m = model.view().metrics
    assert m.comm_exposed_frac == 0.0 and m.comm_frac == 0.0


def test_cpu_memory_records_use_the_window_rss_against_the_limit():
    mem = {"k": "memory", "t": T0 + 2.0, "device": "cpu", "rss": 3 * GB, "peak": 12 * GB, "limit": 16 * GB,
           "limit_source": "cgroup", "params": 1, "grads": 1, "optimizer": 0, "activations": 5, "other": 9}
    m = job(Rank(rss=2 * GB, extra_records=[mem])).view().metrics.memory
    assert m.source == "host" and m.peak_bytes == 3 * GB and m.peak_frac == pytest.approx(3 / 16)
    assert m.limit_source == "cgroup" and m.activations_bytes == 5


def test_mfu_peak_from_the_sampler_compute_section():
    compute = {"k": "sample", "t": T0 + 2.9, "compute": {"dtype": "bf16", "peak_flops": 50e12, "params": 10}}
    m = job(Rank(dur=0.1, flops=1e12, gpu_util=99, extra_records=[compute]), device="cuda").view().metrics
    assert m.mfu == pytest.approx(0.2) and m.peak_flops == 50e12


def test_no_peak_for_the_dtype_in_use_means_no_mfu_never_another_dtypes_peak():
    recs = records(Rank(dur=0.1, flops=1e12, gpu_util=99), device="cuda", peak=100e12)   # table: bf16 only
    for r in recs:
        if "compute" in r:
            r["compute"]["dtype"] = "fp32"
    model = RunModel()
    for r in recs:
        model.ingest("s", r)
    m = model.view().metrics
    assert m.mfu is None and m.peak_flops is None        # no fp32 peak: no MFU, bf16's is not borrowed
    m = job(Rank(dur=0.1, flops=1e12, gpu_util=99), device="cuda", peak=100e12).view().metrics
    assert m.mfu == pytest.approx(0.1) and m.peak_source == "device table, bf16"
    cpu = {"k": "sample", "t": T0 + 2.9, "compute": {"dtype": "fp32", "peak_flops": 2e12,
                                                    "peak_source": "PERFMON_PEAK_TFLOPS"}}
    m = job(Rank(dur=0.1, flops=1e11, extra_records=[cpu])).view().metrics
    assert m.mfu == pytest.approx(0.5) and m.peak_source == "PERFMON_PEAK_TFLOPS"   # a CPU job given a peak


def test_gap_share_is_measured_over_the_window_not_the_whole_run():
    """A job that has just started pausing: the window shows it while whole-run ETTR is still high."""
    recs = records(Rank(steps=200, dur=0.1))
    steps = [r for r in recs if r["k"] == "step"]
    shift = 0.0
    for r in steps:   # the last 20 steps each follow a 0.05 s pause (checkpoint-like)
        if r["step"] >= 180:
            shift += 0.05
            r["gap"] = 0.05
            r["dur"] = 0.15
        r["start"] += shift - (0.05 if r["step"] >= 180 else 0.0)
        r["t"] += shift
    model = RunModel(window_steps=20)
    for r in recs:
        model.ingest("s", r)
    m = model.view(now=steps[-1]["t"]).metrics
    assert m.ettr > 0.9
    assert m.gap_frac == pytest.approx(1.0 / 3.0, rel=1e-3)


# -- edges found by mutation testing (scripts/mutation.py) -------------------------------------
@pytest.mark.parametrize("op,n,factor", [("all_gather", 1, 1.0), ("all_gather", 0, None), ("all_gather", None, None),
                                         ("pg0:nccl:all_gather", 4, 0.75)])
def test_busbw_factor_of_one_rank_is_one_unknown_size_is_unknown_and_only_the_last_name_part_counts(op, n, factor):
    assert busbw_factor(op, n) == (pytest.approx(factor) if factor is not None else None)


def test_report_memory_object_carries_every_documented_key_with_the_model_numbers():
    view = job(Rank(0, rss=3 * GB, mem_limit=4 * GB)).view()
    out = view.metrics.memory.as_json()
    design = ("limit_bytes", "peak_bytes", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
              "cache_bytes", "other_bytes")
    extra = ("fragmentation_bytes", "reserved_bytes", "peak_frac", "source", "limit_source", "rank",
             "alloc_retries", "alloc_retries_rising", "ooms")
    assert set(out) == set(design + extra)
    assert (out["limit_bytes"], out["peak_bytes"], out["source"], out["rank"]) == (4 * GB, 3 * GB, "host", 0)
    assert out["peak_frac"] == pytest.approx(0.75) and out["limit_source"] == "machine"
    assert (out["ooms"], out["alloc_retries_rising"]) == (0, False)


def test_memory_as_json_maps_each_field_to_its_own_key():
    from dataclasses import fields

    from perfmon_analysis.views import MemoryMetrics
    values = {f.name: f"v-{f.name}" for f in fields(MemoryMetrics)}
    out = MemoryMetrics(**values).as_json()
    assert out == {key: f"v-{key}" for key in out} and "allocated_bytes" not in out


def test_set_window_recomputes_cached_statistics_and_keeps_five_steps_at_least():
    model = job(Rank(steps=100, dur=0.1))
    assert model.view().window["steps"] == 50
    model.set_window(10, 30.0)
    assert model.view().window["steps"] == 10
    model.set_window(2, 30.0)
    assert (model.window_steps, model.view().window["steps"]) == (MIN_STEPS, MIN_STEPS)
    model.set_window(50, 1.0)            # 1 s holds 11 steps of 0.1 s (steps ending in [last-1 s, last])
    assert model.window_seconds == 1.0 and model.view().window["steps"] == 11


def test_set_window_also_resets_retired_generations():
    model = job(Rank(0, steps=20, pid=11))
    for rec in records(Rank(0, steps=8, pid=22, restart=1, start=T0 + 100)):
        model.ingest("/tmp/new.sock", rec)
    model.view()
    model.set_window(10, 30.0)
    assert model.view().window["steps"] == 7 and len(model.retired) == 1


def test_problems_are_listed_once_each_in_the_view():
    model = job(Rank(0))
    model.add_problem("x.pmrec: truncated record at offset 10")
    model.add_problem("x.pmrec: truncated record at offset 10")
    model.add_problem("bad frame")
    assert model.view().problems == ["x.pmrec: truncated record at offset 10", "bad frame"]


@pytest.mark.parametrize("changed", [{"restart": 1}, {"host": "node2"}])
def test_same_pid_with_another_restart_count_or_host_is_another_process(changed):
    model = job(Rank(0, steps=10, pid=11))
    later = records(Rank(0, steps=8, pid=11, start=T0 + 100))
    later[0] = dict(later[0], **changed)
    for rec in later:
        model.ingest("/tmp/other.sock", rec)
    (r,) = model.view().ranks
    assert r.generation == 1 and r.steps == 8


def test_ranks_with_zero_compute_time_are_even():
    from perfmon_analysis.comm_stats import relative as _relative
    assert _relative([(0, 0.0), (1, 0.0)])[0] == 1.0
    assert _relative([(0, 0.05), (1, 0.1)]) == (0.5, 1)


def test_compute_ratio_of_exactly_0_7_is_not_a_straggler():
    view = job(Rank(0, dur=1.0, comm=0.3, exposed=0.3), Rank(1, dur=1.0, comm=0.0)).view()
    assert view.metrics.compute_ratio == 0.7 and view.straggler_rank is None


@pytest.mark.parametrize("late,ratio,straggler", [(0.3, 0.7, None), (0.31, 0.69, 1)])
def test_arrival_straggler_of_two_ranks_from_under_0_7(late, ratio, straggler):
    # rank 1 computes as fast as rank 0 but starts each step `late` s later; rank 0 waits for it
    view = job(Rank(0, dur=1.0, comm=late, exposed=late), Rank(1, dur=1.0, comm=0.0, gap=late)).view()
    assert view.metrics.compute_ratio == 1.0 and view.metrics.arrival_ratio == pytest.approx(ratio)
    assert view.straggler_rank == straggler
    assert view.metrics.straggler_by == ("arrival" if straggler is not None else None)


def test_same_process_seen_on_a_second_stream_keeps_its_rank_and_counts_the_new_streams_records():
    model = job(Rank(0, steps=10, pid=11))
    recs = records(Rank(0, steps=20, pid=11))
    for rec in recs:
        model.ingest("tcp:127.0.0.1:7777", rec)
    (r,) = model.view().ranks
    assert r.generation == 0 and model.orphans == 0 and r.stream == "tcp:127.0.0.1:7777" and r.steps == 20


def test_hello_without_a_usable_rank_is_rank_zero():
    model = RunModel()
    for rec in records(Rank(3, steps=8)):
        model.ingest("s", dict(rec, rank=True) if rec["k"] == "hello" else rec)
    assert [r.rank for r in model.view().ranks] == [0]


def test_a_wrapped_loader_that_never_made_the_step_wait_is_a_measured_zero_not_unknown():
    assert job(Rank(loader_workers=2, loader_cpu=0.1)).view().metrics.data_wait_frac == 0.0   # loader seen
    assert job(Rank()).view().metrics.data_wait_frac is None                                   # no loader


def test_stalls_and_ettr_are_judged_on_the_probes_clock_not_a_skewed_viewers():
    """A viewer whose wall clock is 5 s ahead of the node: with its monotonic clock, a rank that
    just stepped is not stalled and loses nothing between steps."""
    model = RunModel()
    arrived = 1000.0                                    # the viewer's monotonic clock
    for rec in records(Rank(steps=30, dur=0.1)):
        model.ingest("s", rec, received=arrived)
    last_t = model.view().now                           # the probe's clock at its newest record
    skewed = last_t + 5.0                               # the viewer's wall clock
    naive = model.view(now=skewed).ranks[0]
    assert naive.since_last_step_s == pytest.approx(5.0, abs=0.01)          # what a skewed clock claims
    judged = model.view(now=skewed, clock=arrived + 0.05).ranks[0]
    assert judged.since_last_step_s == pytest.approx(0.05, abs=0.01)
    assert judged.ettr > 0.95 > naive.ettr
    silent = model.view(now=skewed, clock=arrived + 3.0).ranks[0]            # nothing arrived for 3 s
    assert silent.since_last_step_s == pytest.approx(3.0, abs=0.01)


def test_host_lead_is_the_median_of_the_window_and_the_least_of_the_ranks():
    def ranks(leads):
        out = []
        for rank, lead in enumerate(leads):
            recs = records(Rank(rank, steps=20, dur=0.1, gpu_util=60), device="cuda")
            for r in recs:
                if r["k"] == "step":
                    r["lead"] = lead + 0.001 * (r["step"] % 3)
            out.append(recs)
        model = RunModel()
        for rank, recs in enumerate(out):
            for r in recs:
                model.ingest(f"s{rank}", r)
        return model.view().metrics.host_lead_s
    assert ranks([0.050]) == pytest.approx(0.051)
    assert ranks([0.050, 0.002]) == pytest.approx(0.003)       # the most starved rank
    assert job(Rank(gpu_util=60), device="cuda").view().metrics.host_lead_s is None   # no events: unknown


def test_loader_cpu_and_host_memory_describe_the_last_seconds_not_the_whole_window():
    """A job whose workers were CPU-bound until a few seconds ago and now wait on I/O: the 30 s window
    still holds both, but the sampled state is the recent one (the verdict must follow within 15 s)."""
    recs = records(Rank(steps=40, dur=1.0, loader_workers=2, loader_cpu=0.95, rss=12 * GB, mem_limit=16 * GB))
    last_t = max(r["t"] for r in recs)
    for r in recs:
        if r["k"] == "sample" and r["t"] >= last_t - RECENT_SECONDS:
            r["host"]["loader_cpu"] = 0.02
            r["host"]["rss"] = 2 * GB
    model = RunModel()
    for r in recs:
        model.ingest("s", r)
    m = model.view().metrics
    assert m.loader_cpu == pytest.approx(0.02)
    assert m.memory.peak_bytes == 2 * GB


# -- the view's job-level fields, the clock, records that change a rank's state -------------------
def test_an_empty_model_is_a_cpu_job_with_no_window():
    view = RunModel().view(now=T0)
    assert (view.job, view.device_type, view.started, view.ranks, view.metrics.steps) == (None, "cpu", None, [], 0)
    assert view.window == {"steps": 0, "seconds": 0.0}


def test_job_name_device_name_first_hello_time_and_a_window_in_milliseconds():
    late = records(Rank(0, steps=30, dur=0.01234, gpu_util=50), device="cuda")
    early = records(Rank(1, steps=30, dur=0.01234, gpu_util=50, start=T0 - 7.0), device="cuda")
    model = RunModel()
    for stream, recs in (("a", late), ("b", early)):
        for r in recs:
            model.ingest(stream, r)
    view = model.view()
    assert (view.job, view.device_type, view.device_name, view.started) == ("synth", "cuda", "Simulated GPU", T0 - 7.0)
    assert view.window == {"steps": 29, "seconds": 0.358}     # 29 x 12.34 ms, to the millisecond
    assert view.restarted == []


def test_gpu_rows_are_per_host_and_a_rank_without_local_rank_uses_gpu_0():
    streams = []
    for rank, host in ((0, "node1"), (1, "node2")):
        recs = records(Rank(rank, steps=8, gpu_util=40), world=2, device="cuda")
        recs[0]["host"] = host
        recs[0].pop("local_rank")
        for r in recs:
            if r["k"] == "sample":
                r["gpus"] = [{"index": 0, "util": 40}, {"index": 1, "util": 0}]
        streams.append((f"s{rank}", recs))
    model = RunModel()
    for stream, recs in streams:
        for r in recs:
            model.ingest(stream, r)
    assert [(g.rank, g.gpu.index) for g in model.view().gpus] == [(0, 0), (1, 0)]


def test_events_of_all_ranks_are_in_time_order():
    def ev(t, name):
        return {"k": "event", "t": T0 + t, "name": name, "seconds": 0.0}
    model = job(Rank(0, extra_records=[ev(2.0, "eval")]), Rank(1, extra_records=[ev(1.0, "checkpoint")]))
    assert [(e["rank"], e["name"]) for e in model.view().events] == [(1, "checkpoint"), (0, "eval")]


def test_records_without_a_time_leave_the_clock_and_drops_add_up():
    model = job(Rank(steps=10))
    now = model.view().now
    stream = model.view().ranks[0].stream
    model.ingest(stream, {"k": "drops", "count": 1})
    model.ingest(stream, {"k": "drops", "count": 2})
    view = model.view()
    assert view.now == now and view.drops_total == 3 and view.ranks[0].drops == 3


def test_every_record_before_a_hello_is_an_orphan():
    model = RunModel()
    for i in range(3):
        model.ingest("early", {"k": "step", "t": T0 + i, "step": i, "dur": 0.1})
    assert model.orphans == 3 and model.view().ranks == []


def test_a_step_record_without_its_duration_is_not_a_step():
    model = job(Rank(steps=10))
    stream = model.view().ranks[0].stream
    model.ingest(stream, {"k": "step", "t": T0 + 5.0, "step": 10})
    assert model.view().ranks[0].steps == 10


def test_a_first_batch_event_means_the_loader_is_measured():
    first = {"k": "event", "t": T0 + 0.05, "name": "first_batch", "seconds": 0.01}
    assert job(Rank(extra_records=[first])).view().metrics.data_wait_frac == 0.0
    assert job(Rank(extra_records=[dict(first, name="warning")])).view().metrics.data_wait_frac is None


def test_blocking_events_before_a_step_add_up_to_its_gap():
    recs = records(Rank(steps=12, dur=0.1))
    for r in recs:
        r.pop("gap", None)
    idx = next(i for i, r in enumerate(recs) if r.get("step") == 10)
    start = recs[idx]["start"]
    recs[idx:idx] = [{"k": "event", "t": start, "name": "checkpoint", "seconds": 0.03},
                     {"k": "event", "t": start, "name": "eval", "seconds": 0.02}]
    model = RunModel()
    for r in recs:
        model.ingest("s", r)
    assert model.view().traces[0].steps[10].gap == pytest.approx(0.05)


def _stall(t: float, step: int | None) -> dict:
    rec = {"k": "stall", "t": t, "seconds": 30.0, "threshold": 10.0, "where": "step"}
    if step is not None:
        rec["step"] = step
    return rec


def test_a_stall_ends_with_a_later_step_or_its_resumed_record_not_a_late_copy_of_its_step():
    model = job(Rank(steps=10))
    stream = model.view().ranks[0].stream
    model.ingest(stream, _stall(T0 + 40.0, 9))
    assert model.view().ranks[0].stall is not None
    model.ingest(stream, {"k": "step", "t": T0 + 1.0, "step": 9, "start": T0 + 0.9, "dur": 0.1})   # a late copy
    assert model.view().ranks[0].stall is not None
    model.ingest(stream, {"k": "step", "t": T0 + 41.0, "step": 10, "start": T0 + 40.9, "dur": 0.1})
    assert model.view().ranks[0].stall is None and model.view().ranks[0].stalled_s is None
    model.ingest(stream, _stall(T0 + 80.0, 10))
    model.ingest(stream, {"k": "resumed", "t": T0 + 81.0})
    assert model.view().ranks[0].stall is None


def test_a_stall_before_the_first_step_ends_with_step_0():
    model = RunModel()
    recs = records(Rank(steps=1))
    model.ingest("s", recs[0])
    model.ingest("s", _stall(T0 + 30.0, None))
    assert model.view().ranks[0].stall is not None
    model.ingest("s", recs[1])
    assert model.view().ranks[0].stall is None


def test_silence_runs_from_the_hello_and_stops_when_the_rank_said_bye():
    model = RunModel()
    recs = records(Rank(steps=3), bye=True)
    model.ingest("s", recs[0], received=50.0)
    assert model.view(clock=53.0).ranks[0].silent_s == pytest.approx(3.0)
    for r in recs[1:]:
        model.ingest("s", r, received=51.0)
    assert model.view(clock=60.0).ranks[0].silent_s is None


def test_an_older_generations_records_stay_with_it_and_a_restart_reads_from_its_new_stream():
    model = RunModel()
    for rec in records(Rank(0, steps=8, pid=22, restart=1, start=T0 + 100)):
        model.ingest("new", rec)
    for rec in records(Rank(0, steps=20, pid=11)):
        model.ingest("old", rec)                    # read after the newer one: kept aside, not orphans
    view = model.view()
    assert model.orphans == 0 and view.ranks[0].steps == 8 and view.ranks[0].stream == "new"
    restarted = job(Rank(0, steps=20, pid=11))
    for rec in records(Rank(0, steps=8, pid=22, restart=1, start=T0 + 100)):
        restarted.ingest("/tmp/new.sock", rec)
    assert restarted.view().ranks[0].stream == "/tmp/new.sock"


def test_a_rank_held_from_its_socket_name_shows_its_job_pid_and_restart_before_it_speaks():
    model = RunModel()
    model.expect("/tmp/j.r0.x2.p4321.sock", 0, "train-7", 4321, 2, clock=10.0)
    view = model.view(now=T0, clock=12.0)
    (r,) = view.ranks
    assert (view.job, r.pid, r.restart, r.generation, r.answered) == ("train-7", 4321, 2, 0, False)


def test_holding_a_place_never_replaces_a_rank_that_already_spoke():
    model = job(Rank(0, steps=10))
    stream = model.view().ranks[0].stream
    model.expect("/tmp/other.sock", 0, "synth", 999, 0, clock=10.0)     # same rank, another socket
    model.expect(stream, 5, "synth", 1000, 0, clock=10.0)              # same socket, another rank number
    view = model.view()
    assert [(r.rank, r.stream, r.steps, r.pid) for r in view.ranks] == [(0, stream, 10, 1000)]


def test_the_view_shows_the_newest_profile_of_any_rank():
    def profile(t: float) -> dict:
        return {"k": "profile", "t": t, "id": 1, "steps": 2, "first_step": 4, "last_step": 5, "depth": 1,
                "step_s": 0.1, "timer": "perf_counter", "modules": [
                    {"name": "", "type": "Net", "depth": 0, "params": 10, "calls": 1.0, "fwd_s": 0.03, "bwd_s": 0.05}]}
    newer_on_1 = job(Rank(0, extra_records=[profile(T0 + 2.0)]), Rank(1, extra_records=[profile(T0 + 2.5)]))
    assert newer_on_1.view().profile.rank == 1
    newer_on_0 = job(Rank(0, extra_records=[profile(T0 + 2.5)]), Rank(1, extra_records=[profile(T0 + 2.0)]))
    assert newer_on_0.view().profile.rank == 0
