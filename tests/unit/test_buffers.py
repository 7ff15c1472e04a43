"""Per-rank buffers (``perfmon_analysis.buffers``): what one step record adds to a rank's running totals
and window numbers, seen through ``RunModel.view``."""

from __future__ import annotations

import pytest

from perfmon_analysis.buffers import STEP_BUFFER
from perfmon_analysis.runmodel import RunModel
from tests.unit.verdict_synth import T0, Rank, records


def feed(recs: list[dict], model: RunModel | None = None, received: float | None = None) -> RunModel:
    model = model or RunModel()
    for rec in recs:
        model.ingest("s", rec, received=received)
    return model


def test_single_steps_dropped_in_two_places_are_not_lost_time():
    recs = [r for r in records(Rank(steps=20, dur=0.1)) if r.get("step") not in (5, 12)]
    assert feed(recs).view().metrics.ettr == pytest.approx(1.0)


def test_a_step_without_its_start_time_started_one_duration_before_its_end():
    recs = records(Rank(steps=30, dur=0.1))
    for r in recs:
        r.pop("start", None)
    view = feed(recs).view()
    assert view.metrics.ettr == pytest.approx(1.0)
    assert view.window == {"steps": 29, "seconds": pytest.approx(2.9)}


def test_once_a_step_reported_a_data_wait_the_loader_stays_measured():
    """The loader was wrapped: steps that no longer wait for data are a measured zero, not unknown."""
    recs = records(Rank(steps=80, dur=0.1, data=0.01))
    for r in recs:
        if r["k"] == "step" and r["step"] >= 20:
            del r["phases"]["data"]
    assert feed(recs).view().metrics.data_wait_frac == 0.0       # the window (steps 30-79) has no data phase


def test_steps_before_comm_was_instrumented_do_not_make_it_an_estimate():
    recs = records(Rank(steps=30, dur=0.1, comm=0.02), world=2)
    for r in recs:
        if r["k"] == "step" and r["step"] < 15:
            del r["comm"]
    assert feed(recs).view().metrics.comm_estimated is False


def test_a_data_phase_longer_than_the_active_step_reads_as_a_full_wait():
    recs = records(Rank(steps=10, dur=0.1))
    last = [r for r in recs if r["k"] == "step"][-1]
    last["phases"] = {"data": 0.15}
    assert feed(recs).view().traces[0].data_wait[-1] == 1.0


def test_the_window_never_holds_more_steps_than_the_step_buffer():
    model = RunModel(window_steps=STEP_BUFFER + 500)
    view = feed(records(Rank(steps=STEP_BUFFER + 100, dur=0.001, samples=None)), model=model).view()
    assert view.window["steps"] == STEP_BUFFER and view.ranks[0].steps == STEP_BUFFER + 100


def test_a_recorded_rank_viewed_with_a_live_clock_is_not_silent():
    model = feed(records(Rank(steps=10, dur=0.1)))               # a recording: no arrival clock
    r = model.view(now=T0 + 3.0, clock=500.0).ranks[0]
    assert r.silent_s is None and r.since_last_step_s == pytest.approx(2.0)
    hello_only = feed(records(Rank(steps=0)))                    # a process that died before its first step
    assert hello_only.view(now=T0 + 3.0, clock=500.0).ranks[0].silent_s is None


def test_every_per_rank_buffer_is_bounded_by_its_own_limit():
    """A rank that streams for days holds a bounded history: each record kind's deque keeps its limit."""
    from perfmon_analysis import buffers as B
    from tests.helpers import records as Rec

    state = B.RankState(0, "r0", Rec.hello(0, t=T0), 0)
    limits = {"samples": B.SAMPLE_BUFFER, "cpu": B.SAMPLE_BUFFER, "memory": B.MEMORY_BUFFER, "comm": B.COMM_BUFFER,
              "events": B.EVENT_BUFFER, "where": B.WHERE_BUFFER, "ops": B.OPS_BUFFER, "steps": STEP_BUFFER}
    assert {name: getattr(state, name).maxlen for name in limits} == limits


def test_a_repeated_hello_replaces_the_first_and_marks_the_rank_changed():
    from perfmon_analysis import buffers as B
    from tests.helpers import records as Rec

    state = B.RankState(0, "r0", Rec.hello(0, t=T0), 0)
    before = state.version
    again = Rec.hello(0, t=T0 + 5, pid=4242)
    state.set_hello(again)
    assert (state.hello, state.info.pid, state.version) == (again, 4242, before + 1)
