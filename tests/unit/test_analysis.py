"""The analysis facade (perfmon_analysis.analysis): records in, views, verdicts and reports out, each
call reaching the run model with what it was given."""

from __future__ import annotations

from perfmon_analysis.analysis import Analysis
from tests.unit.verdict_synth import T0, Rank, records

LOADER_BOUND = Rank(steps=30, data=0.04, loader_workers=2, loader_cpu=0.9)


def test_an_analysis_of_finished_streams_has_its_window_and_every_stream_ended():
    analysis = Analysis.of_records([("s", records(Rank(steps=30)))], window_steps=20, window_seconds=5.0)
    assert analysis.window == (20, 5.0)
    assert {rank: len(steps) for rank, steps in analysis.steps_in_window().items()} == {0: 20}
    assert analysis.stream_ended("s") and not analysis.stream_ended("other")
    assert len(analysis.buffered("s")) == 30 and analysis.buffered("other") == []     # its 30 steps
    analysis.set_window(10, 1e9)
    assert analysis.window == (10, 1e9) and len(analysis.steps_in_window()[0]) == 10
    analysis.forget("s")
    assert analysis.view().ranks == [] and not analysis.stream_ended("s")


def test_a_stream_expected_before_its_hello_holds_its_ranks_place_silent_since_then():
    analysis = Analysis()
    analysis.expect("s3", 3, "j", 42, 2, 100.0)
    analysis.expect("s3", 5, "j", 43, 0, 100.0)          # the stream is held already: no second place
    view = analysis.view(clock=130.0)
    (rank,) = view.ranks
    assert (view.job, rank.rank, rank.pid, rank.restart, rank.answered, rank.silent_s) == ("j", 3, 42, 2, False, 30.0)
    analysis.heard("s3", 120.0)                           # a relay heard from it since
    assert analysis.view(clock=130.0).ranks[0].silent_s == 10.0


def test_problems_are_said_once_and_dropped_when_they_no_longer_hold():
    analysis = Analysis()
    analysis.add_problem("rank 1's recording is torn")
    analysis.add_problem("rank 1's recording is torn")
    assert analysis.problems == ["rank 1's recording is torn"] and analysis.view().problems == analysis.problems
    analysis.drop_problem("a problem never said")
    analysis.drop_problem("rank 1's recording is torn")
    assert analysis.problems == []


def test_a_relays_summary_of_a_rank_is_given_once_per_change():
    analysis = Analysis.of_records([("s", records(Rank(steps=30)))])
    version, summary = analysis.summary("s", T0 + 3.0)
    assert summary["k"] == "summary" and summary["t"] == T0 + 3.0
    assert analysis.summary("s", T0 + 3.0, after=version) is None and analysis.summary("other", T0) is None


def test_the_exit_of_the_jobs_command_is_the_verdicts_crash():
    analysis = Analysis.of_records([("s", records(Rank(steps=30)))])
    analysis.note_exit({"k": "exit", "t": T0 + 3.5, "returncode": 1})
    crash = analysis.view().health.crash
    assert crash is not None and crash.exit == "exit code 1"
    assert analysis.snapshot().verdict.bottleneck == "crashed"


def test_a_steady_verdict_waits_for_two_agreeing_evaluations_and_the_history_keeps_the_changes():
    analysis = Analysis.of_records([("s", records(LOADER_BOUND))])
    assert [analysis.snapshot(steady=True).verdict.bottleneck for _ in range(3)] == \
        ["warming_up", "data_preprocessing", "data_preprocessing"]
    assert [v.bottleneck for v in analysis.history.verdicts] == ["data_preprocessing"]    # warming up: not kept
    fresh = Analysis.of_records([("s", records(LOADER_BOUND))])
    assert fresh.snapshot().verdict.bottleneck == "data_preprocessing"       # a one-off: judged afresh
    warming = Analysis.of_records([("s", records(Rank(steps=3)))])
    assert warming.snapshot().verdict.bottleneck == "warming_up" and not warming.history.verdicts


def test_the_report_and_its_text_are_of_the_window_asked_for_with_the_source_and_the_price():
    analysis = Analysis.of_records([("s", records(LOADER_BOUND))])
    report = analysis.report(T0 + 1.0, source={"kind": "recording"}, price=2.0)
    assert report["as_of"] == T0 + 1.0 and report["source"] == {"kind": "recording"}
    data = next(g for g in report["verdict"]["gains"] if g["loss"] == "data_wait")
    assert data["price"]["per_device_hour"] == 2.0
    snapshot = analysis.snapshot()
    assert analysis.report(snapshot=snapshot)["as_of"] == round(snapshot.view.now, 3)
    text = analysis.text_report(snapshot, price=2.0, width=70)
    assert "cost/day" in text and max(len(line) for line in text.splitlines()) <= 70
    unpriced = analysis.text_report(snapshot)
    assert "money: no price" in unpriced and max(len(line) for line in unpriced.splitlines()) > 70


def test_the_callbacks_numbers_are_the_metrics_and_the_gains():
    analysis = Analysis.of_records([("s", records(LOADER_BOUND))])
    numbers = analysis.callback_numbers(analysis.snapshot())
    assert numbers["perfmon/data_wait_ratio"] == 0.4 and numbers["perfmon/speedup_bound/data_wait"] > 1.0


def test_a_live_ranks_silence_counts_from_when_its_records_were_received():
    analysis = Analysis()
    for record in records(Rank(steps=30)):
        analysis.ingest("s", record, received=100.0)
    assert analysis.view(clock=130.0).ranks[0].silent_s == 30.0
    # silent for 30 s at the clock asked: stuck; without a clock (a recording) there is no silence
    assert analysis.snapshot(clock=130.0).verdict.bottleneck == "stuck"
    assert analysis.report(clock=130.0)["verdict"]["bottleneck"] == "stuck"
    assert analysis.report()["verdict"]["bottleneck"] == "healthy"


def test_the_history_keeps_each_verdict_with_its_time_severity_and_headline():
    analysis = Analysis.of_records([("s", records(LOADER_BOUND))])
    snapshot = analysis.snapshot(T0 + 2.0)
    (kept,) = analysis.history.verdicts
    assert (kept.t, kept.bottleneck, kept.severity, kept.headline) == \
        (T0 + 2.0, "data_preprocessing", snapshot.verdict.severity, snapshot.verdict.headline)
    assert analysis.report(snapshot=snapshot)["as_of"] == T0 + 2.0       # the snapshot's, not a new one
