"""The flowchart's questions asked one at a time (perfmon_analysis.questions): the memory question's
every deciding branch (an OOM, rising allocator retries, a leak, the peak), why a busy share is
unknown, and a loss judged against the others. The views are a synthetic job's (tests/unit/verdict_synth.py)
with the quantity under test put in."""

from __future__ import annotations

import dataclasses

import pytest

from perfmon_analysis import units
from perfmon_analysis.flowchart import MEMORY_PEAK_MAX, Answer
from perfmon_analysis.health import JobHealth
from perfmon_analysis.losses import Loss
from perfmon_analysis.memory_growth import MemoryGrowth
from perfmon_analysis.questions import Memory, ask_largest, busy_missing, qualifying
from perfmon_analysis.views import JobView, MemoryMetrics
from tests.unit.verdict_synth import Rank, job

G = 1 << 30


NO_MEMORY = MemoryMetrics()


def _view(memory: MemoryMetrics = NO_MEMORY, growth: MemoryGrowth | None = None, **fields) -> JobView:
    view = job(Rank()).view()
    return dataclasses.replace(view, metrics=dataclasses.replace(view.metrics, memory=memory),
                               health=JobHealth(growth=growth), **fields)


def _growth(steady: bool = True) -> MemoryGrowth:
    return MemoryGrowth(rank=0, series="rss", per_step=2 << 20, per_s=None, steps=100, points=40, first=G,
                        last=2 * G, fit=0.99, steady=steady)


def _said(a: Answer) -> tuple:
    return a.answer, a.value, a.threshold, a.reason, a.decided_by, a.applies


GROWS = f"host RSS grows {units.nbytes(2 << 20)} every step"


@pytest.mark.parametrize("memory, growth, said", [
    (MemoryMetrics(peak_frac=0.5, ooms=2), None,
     ("yes", 0.5, MEMORY_PEAK_MAX, "2 out-of-memory error(s) in the window", "2 OOM", True)),
    (MemoryMetrics(peak_frac=0.5, alloc_retries=7, alloc_retries_rising=True), None,
     ("yes", 0.5, MEMORY_PEAK_MAX, "allocator retries rising (7 so far)", "allocator retries rising", True)),
    (MemoryMetrics(), _growth(), ("yes", None, MEMORY_PEAK_MAX, GROWS, GROWS, True)),
    (MemoryMetrics(), None, (None, None, MEMORY_PEAK_MAX, "memory limit or peak not reported", "", True)),
    (MemoryMetrics(), _growth(steady=False),
     (None, None, MEMORY_PEAK_MAX, "memory limit or peak not reported", "", True)),
    (MemoryMetrics(peak_frac=0.5), _growth(), ("yes", 0.5, MEMORY_PEAK_MAX, GROWS, GROWS, True)),
    (MemoryMetrics(peak_frac=0.95), _growth(), ("yes", 0.95, MEMORY_PEAK_MAX, GROWS, "", True)),
    (MemoryMetrics(peak_frac=0.95), None, ("yes", 0.95, MEMORY_PEAK_MAX, "", "", True)),
    (MemoryMetrics(peak_frac=0.5), _growth(steady=False), ("no", 0.5, MEMORY_PEAK_MAX, "", "", True)),
], ids=["oom", "retries", "leak, peak unknown", "nothing known", "unsteady growth, peak unknown",
        "leak under the limit", "leak and full", "full", "unsteady growth under the limit"])
def test_the_memory_question_is_decided_by_an_oom_retries_a_leak_then_the_peak(memory, growth, said):
    assert _said(Memory().ask(_view(memory, growth), ())) == said


def test_why_busy_is_unknown_names_each_rank_in_number_order_else_the_device():
    unknown = {"10": "NVML: not supported", "2": "no sample", "x": "lost"}
    view = _view()
    named = dataclasses.replace(view, metrics=dataclasses.replace(view.metrics, device_busy_unknown=unknown))
    assert busy_missing(named) == "rank x: lost; rank 2: no sample; rank 10: NVML: not supported"
    assert busy_missing(dataclasses.replace(view, device_type="cuda", device_status="no NVIDIA GPU: x")) == \
        "no NVIDIA GPU: x"
    assert busy_missing(dataclasses.replace(view, device_type="cuda", device_status=None)) == \
        "no GPU utilization samples for this job's GPU"
    assert busy_missing(view) == "no step timing yet"


def test_a_loss_is_the_cause_only_over_its_threshold_and_when_none_over_theirs_is_larger():
    q = Memory()            # any question: ask_largest judges the loss, the question only words it
    data = Loss("data_wait", "data wait", 0.2, "s")
    comm = Loss("comm_exposed", "exposed communication", 0.3, "s")
    small = Loss("device_idle", "device idle", 0.09, "s")
    unknown = Loss("loop", "the loop's own work", None, "not measured")
    losses = (data, comm, small, unknown)
    assert qualifying(losses) == [comm, data]
    assert _said(ask_largest(q, data, losses, "why")) == \
        ("no", 0.2, MEMORY_PEAK_MAX, "why", "exposed communication 30% is larger", True)
    assert _said(ask_largest(q, comm, losses)) == ("yes", 0.3, MEMORY_PEAK_MAX, "", "", True)
    assert _said(ask_largest(q, small, losses)) == ("no", 0.09, MEMORY_PEAK_MAX, "", "", True)
    assert _said(ask_largest(q, data, (data, Loss("comm_exposed", "c", 0.2, "s")))) == \
        ("yes", 0.2, MEMORY_PEAK_MAX, "", "", True)
    assert qualifying((Loss("data_wait", "d", 0.05, "s"), Loss("memory", "m", 0.9, "s"))) == \
        [Loss("data_wait", "d", 0.05, "s")]
