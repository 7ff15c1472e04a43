"""The run beyond its window (``perfmon_analysis.health``): step-time percentiles and the outliers with what
ran in them, memory growth told from a warm-up, the crash that ended the job, and how the report, the
findings and the verdict say each. Synthetic records with exact values (tests/unit/verdict_synth.py)."""

from __future__ import annotations

import dataclasses
import random

import jsonschema
import pytest

from perfmon_analysis import verdict as V
from perfmon_analysis.analysis import Analysis
from perfmon_analysis.crash import Crash, job_crash
from perfmon_analysis.health import JobHealth, text_lines
from perfmon_analysis.memory_growth import MemoryGrowth, _growing_kind, _line, _per_second, _step_at
from perfmon_analysis.readings import (
    EventReading,
    JobExit,
    MemoryReading,
    StepReading,
    event_reading,
    memory_reading,
    step_reading,
)
from perfmon_analysis.report import build
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.sketch import SKETCH_ACCURACY, DurationSketch
from perfmon_analysis.step_times import (
    Outlier,
    StepTimes,
    _cause,
    job_outliers,
    job_times,
    rank_outliers,
    run_times,
    window_times,
)
from tests.helpers import records as R
from tests.helpers.reports import REPORT_SCHEMA, analysed
from tests.unit.verdict_synth import T0, Rank, job, records

MB = 1 << 20
STREAM = "/tmp/synth.r0.x0.p1000.sock"


def feed(recs: list[dict], model: RunModel | None = None) -> RunModel:
    model = model or RunModel()
    for rec in recs:
        model.ingest(STREAM, rec)
    return model


def stretched(recs: list[dict], step: int, extra: float, gap: bool = True) -> list[dict]:
    """The records with step ``step`` longer by ``extra`` seconds (time between steps when ``gap``, else
    its data wait), every later record moved by as much."""
    out = []
    for rec in recs:
        rec = dict(rec)
        if rec["k"] == "step" and rec["step"] == step:
            rec["dur"] += extra
            rec["phases"] = dict(rec["phases"])
            if gap:
                rec["gap"] = rec.get("gap", 0.0) + extra
            else:
                rec["phases"]["data"] = rec["phases"].get("data", 0.0) + extra
        past = rec["k"] == "step" and rec["step"] >= step or rec["k"] != "step" and rec["t"] > T0 + 0.1 * step
        if rec["k"] != "hello" and past:
            rec["t"] += extra
            if "start" in rec and rec["step"] > step:
                rec["start"] += extra
        out.append(rec)
    return out


# -- percentiles --------------------------------------------------------------------------------
def test_the_sketch_reads_every_percentile_within_its_accuracy_in_bounded_memory():
    rng = random.Random(7)
    values = [rng.lognormvariate(-3, 0.8) for _ in range(20_000)]
    sketch = DurationSketch()
    for i, v in enumerate(values):
        sketch.add(v, i)
    exact = sorted(values)
    for q in (0.5, 0.9, 0.99):
        true = exact[round(q * (len(exact) - 1))]
        assert sketch.quantile(q) == pytest.approx(true, rel=SKETCH_ACCURACY)
    assert sketch.max == max(values) and sketch.max_step == values.index(max(values))
    assert len(sketch.bins) < 1500


def test_window_percentiles_are_exact_and_name_the_longest_step():
    recs = stretched(records(Rank(steps=60, dur=0.1)), 50, 0.9)
    view = feed(recs).view()
    times = view.health.window
    assert times.n == 50 and times.p50 == pytest.approx(0.1) and times.max == pytest.approx(1.0)
    assert times.max_step == 50 and times.p99 == pytest.approx(0.1 + 0.9 * 0.51)
    assert view.health.run.max == pytest.approx(1.0) and view.health.run.n == 59      # the first step left out
    assert view.ranks[0].step_times == times



def test_without_steps_there_are_no_percentiles_and_the_job_takes_the_slowest_rank_at_each():
    assert window_times([]) == StepTimes(0) and run_times(DurationSketch()) == StepTimes(0)
    assert job_times([]) == StepTimes(0) and job_times([StepTimes(0)]) == StepTimes(0)
    fast = StepTimes(12, 0.1, 0.2, 0.5, 0.9, 4)
    slow = StepTimes(10, 0.2, 0.25, None, 0.6, 7)      # its p99 not known yet
    # the most steps, the worst known value of each percentile, the longest step and its number
    assert job_times([slow, fast]) == StepTimes(12, 0.2, 0.25, 0.5, 0.9, 4)
    assert job_times([StepTimes(3, 0.1, None, None, None, None), slow]) == StepTimes(10, 0.2, 0.25, None, 0.6, 7)
    sketch = DurationSketch()
    for i in range(1, 101):
        sketch.add(i / 1000, i)
    times = run_times(sketch)
    assert (times.n, times.max, times.max_step) == (100, 0.1, 100)
    assert (times.p50, times.p90, times.p99) == pytest.approx((0.05, 0.09, 0.099), rel=SKETCH_ACCURACY)


def test_window_percentiles_interpolate_between_the_ordered_steps():
    durs = [0.1, 0.3, 0.2, 0.5, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0, 0.15]
    steps = [step_reading(R.step(i, start=T0 + i, dur=d)) for i, d in enumerate(durs)]
    times = window_times([s for s in steps if s is not None])
    assert (times.n, times.p50, times.p90, times.max, times.max_step) == (11, 0.5, 0.9, 1.0, 9)
    assert times.p99 == pytest.approx(0.99)             # nine tenths of the way from 0.9 to 1.0


def test_an_even_windows_median_is_halfway_and_the_jobs_outliers_are_longest_first():
    steps = [step_reading(R.step(i, start=T0 + i, dur=(i + 1) / 10)) for i in range(10)]
    times = window_times([s for s in steps if s is not None])
    assert times.p50 == pytest.approx(0.55) and times.p90 == pytest.approx(0.91)
    def outlier(ratio: float) -> Outlier:
        return Outlier(0, 1, 1.0, ratio, "pause", "x", None)
    assert [o.ratio for o in job_outliers([[outlier(4.0)], [outlier(6.0), outlier(5.0)]])] == [6.0, 5.0, 4.0]
    sketch = DurationSketch()
    for i in range(99):
        sketch.add(0.01, i + 1)
    sketch.add(1.0, 100)
    assert run_times(sketch).p99 == pytest.approx(0.01, rel=SKETCH_ACCURACY)     # not the one long step

def test_the_first_step_is_never_an_outlier_the_second_can_be():
    assert feed(stretched(records(Rank(steps=40)), 0, 0.9)).view().health.outliers == ()
    assert [o.step for o in feed(stretched(records(Rank(steps=40)), 1, 0.9)).view().health.outliers] == [1]

def test_the_json_of_step_times_and_of_an_outlier():
    assert StepTimes(50, 0.1, 0.2, 0.3, 0.6, 9).as_json() == \
        {"steps": 50, "p50_s": 0.1, "p90_s": 0.2, "p99_s": 0.3, "max_s": 0.6, "max_step": 9}
    assert Outlier(1, 9, 0.6, 5.5563, "data", "data wait 500ms (median 10ms)", 0.5).as_json() == \
        {"rank": 1, "step": 9, "dur_s": 0.6, "ratio": 5.56, "cause": "data", "what": "data wait 500ms (median 10ms)",
         "cause_s": 0.5}

# -- outliers -----------------------------------------------------------------------------------
def test_a_step_after_an_evaluation_is_an_outlier_naming_it():
    recs = stretched(records(Rank(steps=40)), 30, 0.8)
    recs.append({"k": "event", "t": T0 + 3.05 + 0.8, "name": "eval", "seconds": 0.8, "forwards": 12,
                 "source": "zero-code"})
    recs.sort(key=lambda r: (r["k"] != "hello", r["t"]))
    (outlier,) = feed(recs).view().health.outliers
    assert (outlier.step, outlier.cause, outlier.cause_s) == (30, "eval", 0.8)
    assert outlier.ratio == pytest.approx(9.0, rel=0.02)     # over the run's median, read within 1%
    assert outlier.what == "evaluation before it: 12 training-mode forwards with no backward after them (800ms " \
                           "between steps)"


def test_outliers_name_a_checkpoint_pause_or_the_data_wait_that_grew():
    recs = stretched(stretched(records(Rank(steps=40, data=0.01)), 12, 0.5), 30, 0.6, gap=False)
    recs.append({"k": "event", "t": T0 + 1.25, "name": "checkpoint", "seconds": 0.5})
    recs.sort(key=lambda r: (r["k"] != "hello", r["t"]))
    by_step = {o.step: o for o in feed(recs).view().health.outliers}
    assert by_step[12].cause == "pause" and by_step[12].what == "checkpoint (500ms between steps)"
    assert by_step[30].cause == "data" and by_step[30].what == "data wait 610ms (median 10ms)"


def _step(**fields) -> StepReading:
    reading = step_reading(R.step(5, start=T0, **fields))
    assert reading is not None
    return reading


def _event(name: str, **fields) -> EventReading:
    return event_reading({"k": "event", "t": T0, "name": name, **fields})


# the phases' typical seconds (the medians of the recent steps), against a 100 ms median step
TYPICAL = {"forward": 0.02, "backward": 0.05, "data": 0.01, "exposed comm": 0.01, "other": 0.4}


def test_an_outliers_cause_is_the_part_that_grew_the_most_over_its_typical_time():
    grown = _step(dur=0.5, phases={"forward": 0.4, "backward": 0.05, "data": 0.01})
    assert _cause(grown, 0.1, [], TYPICAL) == ("forward", "forward 400ms (median 20ms)", 0.4)
    # the rest of the step as usual, its exposed communication 340 ms over its typical 10 ms
    comm = _step(dur=0.5, phases={"forward": 0.02, "backward": 0.05}, comm={"seconds": 0.4, "exposed": 0.35})
    assert _cause(comm, 0.1, [], TYPICAL) == ("comm", "exposed communication 350ms", 0.35)
    spread = _step(dur=0.5, phases={"forward": 0.15, "backward": 0.15, "data": 0.1})   # no part holds most of it
    assert _cause(spread, 0.1, [], TYPICAL) == \
        ("unknown", "no measured part of the step holds most of its extra time", None)
    # a phase the recent steps did not have is typically 0
    assert _cause(_step(dur=0.5, phases={"forward": 0.02, "backward": 0.05}), 0.1, [], {}) == \
        ("other", "other 430ms (median 0µs)", 0.43)


def test_a_pause_before_an_outlier_is_named_by_its_events_or_said_to_be_unnamed():
    paused = _step(dur=0.5, gap=0.4, phases={"forward": 0.02})
    assert _cause(paused, 0.1, [_event("evaluation", seconds=0.4)], TYPICAL) == \
        ("eval", "evaluation before it (400ms between steps)", 0.4)
    assert _cause(paused, 0.1, [_event("eval")], TYPICAL) == ("eval", "evaluation before it (0µs between steps)", 0.0)
    assert _cause(paused, 0.1, [], TYPICAL) == \
        ("pause", "time between steps nothing names (400ms between steps)", 0.4)
    events = [_event("gc", seconds=0.1), _event("checkpoint", seconds=0.2), _event("checkpoint")]
    assert _cause(paused, 0.1, events, TYPICAL) == ("pause", "checkpoint + gc (400ms between steps)", 0.4)

def test_each_part_grows_over_its_own_typical_time_missing_ones_typically_zero():
    usual = {"forward": 0.2, "data": 0.2, "other": 0.35, "exposed comm": 0.2}
    # 100 ms over a 900 ms median: the forward grew 150 ms, the data wait 100 ms
    both = _step(dur=1.0, phases={"forward": 0.35, "data": 0.3})
    assert _cause(both, 0.9, [], usual) == ("forward", "forward 350ms (median 200ms)", 0.35)
    assert _cause(both, 0.9, [], {"forward": 0.2, "other": 0.35}) == \
        ("data", "data wait 300ms (median 0µs)", 0.3)                    # no data wait usually: all of it grew
    comm = _step(dur=1.0, phases={"forward": 0.35}, comm={"seconds": 0.3, "exposed": 0.3})
    assert _cause(comm, 0.9, [], {**usual, "other": 0.65}) == ("forward", "forward 350ms (median 200ms)", 0.35)
    assert _cause(comm, 0.9, [], {"forward": 0.2, "other": 0.65}) == ("comm", "exposed communication 300ms", 0.3)


def test_time_between_steps_of_half_the_excess_is_the_pause():
    typical = {"forward": 0.02, "other": 0.28}
    assert _cause(_step(dur=0.5, gap=0.2, phases={"forward": 0.02}), 0.1, [], typical)[0] == "pause"   # exactly half
    assert _cause(_step(dur=0.5, gap=0.25, phases={"forward": 0.02}), 0.1, [], {"forward": 0.02, "other": 0.2}) == \
        ("pause", "time between steps nothing names (250ms between steps)", 0.25)


def _outliers_with(step: int, events: list[dict]) -> list[tuple[int, str]]:
    recs = stretched(records(Rank(steps=40)), step, 0.6) + events
    recs.sort(key=lambda r: (r["k"] != "hello", r["t"]))
    return [(o.step, o.what) for o in feed(recs).view().health.outliers]


def test_only_a_blocking_event_in_the_outliers_own_gap_names_its_pause():
    unnamed = [(30, "time between steps nothing names (600ms between steps)")]
    assert _outliers_with(30, [{"k": "event", "t": T0 + 3.3, "name": "warning", "message": "x"}]) == unnamed
    # a checkpoint during step 29, the step before: not this pause
    assert _outliers_with(30, [{"k": "event", "t": T0 + 2.95, "name": "checkpoint", "seconds": 0.05}]) == unnamed
    # the first step searched has no step before it: its own start bounds its gap
    assert _outliers_with(1, [{"k": "event", "t": T0 + 0.15, "name": "checkpoint", "seconds": 0.5}]) == \
        [(1, "checkpoint (600ms between steps)")]
    model = feed(stretched(records(Rank(steps=40)), 30, 0.6))
    assert rank_outliers(next(iter(model._streams.values())), 0.0) == []      # no median: nothing is long

def test_steps_within_three_medians_are_not_outliers():
    recs = stretched(records(Rank(steps=40)), 20, 0.19)
    assert feed(recs).view().health.outliers == ()


# -- memory growth ------------------------------------------------------------------------------
def with_rss(recs: list[dict], rss) -> list[dict]:
    """The records with each sample's RSS ``rss(i)`` at its i-th sample."""
    out, i = [], 0
    for rec in recs:
        if rec["k"] == "sample":
            rec = dict(rec, host=dict(rec["host"], rss=int(rss(i))))
            i += 1
        out.append(rec)
    return out


def test_an_exactly_linear_rss_is_read_point_for_point_from_the_second_step_on():
    """4 MiB more RSS at every step's end from 500 MiB: the first step (step 0, its lazy start) left out,
    59 points over 58 steps, the fit exact, the 16 GiB limit 3,912 steps away."""
    recs = with_rss(records(Rank(steps=60)), lambda i: 500 * MB + i * 4 * MB)
    growth = feed(recs).view().health.growth
    assert growth is not None and (growth.series, growth.steady, growth.kind) == ("rss", True, None)
    assert (growth.steps, growth.points, growth.first, growth.last) == (58, 59, 504 * MB, 736 * MB)
    assert (growth.per_step, growth.fit) == (pytest.approx(4 * MB, rel=1e-9), pytest.approx(1.0, rel=1e-9))
    assert growth.per_s == pytest.approx(40 * MB, rel=1e-5)                  # 10 steps a second
    assert (growth.limit, growth.steps_to_limit) == (16 << 30, (16 * 1024 - 736) // 4)

def test_the_growths_line_is_the_least_squares_slope_with_its_r_squared():
    assert _line([(0, 1), (1, 3), (2, 5)]) == (2.0, 1.0)
    assert _line([(0, 2), (1, 2), (2, 2)]) == (0.0, 1.0)            # flat: a perfect fit of no growth
    assert _line([(1, 1), (1, 2)]) == (0.0, 0.0)                    # one step: no slope to fit
    assert _line([(0, 0), (1, 2), (2, 1)]) == (0.5, 0.25)


def test_a_readings_step_is_interpolated_between_step_ends_and_steps_run_at_their_pace():
    steps = [step_reading(R.step(n, start=T0 + n * 0.1, dur=0.1)) for n in range(11)]     # ends 0.1 s apart
    ends = [s for s in steps if s is not None]
    assert _step_at(ends, T0 + 0.05) is None                        # before the first step ended
    assert _step_at(ends, T0 + 0.15) == pytest.approx(0.5, abs=1e-4)
    assert _step_at(ends, T0 + 5.0) == 10.0                         # after the last: the last
    assert _per_second(ends) == pytest.approx(10.0) and _per_second(ends[:1]) is None
    untimed = dataclasses.replace(ends[0], t=None)
    assert _per_second([untimed, *ends[1:]]) is None


def test_the_growing_kind_is_the_breakdown_part_that_rose_most_per_step():
    def reading(t: float, **kinds: int) -> MemoryReading:
        return memory_reading({"k": "memory", "t": T0 + t, "device": 0, **kinds})

    steps = [s for s in (step_reading(R.step(n, start=T0 + n * 0.1, dur=0.1)) for n in range(11)) if s is not None]
    grew = [reading(0.2, activations=100, params=50), reading(0.6, activations=100, params=50, grads=10),
            reading(1.0, activations=900, params=50, grads=30)]
    kind, per_step = _growing_kind(grew, steps)                     # 800 B over steps 1 to 9
    assert kind == "activations" and per_step == pytest.approx(100.0, rel=1e-4)
    assert _growing_kind(grew[:1], steps) == (None, None)           # one breakdown: nothing rose
    assert _growing_kind([grew[2], grew[0]], steps) == (None, None)  # out of order: no span
    assert _growing_kind([reading(0.2, params=50), reading(1.0, params=40)], steps) == (None, None)

def test_rss_growing_every_step_is_a_steady_growth_with_its_rate():
    recs = with_rss(records(Rank(steps=60)), lambda i: 500 * MB + i * 3.6e6 + (i % 3) * 100_000)
    growth = feed(recs).view().health.growth
    assert growth is not None and growth.steady and growth.series == "rss"
    assert growth.per_step == pytest.approx(3.6e6, rel=0.01) and growth.per_s == pytest.approx(3.6e7, rel=0.01)
    assert growth.steps_to_limit == pytest.approx((16 * 1024 - 500 - 59 * 3.6e6 / MB) * MB / 3.6e6, rel=0.02)


@pytest.mark.parametrize("shape", ["warm-up that levels off", "noise", "one jump"])
def test_memory_that_levels_off_wobbles_or_jumps_once_is_not_a_leak(shape):
    rss = {"warm-up that levels off": lambda i: 500 * MB + min(i, 15) * 8 * MB,
           "noise": lambda i: 500 * MB + (i * 7919 % 13) * MB,
           "one jump": lambda i: 500 * MB + (200 * MB if i >= 30 else 0)}[shape]
    growth = feed(with_rss(records(Rank(steps=60)), rss)).view().health.growth
    assert growth is not None and not growth.steady


def test_cuda_allocated_growth_names_the_breakdown_kind_that_grows():
    recs = records(Rank(steps=60, rss=None), device="cuda")
    for i in range(0, 60, 4):
        recs.append({"k": "memory", "t": T0 + 0.1 * (i + 1) + 0.01, "device": 0, "allocated": 2000 * MB + i * 5 * MB,
                     "reserved": 4000 * MB, "params": 500 * MB, "grads": 500 * MB, "optimizer": 1000 * MB,
                     "activations": 200 * MB + i * 5 * MB, "other": 0})
    recs.sort(key=lambda r: (r["k"] != "hello", r["t"]))
    growth = feed(recs).view().health.growth
    assert growth.steady and growth.series == "allocated" and growth.label == "CUDA allocated"
    assert growth.per_step == pytest.approx(5 * MB) and growth.kind == "activations"
    assert growth.kind_per_step == pytest.approx(5 * MB)


def test_without_allocated_bytes_the_reserved_ones_are_read_and_a_flat_breakdown_names_no_kind():
    recs = records(Rank(steps=60, rss=None), device="cuda")
    for i in range(0, 60, 4):
        recs.append({"k": "memory", "t": T0 + 0.1 * (i + 1) + 0.01, "device": 0, "reserved": 4000 * MB + i * 5 * MB,
                     "params": 500 * MB, "grads": 500 * MB, "other": 0})
    recs.sort(key=lambda r: (r["k"] != "hello", r["t"]))
    growth = feed(recs).view().health.growth
    assert growth is not None and growth.steady and (growth.series, growth.label) == ("reserved", "CUDA reserved")
    assert growth.per_step == pytest.approx(5 * MB) and (growth.kind, growth.kind_per_step) == (None, None)

def test_a_leak_is_the_memory_verdict_with_a_finding_whatever_the_limit_and_crit_past_it():
    recs = with_rss(records(Rank(steps=60, mem_limit=None)), lambda i: 500 * MB + i * 4 * MB)
    v = V.evaluate(feed(recs).view())
    assert v.bottleneck == "memory" and v.severity == "warn"
    assert v.headline.startswith("Memory leak: host RSS grows 4.2MB every step")
    assert "memory_growth" in v.finding_ids
    past = with_rss(records(Rank(steps=60, mem_limit=700 * MB)), lambda i: 500 * MB + i * 4 * MB)
    v = V.evaluate(feed(past).view())
    assert v.bottleneck == "memory" and v.severity == "crit"


# -- crash --------------------------------------------------------------------------------------
EXC = {"k": "event", "name": "exception", "error": "ValueError", "message": "bad batch", "step": 30,
       "file": "/home/u/train.py", "line": 88, "function": "main", "call": "loss = crit(model(x), y)"}


def test_an_exception_after_the_last_step_is_the_crash_verdict_with_its_line():
    recs = records(Rank(steps=30)) + [dict(EXC, t=T0 + 3.05), {"k": "bye", "t": T0 + 3.06}]
    view = feed(recs).view()
    v = V.evaluate(view)
    assert v.bottleneck == "crashed" and v.severity == "crit"
    assert v.headline == "Crashed: ValueError on rank 0 at step 30 (train.py:88 in main): bad batch"
    assert "loss = crit(model(x), y)" in v.suggestions[0]


def test_an_exception_the_script_caught_is_no_crash_nor_is_ctrl_c():
    caught = records(Rank(steps=30))
    caught.insert(20, dict(EXC, t=T0 + 1.0))
    assert feed(caught + [{"k": "bye", "t": T0 + 3.1}]).view().health.crash is None
    interrupt = records(Rank(steps=30)) + [dict(EXC, t=T0 + 3.05, error="KeyboardInterrupt")]
    assert feed(interrupt + [{"k": "bye", "t": T0 + 3.1}]).view().health.crash is None


def test_the_exit_status_perfmon_run_saw_makes_or_unmakes_the_crash():
    model = feed(records(Rank(steps=30), bye=True))
    model.note_exit({"returncode": -9, "t": T0 + 4})
    crash = model.view().health.crash
    assert crash is not None and crash.exit == "killed by SIGKILL" and crash.step == 30
    clean = feed(records(Rank(steps=30)) + [dict(EXC, t=T0 + 3.05), {"k": "bye", "t": T0 + 3.1}])
    clean.note_exit({"returncode": 0})
    assert clean.view().health.crash is None



def test_an_exception_at_the_last_steps_end_ends_the_run_and_one_before_it_was_caught():
    recs = records(Rank(steps=30))
    last = [r for r in recs if r["k"] == "step"][-1]["t"]
    at_end = feed(recs + [dict(EXC, t=last), {"k": "bye", "t": T0 + 3.1}]).view().health.crash
    assert at_end is not None and at_end.error == "ValueError"
    assert feed(recs + [dict(EXC, t=last - 0.05), {"k": "bye", "t": T0 + 3.1}]).view().health.crash is None


def test_an_exception_before_the_first_step_or_followed_by_other_events_is_the_crash():
    hello = records(Rank(steps=30))[0]
    before = feed([hello, dict(EXC, t=T0 + 0.5, step=None), {"k": "bye", "t": T0 + 0.6}]).view().health.crash
    assert before is not None and (before.error, before.step) == ("ValueError", None)
    warned = records(Rank(steps=30)) + [dict(EXC, t=T0 + 3.05), {"k": "event", "t": T0 + 3.06, "name": "warning",
                                                                  "message": "x"}, {"k": "bye", "t": T0 + 3.07}]
    after = feed(warned).view().health.crash
    assert after is not None and after.error == "ValueError"

def test_the_jobs_crash_is_the_lowest_ranks_with_the_failed_exit_or_the_exit_alone():
    crashes = [Crash(2, "KeyError", "k", 5), None, Crash(1, "ValueError", "v", 5), Crash(0, "OSError", "o", 4)]
    assert job_crash(crashes, None, 5) == Crash(0, "OSError", "o", 4)
    assert job_crash(crashes, JobExit(code=1, signal=None, t=9.0), 5) == Crash(0, "OSError", "o", 4, exit="exit code 1")
    assert job_crash(crashes, JobExit(code=0, signal=None, t=9.0), 5) is None          # it exited cleanly
    assert job_crash([None], JobExit(code=3, signal=None, t=9.0), 7) == Crash(None, None, "", 7, exit="exit code 3")
    assert job_crash([], None, 7) is None


def test_the_text_lines_say_the_percentiles_each_outlier_and_a_steady_growth_with_what_grows():
    growth = MemoryGrowth(rank=1, series="allocated", per_step=1.5e6, per_s=14.6e6, steps=111, points=40,
                          first=300_000_000, last=466_500_000, fit=0.99, steady=True, kind="activations",
                          kind_per_step=1.2e6)
    health = JobHealth(window=StepTimes(50, 0.1, 0.2, 0.3, 0.6, 9), run=StepTimes(500, 0.11, 0.21, 0.31, 0.61, 9),
                       outliers=(Outlier(0, 9, 0.6, 5.56, "pause", "time between steps", 0.5),), growth=growth)
    assert text_lines(health, 0.105) == [     # the window's p50 is the table's median
        "Step time p50/p90/p99/max: window 105ms/200ms/300ms/600ms; run 110ms/210ms/310ms/610ms",
        "Outlier: step 9 (rank 0) 600ms, 5.6x the median: time between steps",
        "Memory grows every step (rank 1): CUDA allocated +1.5MB/step, 14.6MB/s over 111 steps, 300.0MB to "
        "466.5MB; most in activations (+1.2MB/step)"]
    plain = dataclasses.replace(growth, series="swap", per_s=0.4, kind=None)        # under 1 B/s: no rate
    assert text_lines(dataclasses.replace(health, growth=plain), 0.1)[-1] == \
        "Memory grows every step (rank 1): swap +1.5MB/step over 111 steps, 300.0MB to 466.5MB"
    unsplit = dataclasses.replace(growth, per_s=None, kind_per_step=None)
    assert text_lines(dataclasses.replace(health, growth=unsplit), 0.1)[-1] == \
        "Memory grows every step (rank 1): CUDA allocated +1.5MB/step over 111 steps, 300.0MB to 466.5MB"
    assert len(text_lines(dataclasses.replace(health, growth=dataclasses.replace(growth, steady=False)), 0.1)) == 2
    assert text_lines(JobHealth(), None) == []


def test_a_growths_json_rounds_bytes_to_whole_ones_and_the_fit_to_three_places():
    growth = MemoryGrowth(rank=1, series="allocated", per_step=1.5e6 + 0.4, per_s=14.6e6 + 0.6, steps=111,
                          points=40, first=300_000_000, last=466_500_000, fit=0.98765, steady=True,
                          kind="activations", kind_per_step=1.2e6 + 0.5, limit=80_000_000_000, steps_to_limit=53_000)
    assert growth.as_json() == {
        "rank": 1, "series": "allocated", "steady": True, "per_step_bytes": 1_500_000, "per_s_bytes": 14_600_001,
        "steps": 111, "points": 40, "first_bytes": 300_000_000, "last_bytes": 466_500_000, "fit": 0.988,
        "kind": "activations", "kind_per_step_bytes": 1_200_000, "limit_bytes": 80_000_000_000,
        "steps_to_limit": 53_000}
    assert dataclasses.replace(growth, per_s=None, kind_per_step=None).as_json()["per_s_bytes"] is None


def test_each_view_reads_the_health_of_the_records_so_far():
    """The health is cached on the rank between views, each part by what it reads: a new sample, a
    new longest step, the stream's end must each show in the next view."""
    recs = with_rss(stretched(records(Rank(steps=60)), 50, 0.9), lambda i: 500 * MB + i * 4 * MB)
    at = {r["step"]: i + 1 for i, r in enumerate(recs) if r["k"] == "step"}
    model = feed(recs[:at[8]])
    early = model.view().health
    assert (early.outliers, early.growth, early.crash) == ((), None, None)       # too few samples to tell
    feed(recs[at[8]:at[49]], model)
    grown = model.view().health
    assert grown.growth is not None and grown.growth.steady and grown.outliers == ()
    feed(recs[at[49]:at[50]], model)             # step 50, ten times the median: an outlier at once
    assert [o.step for o in model.view().health.outliers] == [50]
    feed(recs[at[50]:] + [dict(EXC, t=recs[-1]["t"] + 0.05), {"k": "bye", "t": recs[-1]["t"] + 0.06}], model)
    ended = model.view().health
    assert ended.crash is not None and ended.crash.error == "ValueError" and [o.step for o in ended.outliers] == [50]


def test_a_new_reading_shows_in_the_growth_after_the_buffers_are_full():
    """The sample buffer holds 120 samples and the memory buffer 32 readings: once full, their lengths
    stop changing, and the newest reading must still reach the next view's growth."""
    recs = with_rss(records(Rank(steps=140)), lambda i: 500 * MB + i * 4 * MB)
    at = {r["step"]: i + 1 for i, r in enumerate(recs) if r["k"] == "step"}
    model = feed(recs[:at[129]])
    before = model.view().health.growth
    feed(recs[at[129]:], model)
    after = model.view().health.growth
    assert before is not None and after is not None and (before.last, after.last) == (1012 * MB, 1056 * MB)
    cuda = records(Rank(steps=150, rss=None), device="cuda")
    for i in range(0, 150, 2):
        cuda.append({"k": "memory", "t": T0 + 0.1 * (i + 1) + 0.01, "device": 0, "allocated": 2000 * MB + i * 5 * MB,
                     "reserved": 4000 * MB})
    cuda.sort(key=lambda r: (r["k"] != "hello", r["t"]))
    model = feed(cuda)
    assert model.view().health.growth.last == 2740 * MB
    feed([{"k": "memory", "t": T0 + 15.05, "device": 0, "allocated": 3000 * MB, "reserved": 4000 * MB}], model)
    assert model.view().health.growth.last == 3000 * MB

# -- the report -----------------------------------------------------------------------------------
def test_the_report_has_the_percentiles_outliers_growth_and_crash_in_its_json_and_text():
    recs = with_rss(stretched(records(Rank(steps=60)), 40, 0.7), lambda i: 500 * MB + i * 4 * MB)
    recs += [dict(EXC, t=T0 + 6.8), {"k": "bye", "t": T0 + 6.9}]
    report, text = analysed(Analysis.of_records([(STREAM, recs)]))
    jsonschema.validate(report, REPORT_SCHEMA)
    m = report["metrics"]
    assert m["step_time_max_s"] == pytest.approx(0.8) and m["run_step_time_max_s"] == pytest.approx(0.8)
    assert m["run_step_time_p50_s"] == pytest.approx(0.1, rel=SKETCH_ACCURACY)
    assert report["ranks"][0]["step_time_p99_s"] == pytest.approx(0.1 + 0.7 * 0.51)
    assert report["step_outliers"][0]["step"] == 40 and report["memory_growth"]["steady"] is True
    assert report["crash"]["line"] == 88 and report["verdict"]["bottleneck"] == "crashed"
    assert "Step time p50/p90/p99/max: window 100ms/" in text and "Outlier: step 40 (rank 0) 800ms" in text
    assert "Memory grows every step (rank 0): host RSS +4.2MB/step" in text
    assert "CRASHED [crit]" in text


def test_a_window_of_nothing_has_no_percentiles():
    assert window_times([]).max is None
    report = build(RunModel().view(), V.evaluate(RunModel().view()))
    assert report["step_outliers"] == [] and report["memory_growth"] is None and report["crash"] is None


def test_relay_summaries_carry_the_step_times():
    relay = job(Rank(steps=40))
    sid = next(iter(relay._streams))
    viewer = RunModel()
    for rec in records(Rank(steps=40)):
        if rec["k"] in ("hello", "sample"):
            viewer.ingest(sid, rec)
    viewer.ingest(sid, relay.summary(sid, relay.last_t)[1])
    assert viewer.view().ranks[0].step_times == relay.view().ranks[0].step_times
    assert viewer.view().health.run == relay.view().health.run
