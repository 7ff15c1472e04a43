"""The flowchart's questions asked one at a time (perfmon_analysis.questions): the memory question's
every deciding branch (an OOM, rising allocator retries, a leak, the peak), why a busy share is
unknown, and a loss judged against the others. The views are a synthetic job's (tests/unit/verdict_synth.py)
with the quantity under test put in."""

from __future__ import annotations

import dataclasses

import pytest

from perfmon_analysis import units
from perfmon_analysis.flowchart import HOST_AHEAD_SHARE, MEMORY_PEAK_MAX, Answer
from perfmon_analysis.health import JobHealth
from perfmon_analysis.losses import Loss
from perfmon_analysis.memory_growth import MemoryGrowth
from perfmon_analysis.questions import (
    CommExposed,
    DeviceBusy,
    HostWaiting,
    LoopFeeds,
    LoopWaiting,
    Memory,
    Mfu,
    Straggler,
    Syncs,
    ask_largest,
    busy_missing,
    in_loop,
    qualifying,
)
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


# -- each question on planted losses and metrics -------------------------------------------------------
def _losses(**shares: float | None) -> tuple[Loss, ...]:
    """Every loss the questions read, each unmeasured unless given."""
    ids = ("data_wait", "comm_exposed", "loop", "device_idle", "step_gaps")
    return tuple(Loss(i, i.replace("_", " "), shares.get(i), "planted" if shares.get(i) is not None else "not planted")
                 for i in ids)


def _with(view: JobView, **metrics) -> JobView:
    return dataclasses.replace(view, metrics=dataclasses.replace(view.metrics, **metrics))


def test_busy_while_the_loop_runs_takes_the_pauses_out_and_never_passes_one():
    assert (in_loop(None, 0.2), in_loop(0.5, None), in_loop(0.5, 1.0), in_loop(0.5, 1.5)) == (None, 0.5, 0.5, 0.5)
    assert (in_loop(0.4, 0.5), in_loop(0.9, 0.5), in_loop(0.5, 0.0)) == (0.8, 1.0, 0.5)


def test_device_busy_says_when_it_was_judged_with_the_pauses_out():
    view = _with(_view(), device_busy=0.6, device_busy_source="thread_cpu")
    paused = DeviceBusy().ask(view, _losses(step_gaps=0.25))
    assert (paused.answer, paused.reason, paused.measure) == \
        ("no", "thread_cpu", "busy while the loop runs (pauses between steps out)")
    assert paused.value == pytest.approx(0.8)
    plain = DeviceBusy().ask(view, _losses(step_gaps=0.0))
    assert (plain.answer, plain.value, plain.measure) == ("yes", 0.6, "")


def test_syncs_that_leave_the_device_busy_cost_little_and_unknown_idle_leaves_them_unasked():
    cuda = dataclasses.replace(_with(_view(), syncs_per_step=3.0), device_type="cuda")
    little = Syncs().ask(cuda, _losses(device_idle=0.05))
    assert _said(little) == ("no", 3.0, 1.0, "the device idles only 5% of the step: the syncs cost little",
                             "device idle 5% < 10%", True)
    assert _said(Syncs().ask(cuda, _losses(device_idle=0.1))) == ("yes", 3.0, 1.0, "", "", True)
    assert _said(Syncs().ask(cuda, _losses())) == (
        None, None, 1.0, "device idle in time not measured: the time syncs cost cannot be told", "", True)


def test_the_loops_wait_and_feed_questions_say_what_they_judged():
    view = _with(_view(), loop_wait_frac=0.75, loop_prep_frac=0.25)
    assert _said(LoopWaiting().ask(view, _losses())) == (
        "yes", 0.75, 0.5, "the training thread's time off CPU between steps", "", True)
    assert _said(LoopFeeds().ask(view, _losses())) == (
        "no", 0.25, 0.5, "busy between-step samples before the step's lines", "", True)


def test_a_comm_status_with_idle_unexplained_on_several_ranks_is_not_measured():
    two = dataclasses.replace(_view(), world_size=2, comm_status="NCCL: all_to_all not hooked")
    a = CommExposed().ask(two, _losses(comm_exposed=0.05, device_idle=0.3))
    assert (a.answer, a.reason, a.otherwise) == (
        None, "NCCL: all_to_all not hooked (the 5% timed is the other collectives)", "not_measured")
    for view, losses in ((dataclasses.replace(two, comm_status=None), _losses(comm_exposed=0.05, device_idle=0.3)),
                         (dataclasses.replace(two, world_size=1), _losses(comm_exposed=0.05, device_idle=0.3)),
                         (two, _losses(comm_exposed=0.05, device_idle=0.09)),
                         (two, _losses(comm_exposed=0.3, device_idle=0.3))):
        assert CommExposed().ask(view, losses).answer is not None
    assert CommExposed().ask(two, _losses(comm_exposed=0.05, device_idle=0.1)).otherwise == "not_measured"
    one_rank_of_two = dataclasses.replace(two, world_size=1, ranks=two.ranks * 2)
    assert CommExposed().ask(one_rank_of_two, _losses(comm_exposed=0.05, device_idle=0.3)).otherwise == "not_measured"
    assert CommExposed().ask(dataclasses.replace(two, world_size=3), _losses(comm_exposed=0.05, device_idle=0.09)) \
        .answer == "no"


def test_a_cpu_jobs_host_wait_is_its_whole_unexplained_loss_and_a_cuda_jobs_counts_its_samples():
    assert _said(HostWaiting().ask(_view(), _losses(device_idle=0.2))) == (
        "yes", 1.0, 0.5, "CPU job: the unexplained loss is the training thread's time off CPU", "", True)
    cuda = dataclasses.replace(_with(_view(), host_wait_frac=0.25, host_queued_whole_frac=0.25), device_type="cuda",
                               where=None)
    assert _said(HostWaiting().ask(cuda, _losses())) == ("no", 0.25, 0.5, "0 stack samples", "", True)
    ahead = HostWaiting().ask(_with(cuda, host_queued_whole_frac=HOST_AHEAD_SHARE), _losses())
    assert (ahead.answer, ahead.applies) == (None, False)


def test_a_cpu_job_has_no_tensor_cores_to_ask_about():
    cpu = _with(_view(), mfu=None)
    assert Mfu().ask(cpu, _losses()).reason == "CPU job: no peak FLOP/s known (set PERFMON_PEAK_TFLOPS for an MFU)"


def test_two_ranks_seen_in_a_job_without_a_world_size_have_a_peer():
    two = dataclasses.replace(_with(_view(), compute_ratio=None), world_size=1, ranks=_view().ranks * 2)
    assert (Straggler().ask(two, _losses()).reason, Straggler().ask(two, _losses()).applies) == \
        ("needs compute time of two or more ranks", True)
