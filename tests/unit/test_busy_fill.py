"""Busy and fill, two measured quantities: busy is time (a kernel ran: NVML utilization, or the steps'
own CUDA timeline where it proves more), fill is how much of the device the running kernels use (GPM
SM activity over busy). And unknown never drops out across ranks: a rank whose busy is not measured
makes the job's busy not measured, with the rank and NVML's reason.

Records come from the shared synthetic factory (``tests/unit/verdict_synth``), as a probe sends them."""

from __future__ import annotations

import pytest

from perfmon_analysis.losses import account, by_id
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.verdict import evaluate
from tests.unit.verdict_synth import Rank, job, records

STEP = 0.020


def test_sm_activity_under_a_busy_device_is_fill_not_idle_time():
    """NVML utilization 100%, SM activity 55%: the device never idled; its kernels fill 55% of it.
    Read as busy (the defect), SM activity made 45% of each step "device idle"."""
    m = job(Rank(dur=STEP, gpu_util=100, sm_active=0.55), device="cuda").view().metrics
    assert m.device_busy == pytest.approx(1.0) and m.device_busy_source == "nvml_util"
    assert m.device_fill == pytest.approx(0.55) and m.sm_active == pytest.approx(0.55)
    assert by_id(account(m, "cuda"))["device_idle"].share == pytest.approx(0.0)


def test_fill_is_sm_activity_over_the_time_a_kernel_ran():
    """DCGM: a kernel on all SMs for a fifth of the time reads SM activity 0.2, as does one on a fifth of
    the SMs all the time. Utilization tells them apart: 20% busy and full, 100% busy and a fifth full."""
    full_part_time = job(Rank(dur=STEP, gpu_util=20, sm_active=0.2), device="cuda").view().metrics
    part_full_time = job(Rank(dur=STEP, gpu_util=100, sm_active=0.2), device="cuda").view().metrics
    assert (full_part_time.device_busy, full_part_time.device_fill) == (pytest.approx(0.2), pytest.approx(1.0))
    assert (part_full_time.device_busy, part_full_time.device_fill) == (pytest.approx(1.0), pytest.approx(0.2))


def test_the_steps_cuda_timeline_bounds_busy_from_below_where_nvml_reads_less():
    """Each step's work was all queued before the device began it (lead 150 ms > its 20 ms on the
    device), so no kernel gap is possible inside it, whatever NVML's coarser period says (here 60%:
    its sample period also covers time outside the steps)."""
    m = job(Rank(dur=STEP, gpu_util=60, gpu_time=STEP, lead=0.150), device="cuda").view().metrics
    assert m.device_busy == pytest.approx(1.0) and m.device_busy_source == "cuda_timeline"
    assert "CUDA timeline" in by_id(account(m, "cuda"))["device_idle"].source


def test_a_short_lead_proves_little_and_nvml_utilization_stays_the_busy_share():
    """Lead 1 ms of a 20 ms step: the step was still being launched while the device ran it, so gaps
    inside it are possible; the timeline proves only 5% busy, and utilization (40%) is the reading."""
    m = job(Rank(dur=STEP, gpu_util=40, gpu_time=STEP, lead=0.001), device="cuda").view().metrics
    assert m.device_busy == pytest.approx(0.40) and m.device_busy_source == "nvml_util"


def test_a_lead_read_late_by_the_pollers_error_does_not_count_as_queued_whole():
    """A lead is read late by up to a quarter of it, or 5 ms while the host holds the GIL the poller needs:
    24 ms read for a 20 ms step may be a true 19 ms, which leaves room for a gap, so without utilization
    busy stays unknown; 26 ms is at least 20.8 ms: queued whole."""
    why = {"util": "NVML: NotSupported on this GPU"}
    late = job(Rank(dur=STEP, gpu_time=STEP, lead=0.024, gpu_why=why), device="cuda").view().metrics
    assert late.device_busy is None
    whole = job(Rank(dur=STEP, gpu_time=STEP, lead=0.026, gpu_why=why), device="cuda").view().metrics
    assert whole.device_busy == pytest.approx(1.0) and whole.device_busy_source == "cuda_timeline"


def test_a_rank_whose_busy_is_unknown_makes_the_jobs_busy_unknown_with_its_reason():
    """Rank 0 at 95%, rank 1's NVML answers NotSupported for utilization. Before: the job's busy was rank
    0's 95% (the minimum over ranks that had one) and the verdict healthy/ok."""
    r0 = Rank(rank=0, dur=STEP, gpu_util=95, sm_active=0.9)
    r1 = Rank(rank=1, dur=STEP, gpu_why={"util": "NVML: NotSupported on this GPU"}, sm_active=0.9)
    view = job(r0, r1, device="cuda").view()
    m = view.metrics
    assert m.device_busy is None and m.device_busy_source is None
    assert m.device_busy_unknown == {"1": "NVML: NotSupported on this GPU"}
    assert "rank 1: NVML: NotSupported" in by_id(account(m, "cuda"))["device_idle"].source
    v = evaluate(view)
    assert (v.bottleneck, v.severity) != ("healthy", "ok") and v.bottleneck == "not_measured"
    assert "device_busy" in v.as_json()["unknown"]
    assert view.ranks[0].device_busy == pytest.approx(0.95) and view.ranks[1].device_busy is None


def test_a_rank_without_gpu_samples_names_the_probes_own_status():
    r1 = Rank(rank=1, dur=STEP)
    m = job(Rank(rank=0, dur=STEP, gpu_util=95), r1, device="cuda").view().metrics
    assert m.device_busy is None and m.device_busy_unknown == {"1": "no GPU utilization samples for this job's GPU"}


def test_the_offloaded_share_of_a_cuda_job_is_reported():
    m = job(Rank(dur=STEP, gpu_util=90, offloaded=0.25), device="cuda").view().metrics
    assert m.params_offloaded == pytest.approx(0.25)
    assert job(Rank(dur=STEP, offloaded=0.25)).view().metrics.params_offloaded is None    # a CPU job: none


def test_without_utilization_only_an_exact_timeline_gives_busy():
    """NVML gives no utilization. Steps queued whole before the device began them (lead > device time)
    leave no gap inside them: busy is measured. A shorter lead proves nothing: busy stays not measured,
    with NVML's reason."""
    why = {"util": "NVML: NotSupported on this GPU"}
    queued = job(Rank(dur=STEP, gpu_time=STEP, lead=0.150, gpu_why=why), device="cuda").view().metrics
    assert queued.device_busy == pytest.approx(1.0) and queued.device_busy_source == "cuda_timeline"
    short = job(Rank(dur=STEP, gpu_time=STEP, lead=0.010, gpu_why=why), device="cuda").view().metrics
    assert short.device_busy is None and short.device_busy_unknown == {"0": "NVML: NotSupported on this GPU"}


def test_a_window_of_fast_steps_reads_the_lead_of_the_timed_steps_just_before_it():
    """About ten steps a second are timed: a window of ten 5 ms steps holds none. The lead and the device
    time then come from the newest timed steps before the window (within its 30 s), not from nothing."""
    recs = records(Rank(steps=60, dur=0.005, gpu_util=40, gpu_time=0.005, lead=0.001), device="cuda")
    for r in recs:
        if r["k"] == "step" and r["step"] % 20:
            del r["lead"], r["gpu_time"]              # timed: steps 0, 20, 40; the window: 50-59
    model = RunModel(window_steps=10)
    for r in recs:
        model.ingest("r0", r)
    m = model.view().metrics
    assert m.host_lead_s == pytest.approx(0.001) and m.device_time_median_s == pytest.approx(0.005)
    assert m.host_lead_steps == pytest.approx(0.2)


def test_the_probes_queued_whole_answer_outranks_a_lead_the_poller_read_late():
    """A launch-bound step: the host spins launching while holding the GIL, so the poller sees the step
    done only at the next switch, a lead of more than the step as read. The probe asked the step's first
    event as the host ended it and it had run (``whole`` False): the host did not queue it whole, and a
    device idle 90% in time is host overhead, not "the host keeps each step queued". A probe that did
    not ask (an older recording) keeps the lead's reading: queued whole, its timeline busy throughout."""
    late = Rank(dur=STEP, gpu_util=10, gpu_time=STEP, lead=1.5 * STEP)
    asked = records(late, device="cuda")
    for r in asked:
        if r["k"] == "step":
            r["whole"] = False
    model = RunModel()
    for r in asked:
        model.ingest("r0", r)
    m = model.view().metrics
    assert m.host_queued_whole_frac == 0.0 and m.host_lead_steps == pytest.approx(1.5)
    assert m.device_busy == pytest.approx(0.10) and m.device_busy_source == "nvml_util"
    assert evaluate(model.view()).bottleneck == "host_overhead"
    unasked = job(late, device="cuda").view()
    assert unasked.metrics.host_queued_whole_frac == 1.0 and unasked.metrics.device_busy_source == "cuda_timeline"
    assert evaluate(unasked).bottleneck != "host_overhead"
