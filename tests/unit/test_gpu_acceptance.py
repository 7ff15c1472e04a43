"""Issue 38's acceptance: recordings of CUDA jobs like the ones a new user fed perfmon, built with the
shared record factory (``tests/unit/verdict_synth``: a CUDA hello, samples with NVML ``util`` and GPM
``sm_active``, steps with the CUDA timeline's ``gpu_time`` and ``lead`` and the ``syncs`` count), read
as ``perfmon report`` reads a recording. Before busy and fill were split, the first two blamed the host
("the CPU cannot feed it", host_sync at crit) on a device that never idled, and the two-rank one was
healthy/ok with rank 1's busy unreadable."""

from __future__ import annotations

import pytest

from perfmon_analysis.analysis import Analysis
from tests.helpers.reports import analysed
from tests.unit.verdict_synth import Rank, records

STEP = 0.020          # 20 ms steps, the device's 20 ms timed by CUDA events on each
HOST_BLAMED = ("host_overhead", "host_sync", "host_wait")


def _report(*ranks: Rank) -> dict:
    return _analysed(*ranks)[0]


def _analysed(*ranks: Rank) -> tuple[dict, str]:
    world = len(ranks)
    streams = [(f"r{r.rank}", records(r, world, device="cuda")) for r in ranks]
    return analysed(Analysis.of_records(streams))


def test_a_device_that_never_idles_with_kernels_filling_55_percent_is_low_fill_not_host_overhead():
    """NVML utilization 100%, SM activity 55%, the host 150 ms ahead. Before: host_overhead, 'the CPU
    cannot feed it', 'up to 1.8x faster', while its headline said the host ran 150 ms ahead."""
    report, text = _analysed(Rank(dur=STEP, gpu_util=100, sm_active=0.55, gpu_time=STEP, lead=0.150, syncs=0))
    v, m = report["verdict"], report["metrics"]
    assert v["bottleneck"] == "low_fill" and v["severity"] == "info", v["headline"]
    assert m["device_busy"] == 1.0 and m["device_fill"] == pytest.approx(0.55) and m["sm_active"] == 0.55
    assert "cannot feed" not in v["headline"] and v["path"] == ["memory", "device_busy", "fill"]
    assert m["device_idle_frac"] == 0.0
    assert "Low SM fill" in text


def test_one_item_per_step_on_a_device_that_never_idles_is_not_host_sync():
    """The same device with one .item() per step (SM activity 45%). Before: host_sync at crit; a sync that
    never leaves the device idle costs nothing. Under 50% SM fill NVIDIA calls likely ineffective: a warning."""
    report = _report(Rank(dur=STEP, gpu_util=100, sm_active=0.45, gpu_time=STEP, lead=0.150, syncs=1))
    v = report["verdict"]
    assert v["bottleneck"] == "low_fill" and v["severity"] == "warn", v["headline"]
    assert v["bottleneck"] not in HOST_BLAMED and report["metrics"]["syncs_per_step"] == 1.0


def test_a_starved_device_with_the_host_a_millisecond_ahead_stays_host_overhead_at_crit():
    """The control: utilization 40%, SM activity 35%, the host 1 ms ahead of 20 ms of device work."""
    report = _report(Rank(dur=STEP, gpu_util=40, sm_active=0.35, gpu_time=STEP, lead=0.001, syncs=0))
    v, m = report["verdict"], report["metrics"]
    assert (v["bottleneck"], v["severity"]) == ("host_overhead", "crit"), v["headline"]
    assert m["device_busy"] == pytest.approx(0.40) and m["device_busy_source"] == "nvml_util"
    assert m["device_fill"] == pytest.approx(0.875)        # the kernels fill the device while they run
    assert "1ms ahead of 20ms of device work a step" in v["headline"]


def test_two_ranks_one_with_busy_unreadable_is_not_healthy_and_names_rank_1_and_nvmls_reason():
    """Rank 0 at 95%, rank 1's utilization NotSupported. Before: healthy, ok, busy not in 'unknown', and the
    busy source rank 0's."""
    r0 = Rank(rank=0, dur=STEP, gpu_util=95, sm_active=0.9)
    r1 = Rank(rank=1, dur=STEP, sm_active=0.9, gpu_time=STEP, lead=0.001,
              gpu_why={"util": "NVML: NotSupported on this GPU"})
    report = _report(r0, r1)
    v, m = report["verdict"], report["metrics"]
    assert (v["bottleneck"], v["severity"]) not in (("healthy", "ok"),) and v["bottleneck"] == "not_measured"
    assert m["device_busy"] is None and m["device_busy_unknown"] == {"1": "NVML: NotSupported on this GPU"}
    assert v["unknown"]["device_busy"] == "CUDA busy not measured (rank 1: NVML: NotSupported on this GPU)"
    assert "rank 1: NVML: NotSupported on this GPU" in v["headline"]
    assert [r["device_busy"] for r in report["ranks"]] == [pytest.approx(0.95), None]
