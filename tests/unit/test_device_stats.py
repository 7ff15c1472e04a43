"""A rank's GPU over the window (perfmon_analysis.device_stats): the lead-timed steps the host rule reads,
the busy share the steps' own CUDA timeline proves, the host's lead, NVML busy, SM fill and power of
the rank's own GPU, and why busy is unknown.

Inputs are the module's own types: step and sample records from tests/helpers/records.py read by
``step_reading`` and ``sample_reading``."""

from __future__ import annotations

from typing import Any

import pytest

from perfmon_analysis.device_stats import (
    TIMED_STEPS,
    TIMELINE_MIN_STEPS,
    LeadTimes,
    busy_unknown_reason,
    gpu_busy,
    gpu_fill,
    gpu_power,
    lead_at_least,
    lead_times,
    timed_steps,
    timeline_busy,
)
from perfmon_analysis.readings import SampleReading, StepReading, sample_reading, step_reading
from tests.helpers import records as R


def step(n: int, dur: float = 1.0, **timing: Any) -> StepReading:
    """Step ``n`` of ``dur`` s, the n-th from 100 s (``timing``: lead, gpu_time, whole)."""
    s = step_reading(R.step(n, start=100.0 + (n - 1) * dur, dur=dur, **timing))
    assert s is not None
    return s


def sample(t: float, *gpus: dict[str, Any], **fields: Any) -> SampleReading:
    return sample_reading(R.sample(t, gpus=list(gpus), **fields) if gpus else R.sample(t, **fields))


# -- the lead ----------------------------------------------------------------------------------
def test_the_least_lead_is_the_read_one_less_a_quarter_or_5_ms_whichever_is_less():
    assert lead_at_least(0.1) == pytest.approx(0.08)        # 0.1 / 1.25 < 0.1 - 0.005
    assert lead_at_least(0.01) == pytest.approx(0.005)      # 0.01 - 0.005 < 0.01 / 1.25
    assert lead_at_least(0.001) == 0.0


# -- which steps are timed -----------------------------------------------------------------------
def _run(untimed: tuple[int, ...] = ()) -> list[StepReading]:
    """Steps 1..20, 1 s each (step n ends at 100 + n), all lead-timed but ``untimed``."""
    return [step(n) if n in untimed else step(n, lead=0.5, gpu_time=0.25) for n in range(1, 21)]


def test_a_short_window_reads_the_newest_timed_steps_before_it_no_older_than_max_seconds():
    run = _run(untimed=(14,))
    # window 17..20 ends at 120; 8 s back is 112: steps 16, 15, 13 and 12 (ends 116..112) join, 14 untimed
    assert [s.step for s in timed_steps(run, run[-4:], 8.0)] == [12, 13, 15, 16, 17, 18, 19, 20]


def test_the_earlier_steps_fill_the_window_up_to_ten_timed_steps():
    run = _run()
    assert TIMED_STEPS == 10
    assert [s.step for s in timed_steps(run, run[-4:], 100.0)] == list(range(11, 21))
    assert [s.step for s in timed_steps(run, run[-1:], 100.0)] == list(range(11, 21))


def test_a_window_of_ten_timed_steps_an_empty_one_or_one_without_its_end_time_reads_itself():
    run = _run()
    assert [s.step for s in timed_steps(run, run[-10:], 100.0)] == list(range(11, 21))
    assert timed_steps(run, [], 100.0) == []
    last = step_reading({"k": "step", "step": 21, "start": 120.0, "dur": 1.0, "lead": 0.5, "gpu_time": 0.25})
    assert last is not None and last.t is None
    assert [s.step for s in timed_steps(run, [run[-1], last], 100.0)] == [20, 21]


# -- busy from the timeline ---------------------------------------------------------------------------
def test_the_timeline_proves_busy_the_device_time_of_the_steps_queued_whole():
    steps = [
        step(1, lead=0.5, gpu_time=0.25),                # lead at least 0.4 >= 0.25: queued whole
        step(2, lead=0.5, gpu_time=0.4),                 # at least 0.4, exactly its device time: whole
        step(3, lead=0.01, gpu_time=0.5, whole=True),    # the probe's own answer wins over the lead
        step(4, lead=2.0, gpu_time=0.75, whole=False),   # ... whichever way
        step(5, lead=0.0, gpu_time=0.25),                # no lead: not whole
        step(6, lead=0.1, gpu_time=0.0),                 # no device time: not timed
        step(7, gpu_time=0.5),                           # no lead: not timed
    ]
    busy, exact = timeline_busy(steps)
    assert busy == pytest.approx((0.25 + 0.4 + 0.5) / 5.0) and exact is False


def test_the_timeline_needs_three_timed_steps_and_is_exact_when_all_were_queued_whole():
    assert TIMELINE_MIN_STEPS == 3
    quarter = [step(n, dur=0.25, lead=0.5, gpu_time=0.125) for n in range(1, 4)]
    assert timeline_busy(quarter) == (0.5, True)
    assert timeline_busy(quarter[:2]) == (None, False)


def test_the_timeline_busy_is_at_most_the_whole_step():
    late = [step(n, lead=3.0, gpu_time=1.5) for n in range(1, 4)]
    assert timeline_busy(late) == (1.0, True)


def test_the_lead_times_are_the_medians_of_device_time_and_lead_per_device_time_and_the_share_queued_whole():
    steps = [
        step(1, lead=0.5, gpu_time=0.25),               # 2 steps of lead: whole
        step(2, lead=0.25, gpu_time=0.25),              # exactly one: whole
        step(3, lead=0.125, gpu_time=0.5, whole=True),  # the probe's answer
        step(4, lead=0.0, gpu_time=0.5),                # no lead
        step(5, gpu_time=0.5),                          # not timed
        step(6, lead=0.1, gpu_time=0.0),                # not timed
    ]
    assert lead_times(steps) == LeadTimes(device_time=0.375, lead_steps=0.625, queued_whole=0.75)
    assert lead_times(steps[4:]) == LeadTimes(None, None, None)


# -- the rank's own GPU in the samples -------------------------------------------------------------
def gpu(index: int, **fields: Any) -> dict[str, Any]:
    return {"index": index, "name": "H100", **fields}


def test_busy_fill_power_and_the_unknown_reason_read_the_gpu_of_the_ranks_local_rank():
    samples = [sample(10.0 + i, gpu(0, util=0.25, sm_active=0.125, energy_mj=1e6 * (1 + i), errors=2),
                      gpu(1, util=0.75, sm_active=0.5, energy_mj=2e6 + 5e5 * i, why={"util": "x"}))
               for i in range(3)]
    assert gpu_busy(samples, 1) == (0.75, "nvml_util")
    assert gpu_fill(samples, 1) == (pytest.approx(2 / 3), 0.5, None)
    assert gpu_power(samples, 1) == 500.0
    assert busy_unknown_reason(samples, 1, None) == "x"


def test_without_its_gpu_listed_a_rank_reads_the_first_one():
    samples = [sample(10.0 + i, gpu(0, util=0.25, energy_mj=1e6 * (1 + i)),
                      gpu(1, util=0.75, sm_active=0.5, energy_mj=0.0, lost=True)) for i in range(2)]
    assert gpu_busy(samples, 3) == (0.25, "nvml_util")
    assert gpu_fill(samples, 3) == (None, None, None)
    assert gpu_power(samples, 3) == 1000.0
    assert busy_unknown_reason(samples, 3, None) == "NVML gave no utilization"


def test_busy_is_the_mean_utilization_and_unknown_without_one():
    samples = [sample(10.0, gpu(0, util=0.5)), sample(11.0, gpu(0)), sample(12.0, gpu(0, util=0.25))]
    assert gpu_busy(samples, 0) == (0.375, "nvml_util")
    assert gpu_busy(samples[1:2], 0) == (None, None)


def test_the_fill_is_sm_activity_over_utilization_of_the_samples_with_both():
    samples = [sample(10.0, gpu(0, util=0.5, sm_active=0.25, tensor_active=0.125)),
               sample(11.0, gpu(0, util=0.5, sm_active=0.5)),
               sample(12.0, gpu(0, sm_active=0.75))]
    assert gpu_fill(samples, 0) == (0.75, 0.5, 0.125)


def test_the_fill_is_at_most_one_and_unknown_when_no_kernel_ran():
    assert gpu_fill([sample(10.0, gpu(0, util=0.25, sm_active=0.5))], 0) == (1.0, 0.5, None)
    assert gpu_fill([sample(10.0, gpu(0, util=0.0, sm_active=0.5))], 0) == (None, 0.5, None)


def test_power_is_the_energy_counters_rise_over_the_time_between_the_first_and_last_reading():
    readings = [sample(10.0, gpu(0, energy_mj=1_000_000)), sample(11.0, gpu(0, energy_mj=1_250_000)),
                sample(12.0, gpu(0, energy_mj=1_600_000)), sample(13.0, gpu(0))]
    assert gpu_power(readings, 0) == 300.0
    assert gpu_power(readings[:2], 0) == 250.0
    assert gpu_power(readings[:1], 0) is None


def test_power_is_zero_for_a_still_counter_and_unknown_for_a_restarted_one_or_no_time_between():
    still = [sample(10.0, gpu(0, energy_mj=5_000)), sample(12.0, gpu(0, energy_mj=5_000))]
    assert gpu_power(still, 0) == 0.0
    restarted = [sample(10.0, gpu(0, energy_mj=5_000)), sample(12.0, gpu(0, energy_mj=1_000))]
    assert gpu_power(restarted, 0) is None
    same_time = [sample(10.0, gpu(0, energy_mj=5_000)), sample(10.0, gpu(0, energy_mj=6_000))]
    assert gpu_power(same_time, 0) is None


def test_busy_unknown_says_the_devices_status_else_why_there_are_no_gpu_samples():
    assert busy_unknown_reason([sample(10.0, gpu(0))], 0, "NVML not loadable") == "NVML not loadable"
    assert busy_unknown_reason([sample(10.0, gpu_status="no NVIDIA GPU"), sample(11.0)], 0, None) == "no NVIDIA GPU"
    assert busy_unknown_reason([sample(10.0)], 0, None) == "no GPU utilization samples for this job's GPU"


def test_busy_unknown_says_the_newest_readings_nvml_reason_with_its_error_count():
    samples = [sample(10.0, gpu(0, why={"util": "NVML: NotSupported"})), sample(11.0, gpu(0, lost=True, errors=3)),
               sample(12.0, gpu(0, why={"util": "NVML: NoPermission"}, errors=0))]
    assert busy_unknown_reason(samples, 0, None) == "NVML: NoPermission"
    assert busy_unknown_reason(samples[:2], 0, None) == "NVML: GpuIsLost (3 NVML errors)"
    assert busy_unknown_reason(samples[:1], 0, None) == "NVML: NotSupported"
