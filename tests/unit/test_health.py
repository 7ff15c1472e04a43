"""The run beyond its window (``perfmon_analysis.health``): step-time percentiles and the outliers with what
ran in them, memory growth told from a warm-up, the crash that ended the job, and how the report, the
findings and the verdict say each. Synthetic records with exact values (tests/unit/verdict_synth.py)."""

from __future__ import annotations

import random

import jsonschema
import pytest

from perfmon_analysis import verdict as V
from perfmon_analysis.analysis import Analysis
from perfmon_analysis.report import build
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.sketch import SKETCH_ACCURACY, DurationSketch
from perfmon_analysis.step_times import window_times
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
