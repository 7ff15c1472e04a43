"""The flowchart: every leaf reached from synthetic windows, every threshold on both sides,
missing measurements, hysteresis and warm-up."""

from __future__ import annotations

import dataclasses

import pytest

from perfmon_analysis import flowchart as chart, verdict as V
from perfmon_analysis.losses import by_id
from perfmon_analysis.readings import GpuReading, GpuRow
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.views import JobView, MemoryMetrics
from tests.unit.test_straggler_verdict import STRAGGLER_LEAVES
from tests.unit.verdict_synth import T0, Rank, between, job, records

GB = 1 << 30
PEAK = 100e12


def _oom(rank_start: float = T0) -> dict:
    return {"k": "event", "t": rank_start + 2.95, "name": "oom", "error": "OutOfMemoryError", "message": "CUDA OOM"}


def _mem(t: float, retries: int, reserved: int = 10 * GB) -> dict:
    return {"k": "memory", "t": t, "params": GB, "grads": GB, "optimizer": 2 * GB, "activations": 3 * GB,
            "cache": GB, "fragmentation": GB // 10, "other": GB, "limit": 80 * GB, "peak": reserved,
            "reserved": reserved, "allocated": 9 * GB, "alloc_retries": retries, "ooms": 0}


# (name, ranks, device kwargs, expected bottleneck, expected path)
LEAVES = [
    ("memory: host RSS over 90% of the limit",
     [Rank(rss=int(15 * GB), mem_limit=16 * GB)], {}, "memory", ["memory"]),
    ("memory: an OOM event in the window",
     [Rank(extra_records=[_oom()])], {}, "memory", ["memory"]),
    ("memory: allocator retries rising (device memory records)",
     [Rank(gpu_util=95, flops=50e12 * 0.1,
           extra_records=[_mem(T0 + 1.0, 0), _mem(T0 + 2.0, 3)])], {"device": "cuda", "peak": PEAK},
     "memory", ["memory"]),
    ("data_preprocessing: workers CPU-bound",
     [Rank(data=0.040, loader_workers=2, loader_cpu=0.95)], {}, "data_preprocessing",
     ["memory", "device_busy", "data_wait", "loader_cpu"]),
    ("data_preprocessing: num_workers=0, main thread on CPU during the wait",
     [Rank(data=0.040, data_cpu=0.038, loader_workers=0)], {}, "data_preprocessing",
     ["memory", "device_busy", "data_wait", "loader_cpu"]),
    ("data_loading: workers idle on I/O",
     [Rank(data=0.040, loader_workers=4, loader_cpu=0.03)], {}, "data_loading",
     ["memory", "device_busy", "data_wait", "loader_cpu"]),
    ("data_loading: num_workers=0 blocked in reads",
     [Rank(data=0.040, data_cpu=0.002, loader_workers=0)], {}, "data_loading",
     ["memory", "device_busy", "data_wait", "loader_cpu"]),
    ("communication: every rank blocked in the collective",
     [Rank(0, comm=0.045), Rank(1, comm=0.045)], {}, "communication",
     ["memory", "device_busy", "data_wait", "comm_exposed", "straggler"]),
    ("load_imbalance: rank 1 computes twice as long, rank 0 waits",
     [Rank(0, comm=0.052, exposed=0.050), Rank(1, comm=0.002, exposed=0.0)], {}, "load_imbalance",
     ["memory", "device_busy", "data_wait", "comm_exposed", "straggler"]),
    ("host_sync: GPU idle and every step syncs",
     [Rank(gpu_util=40, syncs=3)], {"device": "cuda"}, "host_sync",
     ["memory", "device_busy", "data_wait", "comm_exposed", "loop", "syncs"]),
    ("host_overhead: GPU idle, no data, comm or syncs, the host 1 ms ahead of a 100 ms step",
     [Rank(gpu_util=40, syncs=0, gpu_time=0.1, lead=0.001)], {"device": "cuda"}, "host_overhead",
     ["memory", "device_busy", "data_wait", "comm_exposed", "loop", "syncs", "host_waiting", "host_ahead"]),
    ("not_measured: GPU idle half of each step although the host keeps steps queued ahead of it",
     [Rank(gpu_util=40, syncs=0, gpu_time=0.05, lead=0.3)], {"device": "cuda"}, "not_measured",
     ["memory", "device_busy", "data_wait", "comm_exposed", "loop", "syncs", "host_waiting", "host_ahead"]),
    ("low_fill: busy in time, the kernels occupy half the SMs",
     [Rank(gpu_util=97, sm_active=0.485)], {"device": "cuda"}, "low_fill", ["memory", "device_busy", "fill"]),
    ("host_wait: the CPU job's training thread off CPU 40% of the step",
     [Rank(cpu=0.06)], {}, "host_wait",
     ["memory", "device_busy", "data_wait", "comm_exposed", "loop", "syncs", "host_waiting"]),
    ("host_wait: the loop waits 30% of each step between steps",
     [Rank(gap=0.03, extra_records=[between(T0, T0 + 3.0, [(33, "waiting", 20, 0)])])], {}, "host_wait",
     ["memory", "device_busy", "data_wait", "comm_exposed", "loop", "loop_waiting"]),
    ("data_preprocessing: the loop builds the next batch between steps, busy, before the step's lines",
     [Rank(gap=0.03, extra_records=[between(T0, T0 + 3.0, [(12, "busy", 20, 18)])])], {}, "data_preprocessing",
     ["memory", "device_busy", "data_wait", "comm_exposed", "loop", "loop_waiting", "loop_feeds"]),
    ("loop_work: the loop busy between steps after the step's lines (logging)",
     [Rank(gap=0.03, extra_records=[between(T0, T0 + 3.0, [(60, "busy", 20, 0)])])], {}, "loop_work",
     ["memory", "device_busy", "data_wait", "comm_exposed", "loop", "loop_waiting", "loop_feeds"]),
    ("compute_efficiency: busy GPU at 10% MFU",
     [Rank(gpu_util=97, flops=PEAK * 0.1 * 0.1)], {"device": "cuda", "peak": PEAK}, "compute_efficiency",
     ["memory", "device_busy", "fill", "mfu"]),
    ("compute_efficiency: MFU unknown, tensor cores idle",
     [Rank(gpu_util=97, tensor_active=0.0)], {"device": "cuda"}, "compute_efficiency",
     ["memory", "device_busy", "fill", "mfu"]),
    ("healthy: busy GPU at 45% MFU, its kernels filling the SMs",
     [Rank(gpu_util=97, sm_active=0.9, flops=PEAK * 0.45 * 0.1)], {"device": "cuda", "peak": PEAK}, "healthy",
     ["memory", "device_busy", "fill", "mfu"]),
    ("healthy: CPU job computing all step",
     [Rank()], {}, "healthy", ["memory", "device_busy", "fill", "mfu"]),
    ("not_measured: CUDA job whose samples carry no utilization, every measured loss small",
     [Rank(flops=PEAK * 0.45 * 0.1)], {"device": "cuda", "peak": PEAK}, "not_measured", ["memory", "device_busy"]),
]


@pytest.mark.parametrize("name,ranks,kw,leaf,path", LEAVES, ids=[x[0].split(":")[0] + "-" + str(i)
                                                                  for i, x in enumerate(LEAVES)])
def test_every_leaf_is_reached(name, ranks, kw, leaf, path):
    v = V.evaluate(job(*ranks, **kw).view())
    assert v.bottleneck == leaf, (name, v.headline, v.path, v.evidence)
    assert v.path == path
    assert v.headline and v.severity in ("ok", "info", "warn", "crit")
    if leaf not in ("healthy",):
        assert v.suggestions


def test_all_leaves_of_the_chart_are_covered_by_the_table():
    leaves = {x for n in V.CHART.questions.values() for x in (n.yes, n.no, n.unmeasured) if x in V.BOTTLENECKS}
    assert leaves == {x[3] for x in LEAVES} | STRAGGLER_LEAVES     # those from operations: test_straggler_verdict
    assert leaves | {"crashed", "warming_up", "stuck"} == set(V.BOTTLENECKS)   # decided before the walk


def test_flowchart_is_well_formed_data():
    ids = list(V.CHART.questions)
    assert len(ids) == len(set(ids)) and V.CHART.root == ids[0]
    for n in V.CHART.questions.values():
        assert n.text.endswith("?") and n.source and n.op in ("<", ">=", ">") and n.short
        for exit_ in (n.yes, n.no, n.unmeasured):
            assert exit_ in V.CHART.questions or exit_ in V.BOTTLENECKS
    # every question is reachable from the root
    seen, todo = set(), [V.CHART.root]
    while todo:
        n = V.CHART.questions[todo.pop()]
        seen.add(n.id)
        todo += [x for x in (n.yes, n.no) if x not in V.BOTTLENECKS and x not in seen]
    assert seen == set(ids)


# -- suggestions and headlines use the job's numbers ------------------------------------------
def test_preprocessing_suggestion_names_the_worker_count():
    v = V.evaluate(job(Rank(data=0.040, loader_workers=2, loader_cpu=0.95)).view())
    assert "raise num_workers from 2" in v.suggestions[0]
    assert "40%" in v.headline and "2 workers" in v.headline


def test_communication_headline_quotes_exposed_share_and_busbw():
    comm = [{"k": "comm", "t": T0 + 0.5, "backend": "gloo", "world_size": 2,
             "ops": [{"op": "all_reduce", "count": 5, "bytes": 5 * (8 << 20), "seconds": 0.25,
                      "busbytes": 5.0 * (8 << 20)}]},
            {"k": "comm", "t": T0 + 2.95, "backend": "gloo", "world_size": 2,
             "ops": [{"op": "all_reduce", "count": 30, "bytes": 30 * (8 << 20), "seconds": 1.5,
                      "busbytes": 30.0 * (8 << 20)}]}]
    model = job(Rank(0, comm=0.045, extra_records=comm), Rank(1, comm=0.045))
    v = V.evaluate(model.view())
    assert v.bottleneck == "communication"
    # no comm record before the window: all 30 calls of 8 MiB in 1.5 s; factor 2(n-1)/n = 1 for n=2
    assert "exposed all-reduce is 45% of the step at 168MB/s busbw" in v.headline
    assert v.evidence["busbw"] == pytest.approx(30 * (8 << 20) / 1.5, rel=1e-3)


def test_load_imbalance_names_the_slow_rank_and_only_it():
    model = job(Rank(0, comm=0.052, exposed=0.050), Rank(1, comm=0.002, exposed=0.0),
                Rank(2, comm=0.051, exposed=0.049))
    view = model.view()
    v = V.evaluate(view)
    assert v.bottleneck == "load_imbalance" and v.straggler_rank == 1
    assert "rank 1" in v.headline and v.evidence["compute_ratio"] == pytest.approx(0.5, abs=0.02)
    assert [r.rank for r in view.ranks if r.rank == view.straggler_rank] == [1]


def test_data_wait_on_one_rank_counts_for_the_job():
    """One starving rank stalls the others in the collective: the job metric is the worst rank."""
    model = job(Rank(0, comm=0.04, exposed=0.04, loader_workers=2, loader_cpu=0.02),
                Rank(1, data=0.04, comm=0.0, exposed=0.0, loader_workers=2, loader_cpu=0.02))
    v = V.evaluate(model.view())
    assert v.bottleneck == "data_loading"


# -- threshold edges: both sides of every threshold --------------------------------------------
def _base_view(**metrics) -> JobView:
    view = job(Rank(gpu_util=97, flops=PEAK * 0.5 * 0.1), device="cuda", peak=PEAK).view()
    return dataclasses.replace(view, metrics=dataclasses.replace(view.metrics, **metrics))


def _idle(**metrics) -> JobView:
    """Device 50% busy from an unnamed source: the gate is open, and idle with no other cause is unknown
    (so the data and comm questions are tested on their own thresholds); the host stays 1 ms ahead of a
    100 ms step on the device, too little to hide the idle."""
    base = dict(device_busy=0.5, device_busy_source=None, data_wait_frac=0.0, comm_exposed_frac=0.0,
                syncs_per_step=0.0, mfu=0.5, host_lead_s=0.001, host_lead_steps=0.01, host_queued_whole_frac=0.0,
                device_time_median_s=0.1)
    base.update(metrics)
    return _base_view(**base)


def _comm(**metrics):
    """Waiting for peers: NCCL's kernels keep NVML's busy high while the step waits, so the device reads 90% busy."""
    return _idle(**{"device_busy": 0.9, **metrics})


EPS = 1e-9
EDGES = [
    # (name, view factory at value, value that fires, value that does not, leaf when fired, leaf when not)
    ("memory", lambda x: _base_view(memory=MemoryMetrics(source="device", peak_frac=x, peak_bytes=1, limit_bytes=1)),
     chart.MEMORY_PEAK_MAX + EPS, chart.MEMORY_PEAK_MAX, "memory", "healthy"),
    ("device_busy", lambda x: _idle(device_busy=x), chart.DEVICE_BUSY_MIN - EPS, chart.DEVICE_BUSY_MIN,
     "host_overhead", "healthy"),
    ("data_wait", lambda x: _idle(data_wait_frac=x, loader_cpu=0.0, loader_workers=2), chart.DATA_WAIT_MIN,
     chart.DATA_WAIT_MIN - EPS, "data_loading", "host_overhead"),
    ("loader_cpu", lambda x: _idle(data_wait_frac=0.2, loader_cpu=x, loader_workers=2), chart.LOADER_CPU_BOUND,
     chart.LOADER_CPU_BOUND - EPS, "data_preprocessing", "data_loading"),
    ("data_cpu (num_workers=0)", lambda x: _idle(data_wait_frac=0.2, data_cpu_frac=x, loader_workers=0),
     chart.LOADER_CPU_BOUND, chart.LOADER_CPU_BOUND - EPS, "data_preprocessing", "data_loading"),
    # the device is 90% busy: an exposed share under 10% does not open the gate at all
    ("comm_exposed", lambda x: _comm(comm_exposed_frac=x, compute_ratio=1.0), chart.COMM_EXPOSED_MIN,
     chart.COMM_EXPOSED_MIN - EPS, "communication", "healthy"),
    ("straggler", lambda x: _comm(comm_exposed_frac=0.3, compute_ratio=x), chart.STRAGGLER_RATIO_MAX - EPS,
     chart.STRAGGLER_RATIO_MAX, "load_imbalance", "communication"),
    ("host_sync", lambda x: _idle(syncs_per_step=x, device_busy_source="nvml_util"), chart.SYNCS_PER_STEP_MIN,
     chart.SYNCS_PER_STEP_MIN - EPS,
     "host_sync", "host_overhead"),
    ("mfu", lambda x: _base_view(mfu=x), chart.MFU_MIN - EPS, chart.MFU_MIN, "compute_efficiency", "healthy"),
    ("fill", lambda x: _base_view(device_fill=x, sm_active=0.97 * x), chart.FILL_MIN - EPS, chart.FILL_MIN,
     "low_fill", "healthy"),
    # the device idles 50% in time: the host is blamed only while it queued most steps before the device began them
    ("host_ahead", lambda x: _idle(device_busy_source="nvml_util", host_queued_whole_frac=x), chart.HOST_AHEAD_SHARE,
     chart.HOST_AHEAD_SHARE - EPS, "not_measured", "host_overhead"),
]


@pytest.mark.parametrize("name,make,fires,holds,yes_leaf,no_leaf", EDGES, ids=[e[0] for e in EDGES])
def test_threshold_edges(name, make, fires, holds, yes_leaf, no_leaf):
    assert V.evaluate(make(fires)).bottleneck == yes_leaf
    assert V.evaluate(make(holds)).bottleneck == no_leaf


def test_ettr_edge_for_step_gaps():
    assert "step_gaps" in [f["id"] for f in V.evaluate(_base_view(ettr=chart.ETTR_MIN - EPS)).findings]
    assert "step_gaps" not in [f["id"] for f in V.evaluate(_base_view(ettr=chart.ETTR_MIN)).findings]


def test_time_between_steps_on_every_step_is_the_loops_loss_not_a_pause():
    """The window's time between steps is the loop's work and its pauses together: only the pauses (ETTR,
    over the run) make the step_gaps finding; the loop's share is judged as a loss of its own."""
    held = V.evaluate(_base_view(ettr=0.97, gap_frac=0.5, loop_frac=0.47, pause_frac=0.03))
    assert "step_gaps" not in [f["id"] for f in held.findings]
    assert held.bottleneck == "loop_work" and "47% of each step" in held.headline


def test_low_fill_is_a_warning_under_half_the_sms_as_nvidia_calls_that_likely_ineffective():
    assert V.evaluate(_base_view(device_fill=chart.FILL_CRIT - EPS)).severity == "warn"
    assert V.evaluate(_base_view(device_fill=chart.FILL_CRIT)).severity == "info"


def test_device_busy_crit_edge():
    assert V.evaluate(_idle(device_busy=chart.DEVICE_BUSY_CRIT - EPS)).severity == "crit"
    assert V.evaluate(_idle(device_busy=chart.DEVICE_BUSY_CRIT)).severity == "warn"


def test_every_threshold_is_a_named_constant_with_a_source():
    # each node's threshold is the number docs/verdict.md gives, compared the way it says,
    # and names where it comes from
    documented = {"memory": (">", 0.90), "device_busy": ("<", 0.70), "data_wait": (">=", 0.05),
                  "loader_cpu": (">=", 0.30), "comm_exposed": (">=", 0.10), "straggler": ("<", 0.7),
                  "loop": (">=", 0.10), "loop_waiting": (">=", 0.50), "loop_feeds": (">=", 0.50),
                  "syncs": (">=", 1.0), "host_waiting": (">=", 0.50), "host_ahead": (">=", 0.5),
                  "fill": ("<", 0.80), "mfu": ("<", 0.30),
                  "worker_slow": (">=", 0.50), "rotating": (">=", 0.50), "stage_heavy": (">=", 1.10)}
    assert {n.id: (n.op, n.threshold) for n in V.CHART.questions.values()} == documented
    assert all(len(n.source) > 10 for n in V.CHART.questions.values())
    assert (chart.ETTR_MIN, chart.DEVICE_BUSY_CRIT, chart.FRAGMENTATION_MAX) == (0.90, 0.50, 0.20)


# -- missing measurements never crash and never pick an unsupported branch ---------------------
def test_cpu_job_skips_host_sync_and_mfu_with_a_reason():
    model = job(Rank(dur=0.1, comm=None), Rank(1, comm=None))   # two ranks, comm not measured
    v = V.evaluate(model.view())
    skipped = v.evidence["skipped"]
    assert "CPU job" in skipped["mfu"]
    assert v.bottleneck == "healthy"


def test_cpu_idle_passes_the_host_sync_node_as_not_applying():
    v = V.evaluate(dataclasses.replace(_idle(), device_type="cpu"))
    assert v.path[-3:] == ["syncs", "host_waiting", "host_ahead"] and "CPU job" in v.evidence["skipped"]["syncs"]
    assert "syncs" not in v.undecided and "host_waiting" in v.undecided    # no thread CPU time to tell
    assert "host_ahead" not in v.undecided and "CPU job" in v.evidence["skipped"]["host_ahead"]
    assert v.bottleneck == "host_overhead"


def test_unknown_comm_on_multirank_does_not_claim_communication_or_imbalance():
    view = _idle(comm_exposed_frac=None, compute_ratio=None)
    v = V.evaluate(view)
    assert v.bottleneck not in ("communication", "load_imbalance")
    assert "comm_exposed" in v.evidence["skipped"]


def test_single_rank_exposed_comm_is_communication_not_imbalance():
    v = V.evaluate(_comm(comm_exposed_frac=0.3, compute_ratio=None))
    assert v.bottleneck == "communication" and "straggler" in v.evidence["skipped"]


def test_unknown_loader_cpu_reports_data_loading_and_says_why():
    v = V.evaluate(_idle(data_wait_frac=0.3, loader_cpu=None, loader_workers=None, data_cpu_frac=None))
    assert v.bottleneck == "data_loading"
    assert "cannot tell" in v.evidence["skipped"]["loader_cpu"] and "not measured" in v.headline


def test_unknown_data_wait_is_skipped():
    v = V.evaluate(_idle(data_wait_frac=None))
    assert "data_wait" in v.evidence["skipped"] and v.bottleneck == "host_overhead"


def test_gpu_without_mfu_or_tensor_counters_is_healthy_with_reason():
    v = V.evaluate(_base_view(mfu=None))
    assert v.bottleneck == "healthy" and "MFU unknown" in v.evidence["skipped"]["mfu"]


@pytest.mark.parametrize("records", [
    [],
    [{"k": "hello", "t": T0, "proto": [1, 0]}],
    [{"k": "hello", "t": T0, "proto": [1, 0], "rank": 0}] +
    [{"k": "step", "t": T0 + i, "step": i, "dur": 1.0} for i in range(10)],
    [{"k": "hello", "t": T0, "proto": [1, 0], "rank": 0, "device": {"type": "cuda"}}] +
    [{"k": "step", "t": T0 + i, "step": i, "dur": 1.0, "phases": {"data": "x"}, "comm": {"seconds": None},
      "samples": "many", "mem": {"peak": "?"}} for i in range(10)] +
    [{"k": "sample", "t": T0 + 3, "gpus": [{"util": None}, "junk"], "host": {"loader_cpu": "hot"}},
     {"k": "memory", "t": T0 + 4, "limit": 0, "peak": None}, {"k": "comm", "t": T0 + 5, "ops": [None, {"op": 3}]},
     {"k": "drops", "t": T0 + 6, "count": 7}, {"k": "event", "t": T0 + 7, "name": "checkpoint", "seconds": "long"}],
    [{"k": "step", "t": T0, "step": 0, "dur": 0.1}],   # before any hello
], ids=["empty", "hello-only", "bare-steps", "garbage-values", "orphan"])
def test_missing_or_odd_fields_never_crash(records):
    model = RunModel()
    for rec in records:
        model.ingest("s", rec)
    view = model.view()
    v = V.evaluate(view)
    assert v.bottleneck in V.BOTTLENECKS


def test_bare_steps_are_healthy_on_cpu_with_skips_listed():
    model = RunModel()
    model.ingest("s", {"k": "hello", "t": T0, "proto": [1, 0], "rank": 0})
    for i in range(10):
        model.ingest("s", {"k": "step", "t": T0 + i + 1, "step": i, "dur": 1.0})
    v = V.evaluate(model.view())
    assert v.bottleneck == "healthy"
    assert {"memory", "mfu"} <= set(v.evidence["skipped"])


# -- warming up and hysteresis -----------------------------------------------------------------
def test_warming_up_until_five_steps():
    assert V.evaluate(job(Rank(steps=5)).view()).bottleneck == "warming_up"   # step 0 is left out
    assert V.evaluate(job(Rank(steps=6)).view()).bottleneck == "healthy"


def _views(*leaves: str) -> list[JobView]:
    make = {"healthy": lambda: _base_view(),
            "data": lambda: _idle(data_wait_frac=0.3, loader_cpu=0.0, loader_workers=2),
            "comm": lambda: _comm(comm_exposed_frac=0.3, compute_ratio=1.0)}
    return [make[x]() for x in leaves]


def test_hysteresis_needs_two_agreeing_evaluations():
    tracker = V.VerdictTracker()
    shown = [tracker.update(v).bottleneck for v in _views("healthy", "healthy", "data", "healthy", "data", "data",
                                                          "comm", "data", "comm", "comm")]
    assert shown == ["warming_up", "healthy", "healthy", "healthy", "healthy", "data_loading",
                     "data_loading", "data_loading", "data_loading", "communication"]


def test_tracker_marks_a_pending_change_and_refreshes_numbers_of_the_same_verdict():
    tracker = V.VerdictTracker()
    tracker.update(_base_view())
    tracker.update(_base_view())
    held = tracker.update(_idle(data_wait_frac=0.3, loader_cpu=0.0, loader_workers=2))
    assert held.bottleneck == "healthy" and held.pending == "data_loading"
    d1 = tracker.update(_idle(data_wait_frac=0.3, loader_cpu=0.0, loader_workers=2))
    d2 = tracker.update(_idle(data_wait_frac=0.4, loader_cpu=0.0, loader_workers=2))
    assert d1.evidence["data_wait_frac"] == 0.3 and d2.evidence["data_wait_frac"] == 0.4 and d2.pending is None


def test_tracker_starts_from_warming_up_without_delay():
    tracker = V.VerdictTracker()
    assert tracker.update(job(Rank(steps=2)).view()).bottleneck == "warming_up"


# -- findings ----------------------------------------------------------------------------------
def test_step_gaps_finding_from_checkpoint_pauses():
    """A checkpoint of one step's length every 5 steps: a pause, not the loop's work, so the steps are
    healthy and ETTR (5 steps of 6 step-lengths) is the finding; a checkpoint every 5 steps stays a pause."""
    v = V.evaluate(job(Rank(steps=30, dur=0.1, pause=0.1, pause_every=5)).view())
    assert v.bottleneck == "healthy" and v.severity == "warn"
    gaps = [f for f in v.findings if f["id"] == "step_gaps"]
    assert gaps and gaps[0]["ettr"] == pytest.approx(5 / 6, abs=0.01)
    assert by_id(v.losses)["loop"].share == pytest.approx(0.0, abs=0.001)
    assert by_id(v.losses)["step_gaps"].share == pytest.approx(1 - gaps[0]["ettr"], abs=0.001)


def test_throttling_and_fragmentation_findings():
    mem = _mem(T0 + 2.0, 0, reserved=10 * GB)
    mem["fragmentation"] = 3 * GB
    v = V.evaluate(job(Rank(gpu_util=97, throttle=["sw_power_cap"], extra_records=[mem]), device="cuda").view())
    ids = {f["id"] for f in v.findings}
    assert {"throttling", "fragmentation"} <= ids
    v2 = V.evaluate(job(Rank(gpu_util=97, throttle=["idle", "app_clocks"]), device="cuda").view())
    assert "throttling" not in {f["id"] for f in v2.findings}


def test_comm_time_known_but_exposed_part_unknown_is_skipped_with_that_reason():
    v = V.evaluate(_idle(comm_exposed_frac=None, comm_frac=0.4))
    assert "exposed part is not measured" in v.evidence["skipped"]["comm_exposed"]
    assert v.bottleneck not in ("communication", "load_imbalance")


def test_finding_ids_are_from_the_documented_list():
    from tests.unit.verdict_synth import records
    mem = _mem(T0 + 12.0, 0, reserved=10 * GB)
    mem["fragmentation"] = 3 * GB
    model = job(Rank(gpu_util=97), device="cuda")
    restarted = Rank(0, pid=999, restart=1, start=T0 + 10, gpu_util=97, pause=0.15, pause_every=5,
                     throttle=["hw_slowdown"],
                     probe_step_s=0.005,
                     extra_records=[mem, {"k": "drops", "t": T0 + 12, "count": 3},
                                    {"k": "event", "t": T0 + 12, "name": "warning", "source": "perfmon",
                                     "where": "NVML", "count": 4, "message": "perfmon NVML error"},
                                    {"k": "where", "t": T0 + 12, "t0": T0 + 10, "t1": T0 + 12, "samples": 40,
                                     "lines": [], "other": 40, "runq": 0.3}])
    for rec in records(restarted, world=1, device="cuda"):
        model.ingest("restarted", rec)
    ids = [f["id"] for f in V.evaluate(model.view()).findings]
    # the loss findings: below; the run's (memory growth, outliers) need a run of their own: test_health.py;
    # the accounting problem: test_losses_that_add_up_past_the_whole_are_a_finding_never_clamped
    assert sorted(ids) == sorted(set(chart.FINDINGS) - set(chart.LOSS_THRESHOLD) -
                                 {"memory_growth", "step_outliers", "accounting"})

def test_the_loops_wait_between_steps_is_read_from_its_cpu_clock_with_queued_time_neither_wait_nor_work():
    """20 ms between every two steps, 4 ms of it on CPU: the loop waits 80% of its work (host_wait, naming
    the loop's loss); with 18 ms on CPU it works (loop_work). Time runnable without a core (the between-step
    samples' run-queue share) counts as neither."""
    waits = V.evaluate(job(Rank(gap=0.02, gap_cpu=0.004)).view())
    assert (waits.bottleneck, waits.loss) == ("host_wait", "loop")
    assert waits.answers["loop_waiting"].value == pytest.approx(0.8)
    assert "waits between steps" in waits.headline and "no stack samples say where" in waits.headline
    works = V.evaluate(job(Rank(gap=0.02, gap_cpu=0.018)).view())
    assert (works.bottleneck, works.loss) == ("loop_work", "loop")
    queued = between(T0, T0 + 3.0, [(60, "busy", 10, 0)])
    queued["between_runq"] = 0.3              # off CPU: 20 ms x 0.7 - 4 ms = 10 ms, against 4 ms on it
    v = V.evaluate(job(Rank(gap=0.02, gap_cpu=0.004, extra_records=[queued])).view())
    assert v.answers["loop_waiting"].value == pytest.approx(10 / 14)


def test_losses_that_add_up_past_the_whole_are_a_finding_never_clamped():
    """Two losses that count the same time (a probe that charged a collective to the data wait too): the
    accounting says so instead of hiding it; 2% over is rounding and sampling, not a problem."""
    over = V.evaluate(_base_view(data_wait_frac=0.6, comm_exposed_frac=0.5, device_busy=0.5))
    found = [f for f in over.findings if f["id"] == "accounting"]
    assert found and found[0]["over"] == pytest.approx(0.1 + by_id(over.losses)["device_idle"].share, abs=0.001)
    assert found[0]["message"] == ("the measured losses add up to 110% of the step (data wait 60%, exposed "
                                   "communication 50%): two of them count the same time; their shares are not to be "
                                   "trusted")
    assert by_id(over.losses)["data_wait"].share == 0.6
    # the loss the outcome does not name is a finding of its own, with its share and how it was measured
    assert [f for f in over.findings if f["id"] == "comm_exposed"] == [
        {"id": "comm_exposed", "share": 0.5, "source": "time blocked in collectives",
         "message": "exposed communication also takes 50% of each step"}]
    near = V.evaluate(_base_view(data_wait_frac=0.51, comm_exposed_frac=0.5, device_busy=0.5))
    assert "accounting" not in near.finding_ids


# -- straggler by late arrival (equal compute, time lost outside the step) -----------------------
def test_rank_that_arrives_last_is_the_straggler_even_with_equal_compute():
    model = job(Rank(0, comm=0.045, exposed=0.045), Rank(1, comm=0.0, exposed=0.0, gap=0.045),
                Rank(2, comm=0.045, exposed=0.045))
    view = model.view()
    assert view.metrics.compute_ratio == pytest.approx(1.0, abs=0.01)
    v = V.evaluate(view)
    assert v.bottleneck == "load_imbalance" and v.straggler_rank == 1
    assert view.metrics.straggler_by == "arrival" and "rank 1 arrives last" in v.headline


@pytest.mark.parametrize("late,fires", [(0.055 / 0.7 - 1e-5, False), (0.055 / 0.7 + 1e-5, True)])
def test_arrival_rule_edge(late, fires):
    """Rank 1 computes like the others (55 ms) but reaches the collective ``late`` s into the step;
    the others (55 ms to arrive) wait for it. Fires when 0.055 / late < 0.7."""
    step = late
    wait = step - 0.055
    ranks = [Rank(0, dur=step, comm=wait, exposed=wait), Rank(1, dur=step, comm=0.0, exposed=0.0, gap=wait),
             Rank(2, dur=step, comm=wait, exposed=wait)]
    view = job(*ranks).view()
    assert view.metrics.compute_ratio == pytest.approx(1.0, abs=1e-6)
    assert (view.straggler_rank == 1) is fires, view.metrics.arrival_ratio
    assert (V.evaluate(view).bottleneck == "load_imbalance") is fires


# -- what each node records: the measured value, or why it could not ask (mutation testing) ----
# quantity each node puts in the evidence -> how to read it from the metrics
_MEASURED = {
    "memory_peak_frac": lambda m: m.memory.peak_frac, "device_busy": lambda m: m.device_busy,
    "data_wait_frac": lambda m: m.data_wait_frac, "comm_exposed_frac": lambda m: m.comm_exposed_frac,
    "compute_ratio": lambda m: m.compute_ratio, "syncs_per_step": lambda m: m.syncs_per_step, "mfu": lambda m: m.mfu,
}


@pytest.mark.parametrize("name,ranks,kw,leaf,path", LEAVES, ids=[x[0].split(":")[0] + "-" + str(i)
                                                                  for i, x in enumerate(LEAVES)])
def test_every_answered_node_puts_its_measured_value_in_the_evidence(name, ranks, kw, leaf, path):
    view = job(*ranks, **kw).view()
    _, walked, evidence = V.walk(view)
    skipped = evidence.get("skipped", {})
    for node_id in walked:
        node = V.CHART.questions[node_id]
        if node_id in skipped:
            assert node.quantity not in evidence, node_id
            continue
        if node.quantity in _MEASURED and _MEASURED[node.quantity](view.metrics) is not None:
            assert evidence[node.quantity] == pytest.approx(_MEASURED[node.quantity](view.metrics), abs=1e-4), node_id
        else:
            assert evidence[node.quantity] is not None, node_id


@pytest.mark.parametrize("view,node,reason", [
    (lambda: _base_view(memory=MemoryMetrics()), "memory", "memory limit or peak not reported"),
    (lambda: _base_view(device_busy=None, data_wait_frac=None, comm_exposed_frac=None), "device_busy",
     "CUDA busy not measured (no GPU utilization samples for this job's GPU)"),
    (lambda: _idle(data_wait_frac=None), "data_wait", "loader wait not measured (wrap the loader: mon.loader(...))"),
    (lambda: _idle(data_wait_frac=0.2, loader_workers=None, loader_cpu=None, data_cpu_frac=None), "loader_cpu",
     "loader CPU not measured: cannot tell preprocessing from I/O"),
    (lambda: _idle(data_wait_frac=0.2, loader_workers=3, loader_cpu=None), "loader_cpu",
     "loader worker CPU not measured: cannot tell preprocessing from I/O"),
    (lambda: _idle(comm_exposed_frac=None, comm_frac=None), "comm_exposed",
     "collectives not measured (mon.watch(model=ddp_model) measures them)"),
    (lambda: _idle(comm_exposed_frac=None, comm_frac=0.25), "comm_exposed",
     "communication takes 25% of the step but its exposed part is not measured (NCCL: PERFMON_NCCL_TIMING=1)"),
    (lambda: _comm(comm_exposed_frac=0.3, compute_ratio=None), "straggler", "one rank: there is no peer to wait for"),
    (lambda: dataclasses.replace(_comm(comm_exposed_frac=0.3, compute_ratio=None), world_size=4), "straggler",
     "needs compute time of two or more ranks"),
    (lambda: _idle(syncs_per_step=None, device_busy_source="nvml_util"), "syncs",
     "syncs not counted (opt-in: watch(syncs=True) or PERFMON_SYNCS=1)"),
    (lambda: dataclasses.replace(_idle(), device_type="cpu"), "syncs", "CPU job: there is no host-device sync to find"),
    (lambda: _base_view(mfu=None), "mfu", "MFU unknown: pass flops= to mon.step() or mon.watch(model=...)"),
    (lambda: dataclasses.replace(_base_view(mfu=None), device_type="cpu"), "mfu",
     "CPU job: no peak FLOP/s known (set PERFMON_PEAK_TFLOPS for an MFU)"),
])
def test_a_question_that_cannot_be_asked_says_why_and_goes_where_unmeasured_says(view, node, reason):
    v = view()
    leaf, walked, evidence = V.walk(v)
    assert evidence["skipped"][node] == reason and node not in {k for k in evidence if k != "skipped"}
    i = walked.index(node)
    assert (walked[i + 1] if i + 1 < len(walked) else leaf) == V.CHART.questions[node].unmeasured


def test_an_unmeasured_gate_never_takes_an_exit():
    """Busy unknown and every measured loss small (a single rank's communication is a measured 0):
    neither "starved" nor "not starved" can be said, so the walk stops at ``not_measured``."""
    leaf, walked, evidence = V.walk(_idle(device_busy=None, device_busy_source=None, comm_exposed_frac=0.0))
    assert (leaf, walked) == ("not_measured", ["memory", "device_busy"])
    assert evidence["skipped"]["device_busy"].startswith("CUDA busy not measured")
    # one measured loss of 10% answers the gate without busy
    leaf, walked, _ = V.walk(_idle(device_busy=None, device_busy_source=None, data_wait_frac=0.2,
                                   loader_workers=2, loader_cpu=0.9))
    assert leaf == "data_preprocessing" and walked[1] == "device_busy"


def test_loader_question_uses_worker_cpu_or_with_no_workers_the_main_process_share():
    # workers counted but their CPU unknown is a skip; workers unknown but their CPU known is an answer
    _, _, ev = V.walk(_idle(data_wait_frac=0.2, loader_workers=None, loader_cpu=0.9))
    assert ev["loader_cpu"] == 0.9 and "loader_cpu" not in ev.get("skipped", {})
    _, _, ev = V.walk(_idle(data_wait_frac=0.2, loader_workers=0, loader_cpu=0.9, data_cpu_frac=0.1))
    assert ev["loader_cpu"] == 0.1
    assert ev["notes"]["loader_cpu"] == "num_workers=0: main-process CPU share of the data wait"
    _, _, ev = V.walk(_idle(data_wait_frac=0.2, loader_workers=4, loader_cpu=0.5))
    assert ev["notes"]["loader_cpu"] == "4 workers"


def test_notes_say_where_an_answer_came_from():
    _, _, ev = V.walk(_idle(device_busy=0.5, device_busy_source="nvml_util"))
    assert ev["notes"]["device_busy"] == "nvml_util"
    _, _, ev = V.walk(_comm(comm_exposed_frac=0.3, device_busy=0.9))
    assert ev["notes"]["device_busy"] == "exposed communication is 30% of the step (>= 10%)"
    _, _, ev = V.walk(_comm(comm_exposed_frac=0.3, compute_ratio=0.9, comm_estimated=True))
    assert ev["comm_exposed_frac"] == 0.3 and ev["notes"]["comm_exposed"] == "estimated"
    _, _, ev = V.walk(_comm(comm_exposed_frac=0.3, compute_ratio=0.9, comm_estimated=False))
    assert "comm_exposed" not in ev.get("notes", {})
    _, _, ev = V.walk(_idle(device_busy=0.5, device_busy_source=None))
    assert "device_busy" not in ev.get("notes", {}) and ev["device_busy"] == 0.5
    _, _, ev = V.walk(_idle(syncs_per_step=2.0, device_busy_source="nvml_util"))
    assert ev["syncs_per_step"] == 2.0


def test_memory_answers_carry_the_peak_share_and_the_reason():
    mem = MemoryMetrics(source="device", peak_frac=0.5, peak_bytes=1, limit_bytes=2, ooms=2)
    _, _, ev = V.walk(_base_view(memory=mem))
    assert ev["memory_peak_frac"] == 0.5 and ev["notes"]["memory"] == "2 out-of-memory error(s) in the window"
    mem = MemoryMetrics(source="device", peak_frac=0.4, alloc_retries=7, alloc_retries_rising=True)
    _, _, ev = V.walk(_base_view(memory=mem))
    assert ev["memory_peak_frac"] == 0.4 and ev["notes"]["memory"] == "allocator retries rising (7 so far)"


def test_arrival_straggler_answer_names_the_late_rank():
    view = dataclasses.replace(_comm(comm_exposed_frac=0.3, compute_ratio=0.95, straggler_by="arrival",
                                     arrival_ratio=0.5), straggler_rank=1)
    leaf, _, ev = V.walk(view)
    assert leaf == "load_imbalance" and ev["compute_ratio"] == 0.95
    assert ev["notes"]["straggler"] == "compute is even, but rank 1 reaches the collective last (arrival ratio 0.50)"


def test_tensor_core_answer_when_mfu_is_unknown():
    view = job(Rank(gpu_util=97, tensor_active=0.005), device="cuda").view()
    leaf, _, ev = V.walk(view)
    assert leaf == "compute_efficiency" and ev["mfu"] == 0.005
    assert ev["notes"]["mfu"] == "tensor-core activity (MFU unknown)"
    at_edge = job(Rank(gpu_util=97, tensor_active=chart.TENSOR_ACTIVE_MIN), device="cuda").view()
    assert V.walk(at_edge)[0] == "healthy"
    two = dataclasses.replace(view, gpus=(GpuRow(0, GpuReading(0, 0.97, tensor_active=0.2), ()),
                                          GpuRow(1, GpuReading(1, 0.97, tensor_active=0.4), ())))
    assert V.walk(two)[2]["mfu"] == pytest.approx(0.3)


# -- the path as the panes draw it, the report's verdict object -------------------------------------
def test_path_steps_give_each_questions_measured_value_and_the_exit_taken():
    io_bound = V.evaluate(job(Rank(dur=0.1, data=0.04, loader_workers=2, loader_cpu=0.05)).view())
    assert io_bound.bottleneck == "data_loading"
    assert [(s.question.id, s.value, s.answer) for s in io_bound.steps()] == [
        ("memory", pytest.approx(0.0625), "no"), ("device_busy", pytest.approx(0.6), "yes"),
        ("data_wait", pytest.approx(0.4), "yes"), ("loader_cpu", pytest.approx(0.05), "no")]
    cpu_bound = V.evaluate(job(Rank(dur=0.1, data=0.04, loader_workers=2, loader_cpu=0.5)).view())
    assert cpu_bound.bottleneck == "data_preprocessing"
    assert [(s.question.id, s.answer) for s in cpu_bound.steps()][-1] == ("loader_cpu", "yes")


def test_a_question_not_asked_is_a_step_without_value_or_exit_and_the_reports_unknown_says_why():
    v = V.evaluate(job(Rank(dur=0.1, data=0.04, rss=None)).view())       # no memory figure, no loader CPU
    assert [(s.question.id, s.value, s.answer) for s in v.steps()] == [
        ("memory", None, None), ("device_busy", pytest.approx(0.6), "yes"), ("data_wait", pytest.approx(0.4), "yes"),
        ("loader_cpu", None, None)]
    out = v.as_json()
    assert out["unknown"] == {"memory_peak_frac": "memory limit or peak not reported",
                              "loader_cpu": "loader CPU not measured: cannot tell preprocessing from I/O"}
    assert out["stuck"] is None


def test_a_second_rank_still_warming_up_leaves_the_straggler_question_undecided_a_single_rank_does_not():
    two = V.evaluate(job(Rank(0, dur=0.1, comm=0.03), Rank(1, steps=3, dur=0.1, comm=0.03)).view())
    assert two.bottleneck == "communication"
    assert two.evidence["undecided"] == {"straggler": "needs compute time of two or more ranks"}
    assert two.headline.endswith("; cannot tell a slow rank from slow communication (needs compute time of two "
                                 "or more ranks)")
    one = V.evaluate(job(Rank(0, dur=0.1, comm=0.03)).view())
    assert one.bottleneck == "communication" and "undecided" not in one.evidence
    assert one.headline == "Communication: exposed collective is 30% of the step"


def test_the_mfu_question_notes_the_peak_it_divided_by():
    v = V.evaluate(job(Rank(dur=0.1, flops=5e12, gpu_util=95), device="cuda", peak=100e12).view())
    assert v.bottleneck == "healthy"
    assert v.evidence["notes"]["mfu"] == "of a 100TFLOP/s peak (device table, bf16)"


def test_walk_on_its_own_accounts_the_losses_of_the_views_device():
    # busy over 70% but idle 25%: the loss opens the gate; the host 2 ms ahead of a 100 ms step
    view = job(Rank(dur=0.1, gpu_util=75, gpu_time=0.1, lead=0.002), device="cuda").view()
    leaf, path, _ = V.walk(view)
    assert (leaf, path) == (V.evaluate(view).bottleneck, V.evaluate(view).path) == (
        "host_overhead", ["memory", "device_busy", "data_wait", "comm_exposed", "loop", "syncs", "host_waiting",
                          "host_ahead"])


def test_a_warming_up_verdict_still_carries_the_loss_accounting():
    v = V.evaluate(job(Rank(steps=3)).view())
    assert v.bottleneck == "warming_up"
    assert [x["id"] for x in v.as_json()["losses"]] == ["data_wait", "comm_exposed", "device_idle", "loop", "step_gaps"]


def test_one_ranks_recording_of_a_two_rank_job_leaves_the_straggler_question_undecided():
    """``perfmon report`` on rank 0's file alone: the job had a peer, its compute time is just not here."""
    model = RunModel()
    for rec in records(Rank(0, dur=0.1, comm=0.03), world=2):
        model.ingest("r0", rec)
    v = V.evaluate(model.view())
    assert v.bottleneck == "communication"
    assert v.evidence["undecided"] == {"straggler": "needs compute time of two or more ranks"}


def test_a_stuck_verdict_keeps_the_findings_and_the_loss_accounting():
    from tests.unit.test_stuck import SLEEPER, WAITER, two_ranks
    view = dataclasses.replace(two_ranks([WAITER], [SLEEPER]).view(), drops_total=4)
    v = V.evaluate(view)
    assert v.bottleneck == "stuck" and "drops" in v.finding_ids
    assert [x["id"] for x in v.as_json()["losses"]] == ["data_wait", "comm_exposed", "device_idle", "loop", "step_gaps"]


def test_every_question_is_answered_once_on_the_path_or_not_and_the_walk_follows_those_answers():
    v = V.evaluate(job(Rank(dur=0.1, data=0.04, loader_workers=2, loader_cpu=0.05)).view())
    assert set(v.answers) == set(V.CHART.questions)
    assert v.steps() == [v.answers[n] for n in v.path]
    for step, nxt in zip(v.steps(), v.path[1:] + [v.bottleneck]):
        assert nxt == (step.question.yes if step.answer == "yes" else step.question.no)
    off = v.answers["comm_exposed"]       # off the path: still judged, by the same rule
    assert "comm_exposed" not in v.path and (off.answer, off.value) == ("no", 0.0)
    assert v.answers["mfu"].answer is None and v.answers["mfu"].reason.startswith("CPU job: no peak FLOP/s")


def test_a_stuck_or_warming_up_verdict_still_carries_every_answer():
    warming = V.evaluate(job(Rank(steps=3)).view())
    assert warming.bottleneck == "warming_up" and warming.path == [] and set(warming.answers) == set(V.CHART.questions)


def test_an_answer_decided_by_more_than_its_threshold_says_what_decided():
    both = V.evaluate(_comm(data_wait_frac=0.08, comm_exposed_frac=0.2, compute_ratio=0.95))
    data = both.answers["data_wait"]
    assert (data.answer, data.value, data.threshold) == ("no", 0.08, chart.DATA_WAIT_MIN)
    assert data.decided_by == "exposed communication 20% is larger"
    assert both.answers["comm_exposed"].answer == "yes" and both.answers["comm_exposed"].decided_by == ""
    lossy = V.evaluate(_comm(data_wait_frac=0.12, loader_workers=4, loader_cpu=0.05))
    assert lossy.answers["device_busy"].answer == "yes" and lossy.answers["device_busy"].value == 0.9
    assert lossy.answers["device_busy"].decided_by == "a loss of 12% ≥10%"


# -- communication not measured in a job of several ranks ----------------------------------------
UNTIMED = "DDP communication not timed: a DDP comm hook cannot be removed again"


def _untimed_ddp(*ranks: Rank, cpu: float = 0.03) -> JobView:
    """A CPU job whose training threads spend ``cpu`` of each 100 ms step on CPU (off CPU 70% by
    default), its DDP traffic untimed; the probe said why in a warning naming the quantity."""
    said = {"k": "event", "t": T0, "name": "warning", "source": "comm", "message": UNTIMED, "unmeasured": "comm"}
    return job(*(dataclasses.replace(r, cpu=cpu, cpu_span="active", comm=None, extra_records=[said])
                 for r in ranks)).view()


def test_untimed_communication_of_several_ranks_leaves_the_unexplained_wait_not_measured():
    view = _untimed_ddp(Rank(0), Rank(1))
    assert view.comm_status == UNTIMED
    v = V.evaluate(view)
    assert v.bottleneck == "not_measured"                      # not blamed on the host: it may be the all-reduce
    assert v.path[-1] == "comm_exposed" and v.evidence["skipped"]["comm_exposed"] == UNTIMED
    assert "communication is not timed in this 2-rank job" in v.headline and UNTIMED in v.headline
    assert any("perfmon capture" in fix for fix in v.suggestions)
    assert by_id(v.losses)["comm_exposed"].source == UNTIMED


def test_one_rank_with_untimed_communication_still_names_the_wait():
    v = V.evaluate(_untimed_ddp(Rank(0)))
    assert v.bottleneck == "host_wait"


def test_a_small_unexplained_share_does_not_stop_the_walk_at_untimed_communication():
    v = V.evaluate(_untimed_ddp(Rank(0), Rank(1), cpu=0.097))     # off CPU 3% of the step
    assert v.bottleneck == "healthy" and "comm_exposed" not in v.path
