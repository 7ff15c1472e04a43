"""Window statistics (``perfmon_analysis.stats``) seen through ``RunModel.view``: each rank's row, the
samples and records a window takes, memory against its limit, collectives as window deltas."""

from __future__ import annotations

import pytest

from perfmon_analysis.runmodel import RunModel
from tests.helpers import records as R
from tests.unit.verdict_synth import T0, Rank, job, records

GB = 1 << 30


def feed(*streams: tuple[str, list[dict]], model: RunModel | None = None) -> RunModel:
    model = model or RunModel()
    for stream, recs in streams:
        for rec in recs:
            model.ingest(stream, rec)
    return model


# -- a rank's row ----------------------------------------------------------------------------
def test_each_rank_row_carries_that_ranks_own_window_numbers():
    fast = Rank(0, dur=0.1, data=0.02, comm=0.03, exposed=0.01, syncs=2, samples=32, tokens=4096, flops=2e12,
                loader_workers=4, loader_cpu=0.5)
    slow = Rank(1, dur=0.2, data=0.05, comm=0.04, exposed=0.02, syncs=3, samples=16, tokens=2048, flops=3e12,
                loader_workers=2, loader_cpu=0.25, rss=2 * GB, pid=77, restart=3)
    view = job(fast, slow, peak=100e12, bye=True).view()
    r0, r1 = view.ranks
    assert (r0.host, r0.pid, r0.restart, r0.steps, r0.window_steps, r0.warming_up) == ("node1", 1000, 0, 30, 29,
                                                                                        False)
    assert (r1.host, r1.pid, r1.restart, r1.steps, r1.window_steps) == ("node1", 77, 3, 30, 29)
    expect = {0: (0.1, 0.07, 0.7, 0.2, 0.3, 0.1, 320.0, 40960.0, 2.0, 0.2, 0.5, 4, 1 * GB),
              1: (0.2, 0.13, 0.65, 0.25, 0.2, 0.1, 80.0, 10240.0, 3.0, 0.15, 0.25, 2, 2 * GB)}
    for r in (r0, r1):
        (step, compute, busy, data, comm, exposed, samples, tokens, syncs, mfu, loader_cpu, workers,
         rss) = expect[r.rank]
        assert r.step_time_median_s == pytest.approx(step) and r.compute_s == pytest.approx(compute)
        assert r.device_busy == pytest.approx(busy) and r.data_wait_frac == pytest.approx(data)
        assert r.comm_frac == pytest.approx(comm) and r.comm_exposed_frac == pytest.approx(exposed)
        assert r.samples_per_s == pytest.approx(samples) and r.tokens_per_s == pytest.approx(tokens)
        assert r.syncs_per_step == pytest.approx(syncs) and r.mfu == pytest.approx(mfu)
        assert r.loader_cpu == pytest.approx(loader_cpu) and r.loader_workers == workers
        assert r.cpu == pytest.approx(1.0) and r.rss == rss and r.answered and r.ended
        assert r.ettr == pytest.approx(1.0)       # ended: its wall time stops at its last step
    assert view.metrics.tokens_per_s == pytest.approx(40960.0 + 10240.0)


def test_a_connected_rank_that_never_spoke_is_listed_unanswered_and_silent_until_its_hello():
    model = RunModel()
    assert model.view(now=T0).metrics.steps == 0            # no rank at all: no steps, not unknown
    model.expect("/tmp/r0.sock", 0, "job", 1234, 0, clock=100.0)
    view = model.view(now=T0, clock=104.0)
    (r,) = view.ranks
    assert not r.answered and r.steps == 0 and r.silent_s == pytest.approx(4.0)
    assert view.window == {"steps": 0, "seconds": 0.0} and view.metrics.steps == 0
    model.ingest("/tmp/r0.sock", {"k": "hello", "t": T0, "rank": 0, "pid": 1234, "host": "n1"}, received=105.0)
    (r,) = model.view(now=T0, clock=105.5).ranks
    assert r.answered and r.host == "n1" and r.silent_s == pytest.approx(0.5)
    assert r.restart == 0                                    # a hello without a restart count: the first run


def test_ettr_needs_two_steps_and_two_back_to_back_steps_are_all_productive():
    recs = records(Rank(steps=2, dur=0.1))                   # hello, step 0, sample, step 1, sample
    model = feed(("s", recs[:3]))
    assert model.view().ranks[0].ettr is None and model.view().metrics.ettr is None
    feed(("s", recs[3:]), model=model)
    view = model.view()
    assert view.warming_up                                   # the job-level ETTR still comes from its ranks
    assert view.ranks[0].ettr == pytest.approx(1.0) and view.metrics.ettr == pytest.approx(1.0)


def test_steps_too_short_for_the_clock_give_no_rates_and_no_ettr_rather_than_failing():
    recs = records(Rank(steps=8, dur=0.0, flops=1e9, tokens=100))
    view = feed(("s", recs)).view()
    r, m = view.ranks[0], view.metrics
    assert (r.samples_per_s, r.tokens_per_s, r.mfu, r.ettr) == (None, None, None, None)
    assert (m.flops_per_s, m.gap_frac, m.samples_per_s) == (None, None, None)


def test_rates_over_a_window_shorter_than_a_second():
    m = job(Rank(steps=8, dur=0.01, gap=0.002, flops=1e9, tokens=100, samples=4)).view().metrics
    assert m.samples_per_s == pytest.approx(400.0) and m.tokens_per_s == pytest.approx(10000.0)
    assert m.flops_per_s == pytest.approx(1e11) and m.gap_frac == pytest.approx(0.2)


def test_the_first_step_leaves_the_window_as_soon_as_a_second_one_exists():
    hello = records(Rank(steps=0))[0]
    model = feed(("s", [hello, R.step(0, start=T0, dur=0.5)]))
    view = model.view()
    assert view.window["steps"] == 1 and view.ranks[0].step_time_median_s == pytest.approx(0.5)
    model.ingest("s", R.step(1, start=T0 + 0.5, dur=0.1))
    view = model.view()
    assert view.window["steps"] == 1 and view.ranks[0].step_time_median_s == pytest.approx(0.1)


def test_data_cpu_share_is_unknown_when_the_steps_never_waited_for_data():
    assert job(Rank(data_cpu=0.01)).view().metrics.data_cpu_frac is None
    assert job(Rank(data=0.02, data_cpu=0.01)).view().metrics.data_cpu_frac == pytest.approx(0.5)


def test_comm_is_estimated_when_any_rank_estimated_it_and_unknown_without_comm():
    def run(estimated: list[bool]) -> bool | None:
        streams = []
        for rank, est in enumerate(estimated):
            recs = records(Rank(rank, comm=0.02), world=len(estimated))
            for r in recs:
                if r["k"] == "step":
                    r["comm"]["estimated"] = est
            streams.append((f"s{rank}", recs))
        return feed(*streams).view().metrics.comm_estimated
    assert run([False, True]) is True
    assert run([False, False]) is False
    assert job(Rank(0), Rank(1)).view().metrics.comm_estimated is None


def test_trace_history_is_the_last_120_steps_and_60_samples_or_all_there_are():
    long = job(Rank(steps=200)).view().traces[0]
    assert len(long.data_wait) == 120 and len(long.cpu) == 60
    short = job(Rank(steps=10, data=0.02)).view().traces[0]
    assert len(short.data_wait) == 10 and len(short.cpu) == 10
    assert short.data_wait[0] == pytest.approx(0.2)


# -- which samples a window takes ------------------------------------------------------------------
def test_gpu_utilization_is_averaged_over_the_samples_from_the_window_start_on():
    """60 steps of 0.1 s: the window is steps 10-59, starting when step 9 ended, which is also when
    sample 9 was taken; samples 0-8 are older. A hello without local_rank reads GPU index 0."""
    recs = records(Rank(steps=60, dur=0.1, gpu_util=50), device="cuda")
    recs[0].pop("local_rank")
    samples = [r for r in recs if r["k"] == "sample"]
    for i, s in enumerate(samples):
        util = 0 if i < 9 else 100 if i == 9 else 50
        s["gpus"] = [{"index": 0, "util": util}, {"index": 1, "util": 0}]
    busy = feed(("s", recs)).view().metrics.device_busy
    assert busy == pytest.approx((100 + 50 * 50) / 51 / 100)


def test_gpu_utilization_falls_back_to_the_last_sample_when_sampling_stopped_before_the_window():
    recs = records(Rank(steps=30, dur=0.1, gpu_util=10), device="cuda")
    samples = [r for r in recs if r["k"] == "sample"]
    samples[8]["gpus"][0]["util"], samples[9]["gpus"][0]["util"] = 30, 70
    recs = [r for r in recs if r["k"] != "sample" or r in samples[:10]]
    busy = feed(("s", recs), model=RunModel(window_steps=10)).view().metrics.device_busy   # window from T0+2 s
    assert busy == pytest.approx(0.7)


def test_loader_cpu_is_the_mean_of_the_samples_of_the_last_five_seconds_boundary_included():
    recs = records(Rank(steps=40, dur=1.0, loader_workers=2, loader_cpu=0.9))
    last_t = max(r["t"] for r in recs)
    for r in recs:
        if r["k"] == "sample" and r["t"] > last_t - 5.0:
            r["host"]["loader_cpu"] = 0.3
    # samples at last-5 (0.9, the edge) and last-4 .. last (0.3)
    assert feed(("s", recs)).view().metrics.loader_cpu == pytest.approx((0.9 + 5 * 0.3) / 6)


# -- peak FLOP/s -------------------------------------------------------------------------------
def test_a_sampler_peak_without_its_source_is_the_table_peak():
    compute = {"k": "sample", "t": T0 + 2.95, "compute": {"dtype": "bf16", "peak_flops": 50e12}}
    m = job(Rank(dur=0.1, flops=1e12, extra_records=[compute])).view().metrics
    assert m.peak_source == "table" and m.mfu == pytest.approx(0.2)


def test_the_hello_dtype_picks_the_device_table_peak_when_no_sample_names_one():
    recs = records(Rank(dur=0.1, flops=2e12, gpu_util=90), device="cuda")
    recs[0]["device"].update(peak_flops={"bf16": 100e12, "fp32": 50e12}, dtype="bf16")
    m = feed(("s", recs)).view().metrics
    assert m.peak_source == "device table, bf16" and m.mfu == pytest.approx(0.2)


def test_a_device_without_a_peak_table_has_no_mfu_whatever_the_dtype():
    recs = records(Rank(dur=0.1, flops=2e12))
    recs.append({"k": "sample", "t": T0 + 3.05, "compute": {"dtype": "bf16"}})
    m = feed(("s", recs)).view().metrics
    assert m.mfu is None and m.peak_flops is None and m.peak_source is None


# -- memory ------------------------------------------------------------------------------------
def _mem(t: float, **kw) -> dict:
    return {"k": "memory", "t": t, **kw}


def test_device_memory_records_against_the_device_total_with_the_allocators_ooms_in_the_window():
    recs = [_mem(T0 + 1.0, reserved=40 * GB, peak_reserved=40 * GB, allocated=30 * GB, alloc_retries=0, ooms=1),
            _mem(T0 + 2.0, reserved=40 * GB, peak_reserved=40 * GB, allocated=32 * GB, alloc_retries=2, ooms=3),
            {"k": "event", "t": T0 + 0.05, "name": "oom"},                         # before the window
            {"k": "event", "t": T0 + 1.5, "name": "checkpoint", "seconds": 0.0}]   # not an OOM
    m = job(Rank(0, gpu_util=90, extra_records=recs), device="cuda").view().metrics.memory
    assert (m.source, m.rank, m.limit_bytes, m.limit_source) == ("device", 0, 80 * GB, "device")
    assert m.peak_bytes == 40 * GB and m.peak_frac == pytest.approx(0.5)
    assert m.allocated_bytes == 32 * GB and m.reserved_bytes == 40 * GB
    assert m.alloc_retries == 2 and m.alloc_retries_rising
    assert m.ooms == 2                                       # 3 - 1 from the allocator, no event in the window


def test_a_memory_record_with_only_its_breakdown_has_no_peak_share():
    recs = [_mem(T0 + 2.0, params=1 * GB, grads=1 * GB)]
    m = job(Rank(gpu_util=90, extra_records=recs), device="cuda").view().metrics.memory
    assert m.peak_bytes is None and m.peak_frac is None and m.params_bytes == 1 * GB


def test_without_memory_records_a_gpu_job_takes_the_window_steps_reserved_else_peak():
    recs = records(Rank(steps=30, dur=0.1, gpu_util=90), device="cuda")
    for r in recs:
        if r["k"] == "step":
            i = r["step"]
            r["mem"] = ({"reserved": 60 * GB} if i < 20 else {"peak": 24 * GB} if i == 25
                        else {"reserved": 20 * GB, "peak": 30 * GB})
    recs[0]["rank"] = 3
    m = feed(("s", recs), model=RunModel(window_steps=10)).view().metrics.memory   # the last 10 steps
    assert (m.source, m.rank, m.limit_bytes, m.limit_source) == ("device", 3, 80 * GB, "device")
    assert m.peak_bytes == 24 * GB and m.peak_frac == pytest.approx(0.3)


def test_a_gpu_job_without_memory_figures_counts_its_ooms_and_claims_no_source_or_limit():
    oom = {"k": "event", "t": T0 + 0.1, "name": "oom"}      # at the window start (the end of step 0): inside
    recs = records(Rank(steps=30, dur=0.1, gpu_util=90, extra_records=[oom]), device="cuda")
    recs[0]["device"].pop("memory_total")
    m = feed(("s", recs)).view().metrics.memory
    assert (m.source, m.limit_bytes, m.limit_source, m.peak_bytes, m.peak_frac) == (None, None, None, None, None)
    assert m.ooms == 1


def test_a_host_memory_records_own_limit_wins_over_the_samples():
    rec = _mem(T0 + 2.0, device="cpu", rss=3 * GB, limit=8 * GB, limit_source="cgroup")
    m = job(Rank(rss=1 * GB, mem_limit=16 * GB, extra_records=[rec])).view().metrics.memory
    assert (m.limit_bytes, m.limit_source, m.peak_bytes) == (8 * GB, "cgroup", 3 * GB)
    assert m.peak_frac == pytest.approx(3 / 8)


def test_host_memory_from_the_latest_record_when_no_sample_has_rss():
    before = _mem(T0 + 0.5, device="cpu", rss=3 * GB)          # older than a 10-step window
    m = feed(("s", records(Rank(rss=None, mem_limit=16 * GB, extra_records=[before]))),
             model=RunModel(window_steps=10)).view().metrics.memory
    assert (m.source, m.peak_bytes, m.limit_bytes, m.limit_source) == ("host", 3 * GB, 16 * GB, "machine")
    peak_only = _mem(T0 + 2.5, device="cpu", peak=5 * GB)
    m = job(Rank(rss=None, mem_limit=16 * GB, extra_records=[peak_only])).view().metrics.memory
    assert m.peak_bytes == 5 * GB and m.peak_frac == pytest.approx(5 / 16)


def test_a_cpu_job_without_any_rss_has_no_memory_reading_but_keeps_its_limit():
    m = job(Rank(rss=None, mem_limit=16 * GB)).view().metrics.memory
    assert (m.source, m.peak_bytes, m.peak_frac, m.limit_bytes) == (None, None, None, 16 * GB)


def test_the_job_memory_is_the_fullest_rank_measured_against_its_own_limit():
    full = job(Rank(0, rss=6 * GB, mem_limit=8 * GB), Rank(1, rss=12 * GB, mem_limit=64 * GB)).view()
    assert full.metrics.memory.rank == 0 and full.metrics.memory.peak_bytes == 6 * GB
    # a rank whose limit is unknown cannot be the fullest while another's share is known
    unknown = job(Rank(0, rss=12 * GB, mem_limit=None), Rank(1, rss=1 * GB, mem_limit=16 * GB)).view()
    assert unknown.metrics.memory.rank == 1
    # no limit anywhere: the most bytes
    bytes_only = job(Rank(0, rss=1 * GB, mem_limit=None), Rank(1, rss=3 * GB, mem_limit=None)).view()
    assert bytes_only.metrics.memory.rank == 1 and bytes_only.metrics.memory.peak_bytes == 3 * GB


# -- collectives -----------------------------------------------------------------------------------
def _comm(t: float, *ops: dict) -> dict:
    return {"k": "comm", "t": t, "ops": list(ops)}


def test_collectives_are_window_deltas_from_the_newest_record_at_or_before_the_window_start():
    """30 steps of 0.1 s from T0: the window (steps 1-29) starts at T0 + 0.1 s."""
    def ar(count):
        return {"op": "all_reduce", "count": count, "bytes": count * 1000, "seconds": count * 0.01,
                "busbytes": count * 1000.0}
    def barrier(count, secs):
        return {"op": "barrier", "count": count, "bytes": 0, "seconds": secs}
    last = _comm(T0 + 2.0, {"op": 5}, ar(60), barrier(7, 0.2),
                 {"op": "broadcast", "count": 2, "bytes": 2000, "seconds": 0.5, "busbytes": 1000.0},
                 {"op": "send", "count": 1, "bytes": 1000},                                   # not timed
                 {"op": "all_gather", "count": 3, "bytes": 3000, "seconds": 0.3, "busbytes": 0.0},
                 {"op": "reduce", "count": 4, "bytes": 4000, "seconds": 0.4})                 # no call since
    comm = [_comm(T0 + 0.05, ar(10), barrier(5, 0.1)),
            _comm(T0 + 0.1, ar(20), barrier(5, 0.1), {"op": "reduce", "count": 4, "bytes": 4000, "seconds": 0.4}),
            _comm(T0 + 1.0, ar(40), barrier(6, 0.15)), last]
    view = job(Rank(0, extra_records=comm), Rank(1, extra_records=comm)).view()
    rows = {r.op: r for r in view.comm_ops}
    assert set(rows) == {"all_reduce", "barrier", "broadcast", "send", "all_gather"}
    a = rows["all_reduce"]                                   # 60 - 20 per rank, two ranks
    assert (a.count, a.bytes, a.ranks) == (80, 80_000, 2) and a.seconds == pytest.approx(0.8)
    assert a.algbw == pytest.approx(1e5) and a.busbw == pytest.approx(1e5)
    b = rows["barrier"]
    assert (b.count, b.bytes, b.algbw, b.busbw) == (4, 0, None, None) and b.seconds == pytest.approx(0.2)
    bc = rows["broadcast"]                                   # first seen in the window: counted in full
    assert (bc.count, bc.bytes) == (4, 4000) and bc.algbw == pytest.approx(4000.0) and bc.busbw == pytest.approx(
        2000.0)
    s = rows["send"]                                         # counted, not timed: no bandwidth
    assert (s.count, s.bytes, s.seconds, s.algbw) == (2, 2000, 0.0, None)
    g = rows["all_gather"]                                   # a one-rank group moves no bus bytes
    assert g.algbw == pytest.approx(10000.0) and g.busbw is None


def test_a_window_inside_one_record_period_counts_the_latest_period():
    def ar(t, count):
        return _comm(t, {"op": "all_reduce", "count": count, "bytes": count, "seconds": count * 0.01})
    model = RunModel(window_steps=10)                        # 30 steps of 0.1 s: the window starts at T0 + 2 s
    both_before = job(Rank(extra_records=[ar(T0 + 0.5, 10), ar(T0 + 1.5, 30)]), model=model).view()
    assert [(r.op, r.count) for r in both_before.comm_ops] == [("all_reduce", 20)]
    model = RunModel(window_steps=10)
    both_inside = job(Rank(extra_records=[ar(T0 + 2.2, 40), ar(T0 + 2.8, 60)]), model=model).view()
    assert [(r.op, r.count) for r in both_inside.comm_ops] == [("all_reduce", 20)]
    only_one = job(Rank(extra_records=[ar(T0 + 2.8, 60)]), model=RunModel(window_steps=10)).view()
    assert [(r.op, r.count) for r in only_one.comm_ops] == [("all_reduce", 60)]


def test_memory_is_reported_while_the_job_is_still_warming_up():
    view = job(Rank(steps=3, rss=4 * GB, mem_limit=16 * GB)).view()
    assert view.warming_up
    assert view.metrics.memory.peak_frac == pytest.approx(0.25) and view.metrics.memory.rank == 0
