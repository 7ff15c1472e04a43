"""Loss accounting: each share measured with a named source or unknown; the verdict never calls a job
healthy while one measured cause takes 10% of its step, and an unknown never picks an exit."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from perfmon_analysis import flowchart as chart, verdict as V
from perfmon_analysis.losses import account, by_id
from perfmon_analysis.views import Metrics
from tests.unit.verdict_synth import T0, Rank, job

GB = 1 << 30


def _view(device: str = "cuda", **metrics):
    base = job(Rank(gpu_util=97), device=device).view()
    return dataclasses.replace(base, metrics=dataclasses.replace(base.metrics, **metrics))


def test_gpu_idle_is_what_busy_and_data_wait_leave_and_comm_is_not_subtracted():
    losses = by_id(account(Metrics(device_busy=0.6, device_busy_source="nvml_util", data_wait_frac=0.1,
                                   comm_exposed_frac=0.2), "cuda"))
    assert abs(losses["device_idle"].share - 0.3) < 1e-9         # 1 - 0.6 - 0.1; NCCL kernels count as busy
    assert "NVML" in losses["device_idle"].source
    assert losses["comm_exposed"].share == 0.2 and losses["data_wait"].share == 0.1


def test_every_unmeasured_share_is_unknown_with_a_reason_never_zero():
    losses = account(Metrics(), "cuda")
    assert [x.id for x in losses] == ["data_wait", "comm_exposed", "device_idle", "loop", "step_gaps"]
    assert all(x.share is None and x.source for x in losses)
    assert all("why_unknown" in x.as_json() and x.as_json()["share"] is None for x in losses)
    cpu = by_id(account(Metrics(device_busy=0.8, device_busy_source="step_accounting"), "cpu"))
    assert cpu["device_idle"].share is None and cpu["device_idle"].source.startswith("CPU job")
    # a busy figure that is not measured activity (an unnamed source) gives no idle share
    assert by_id(account(Metrics(device_busy=0.5), "cuda"))["device_idle"].share is None


def test_comm_time_without_its_exposed_part_is_unknown_and_says_so():
    comm = by_id(account(Metrics(comm_frac=0.4), "cuda"))["comm_exposed"]
    assert comm.share is None and "40%" in comm.source and "PERFMON_NCCL_TIMING" in comm.source


def test_a_loss_under_the_busy_gate_still_names_the_bottleneck():
    """Busy 80% (over 70%) yet 20% of each step waits for data: not healthy (the demo's case)."""
    v = V.evaluate(_view(device="cpu", device_busy=0.8, device_busy_source="step_accounting", data_wait_frac=0.2,
                         comm_exposed_frac=0.0, loader_workers=2, loader_cpu=0.02))
    assert v.bottleneck == "data_loading" and v.path[:3] == ["memory", "device_busy", "data_wait"]
    assert v.evidence["notes"]["device_busy"] == "data wait is 20% of the step (>= 10%)"


def test_the_largest_loss_names_the_verdict_and_the_others_become_findings():
    v = V.evaluate(_view(device_busy=0.55, device_busy_source="nvml_util", data_wait_frac=0.15, comm_exposed_frac=0.25,
                         compute_ratio=1.0, loader_workers=2, loader_cpu=0.02, host_queued_whole_frac=0.0))
    # idle 1 - 0.55 - 0.15 = 30% > comm 25% > data 15%; the host's lead is too short to hide the idle
    assert v.bottleneck == "host_overhead"
    assert [(f["id"], f["share"]) for f in v.findings if f["id"] in chart.LOSS_THRESHOLD] == [
        ("comm_exposed", 0.25), ("data_wait", 0.15)]
    v = V.evaluate(_view(device_busy=0.8, device_busy_source="nvml_util", data_wait_frac=0.15, comm_exposed_frac=0.25,
                         compute_ratio=1.0, loader_workers=2, loader_cpu=0.02))
    assert v.bottleneck == "communication"
    assert [f["id"] for f in v.findings if f["id"] in chart.LOSS_THRESHOLD] == ["data_wait"]   # idle 5%: not one


def test_a_data_wait_between_5_and_10_percent_is_a_finding_of_a_healthy_job():
    v = V.evaluate(_view(device="cpu", device_busy=0.93, device_busy_source="step_accounting", data_wait_frac=0.07,
                         comm_exposed_frac=0.0))
    assert v.bottleneck == "healthy"
    assert [f["id"] for f in v.findings] == ["data_wait"]


@settings(max_examples=300, deadline=None)
@given(busy=st.one_of(st.none(), st.floats(0.0, 1.0)), data=st.one_of(st.none(), st.floats(0.0, 0.6)),
       comm=st.one_of(st.none(), st.floats(0.0, 0.6)), syncs=st.one_of(st.none(), st.floats(0.0, 4.0)),
       cpu=st.one_of(st.none(), st.floats(0.0, 1.0)), ratio=st.one_of(st.none(), st.floats(0.1, 1.0)),
       fill=st.one_of(st.none(), st.floats(0.0, 1.0)), lead=st.one_of(st.none(), st.floats(0.0, 1.0)),
       loop=st.one_of(st.none(), st.floats(0.0, 0.6)), loop_wait=st.one_of(st.none(), st.floats(0.0, 1.0)),
       device=st.sampled_from(["cpu", "cuda"]))
def test_never_healthy_with_a_measured_loss_of_ten_percent(busy, data, comm, syncs, cpu, ratio, fill, lead, loop,
                                                           loop_wait, device):
    """The verdict's invariants over any mix of measured and unknown numbers, fill (SM activity over busy),
    the share of timed steps the host queued whole and the loop's own work between steps included."""
    cuda = device == "cuda"
    view = _view(device=device, device_busy=busy, device_busy_source="nvml_util" if cuda else
                 "step_accounting", data_wait_frac=data, comm_exposed_frac=comm, syncs_per_step=syncs,
                 loader_cpu=cpu, loader_workers=2, compute_ratio=ratio, mfu=0.5,
                 device_fill=fill if cuda else None, host_queued_whole_frac=lead if cuda else None, loop_frac=loop,
                 loop_wait_frac=loop_wait)
    view = dataclasses.replace(view, world_size=2)
    v = V.evaluate(view)
    by = by_id(v.losses)
    worst = max((x.share for x in v.losses if x.id in chart.LOSS_THRESHOLD and x.share is not None), default=0.0)
    if worst >= chart.LOSS_MIN:
        assert v.bottleneck != "healthy", (v.headline, v.losses)
    # an unknown never selects an exit: the outcome's loss, when it names one, was measured
    named = v.loss
    if named is not None:
        assert by[named].share is not None or v.undecided, (v.headline, v.losses)
    # a skipped outcome question is said in the headline
    for node_id in v.undecided:
        assert "cannot tell" in v.headline and node_id in v.evidence["skipped"]
    idle = by["device_idle"].share
    if cuda:
        # the host is blamed only with evidence: the device idle in time and most steps not queued whole
        if v.bottleneck == "host_overhead":
            assert idle is not None and idle >= chart.LOSS_MIN and lead is not None and lead < chart.HOST_AHEAD_SHARE
        # a sync costs the idle it causes: never host_sync on a device that idles under 10% of the step
        if v.bottleneck == "host_sync":
            assert idle is not None and idle >= chart.LOSS_MIN and syncs is not None and syncs >= 1
        # busy in time and poorly filled: low_fill, never healthy; fill is never read as idle time
        if busy is not None and busy >= chart.DEVICE_BUSY_MIN and worst < chart.LOSS_MIN and fill is not None:
            assert (v.bottleneck == "low_fill") == (fill < chart.FILL_MIN), (v.headline, fill)
        if v.bottleneck == "low_fill":
            assert fill is not None and fill < chart.FILL_MIN and busy is not None and busy >= chart.DEVICE_BUSY_MIN
        if fill is not None and busy is not None:      # the device idles between steps too: not this loss
            assert by["device_idle"].share == pytest.approx(max(0.0, 1.0 - busy - (data or 0.0) - (loop or 0.0)))


def test_an_early_memory_spike_stops_counting_once_it_leaves_the_window():
    """The allocator's lifetime peak_reserved jumped to 78 GB at the start; reserved is 20 GB since."""
    def mem(t, reserved, peak_reserved):
        return {"k": "memory", "t": t, "reserved": reserved, "allocated": reserved, "peak_reserved": peak_reserved,
                "peak": peak_reserved, "limit": 80 * GB, "alloc_retries": 0, "ooms": 0}

    spike = [mem(T0 + 0.5, 78 * GB, 78 * GB)]
    later = [mem(T0 + 0.5 + i, 20 * GB, 78 * GB) for i in range(1, 20)]
    early = job(Rank(steps=10, dur=0.1, gpu_util=97, extra_records=spike), device="cuda").view()
    assert early.metrics.memory.peak_frac > chart.MEMORY_PEAK_MAX and V.evaluate(early).bottleneck == "memory"
    long_after = job(Rank(steps=300, dur=0.1, gpu_util=97, extra_records=spike + later), device="cuda").view()
    assert long_after.metrics.memory.peak_bytes == 20 * GB
    assert V.evaluate(long_after).bottleneck != "memory"


def test_a_spike_between_two_samples_inside_the_window_counts():
    """The lifetime peak rose during the window although no sample saw it: the window peak is it."""
    def mem(t, reserved, peak_reserved):
        return {"k": "memory", "t": t, "reserved": reserved, "peak_reserved": peak_reserved, "limit": 80 * GB}

    recs = [mem(T0 + 20.0, 20 * GB, 30 * GB), mem(T0 + 29.5, 20 * GB, 75 * GB)]
    view = job(Rank(steps=300, dur=0.1, gpu_util=97, extra_records=recs), device="cuda").view()
    assert view.metrics.memory.peak_bytes == 75 * GB


def test_each_loss_names_its_source_or_why_it_is_unknown_in_the_reports_words():
    def rows(device: str, **metrics) -> list[dict]:
        v = _view(device, **metrics)
        return [x.as_json() for x in account(v.metrics, v.device_type)]

    measured = rows("cuda", device_busy=0.6, data_wait_frac=0.1, comm_exposed_frac=0.05, loop_frac=0.04,
                    pause_frac=0.02)
    assert measured == [
        {"id": "data_wait", "label": "data wait", "share": 0.1, "source": "time blocked waiting for the next batch",
         "span": "window"},
        {"id": "comm_exposed", "label": "exposed communication", "share": 0.05,
         "source": "time blocked in collectives", "span": "window"},
        {"id": "device_idle", "label": "device idle, no other cause", "share": measured[2]["share"],
         "source": "1 - GPU busy (NVML utilization) - data wait - time between steps", "span": "window"},
        {"id": "loop", "label": "loop work between steps", "share": 0.04,
         "source": "time between steps that recurs every step (the window's median gap), from step boundaries",
         "span": "window"},
        {"id": "step_gaps", "label": "pauses between steps", "share": 0.02,
         "source": "occasional time between steps (checkpoints, evaluation, stalls) over the whole run: 1 - ETTR",
         "span": "run"}]
    assert abs(measured[2]["share"] - 0.24) < 1e-9         # 1 - 0.6 - 0.1 - 0.04 - 0.02: the device idles between steps
    assert rows("cpu", device_busy=None, data_wait_frac=None, comm_exposed_frac=None, loop_frac=None,
                pause_frac=None) == [
        {"id": "data_wait", "label": "data wait", "share": None,
         "why_unknown": "no batch fetch timed (mon.loader(...), a DataLoader under perfmon run or a trainer callback) "
                        "or no step timing yet",
         "span": "window"},
        {"id": "comm_exposed", "label": "exposed communication", "share": None,
         "why_unknown": "collectives take 0% of the step, the exposed part is not measured "
                        "(NCCL: PERFMON_NCCL_TIMING=1)", "span": "window"},
        {"id": "device_idle", "label": "waiting, no measured cause", "share": None,
         "why_unknown": "CPU job: the training thread's CPU time is not reported, so a wait inside the step cannot "
                        "be told from work (busy is the time not lost to a measured cause)", "span": "window"},
        {"id": "loop", "label": "loop work between steps", "share": None, "why_unknown": "no step timing yet",
         "span": "window"},
        {"id": "step_gaps", "label": "pauses between steps", "share": None, "why_unknown": "no step timing yet",
         "span": "run"}]
    gpu_unknown = rows("cuda", device_busy=None, data_wait_frac=0.1, comm_exposed_frac=None, pause_frac=0.0)
    assert gpu_unknown[2] == {"id": "device_idle", "label": "device idle, no other cause", "share": None,
                              "why_unknown": "GPU busy in time not measured (NVML utilization not readable)",
                              "span": "window"}
    assert gpu_unknown[4]["share"] == 0.0


def test_estimated_or_uninstrumented_comm_says_so_and_report_shares_have_four_decimals():
    estimated = by_id(account(Metrics(comm_exposed_frac=0.123456, comm_estimated=True), "cuda"))["comm_exposed"]
    assert estimated.as_json() == {"id": "comm_exposed", "label": "exposed communication", "share": 0.1235,
                                   "source": "estimated from collective times", "span": "window"}
    missing = by_id(account(Metrics(), "cuda"))["comm_exposed"]
    assert missing.as_json() == {"id": "comm_exposed", "label": "exposed communication", "share": None,
                                 "why_unknown": "collectives not instrumented (mon.watch(model=ddp_model))",
                                 "span": "window"}
    unexposed = by_id(account(Metrics(comm_frac=0.6), "cuda"))["comm_exposed"]
    assert unexposed.source.startswith("collectives take 60% of the step")


def test_each_loss_the_verdict_does_not_name_is_a_finding_with_its_source_and_share():
    v = V.evaluate(_view(device_busy=0.55, device_busy_source="nvml_util", data_wait_frac=0.15, comm_exposed_frac=0.25,
                         compute_ratio=1.0, loader_workers=2, loader_cpu=0.02))
    found = {f["id"]: f for f in v.findings}
    assert found["comm_exposed"] == {"id": "comm_exposed", "share": 0.25, "source": "time blocked in collectives",
                                     "message": "exposed communication also takes 25% of each step"}
    assert found["data_wait"]["message"] == "data wait also takes 15% of each step"
