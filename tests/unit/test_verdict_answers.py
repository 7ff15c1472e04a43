"""Every question's answer, as the verdict asked it, for each view of tests/unit/test_verdict_explain.py:
yes/no/unasked, the value judged, the reason, what the value measures, what decided it, where an
unasked question sends the walk, and whether it applies or is silent. The panes and the flowchart
screen show these words beside each number, so a reason that names the wrong quantity or a decision
that drops what decided it fails here.

``verdict_answers.json`` holds them, one line per question, as [answer, value (4 places), threshold,
reason, measure, decided_by, otherwise, applies, silent]; ``verdict_findings.json`` each verdict's findings and
the report's verdict keys no headline shows. Both were written from the code and read line by line; a change
of wording changes the file with it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from perfmon_analysis import verdict as V
from perfmon_analysis.flowchart import Answer
from tests.unit.test_verdict_explain import VIEWS
from tests.unit.verdict_synth import T0, Rank, between, job

GOLDEN = json.loads((Path(__file__).parent / "verdict_answers.json").read_text())


def said(a: Answer) -> list:
    value = None if a.value is None else round(a.value, 4)
    return [a.answer, value, a.threshold, a.reason, a.measure, a.decided_by, a.otherwise, a.applies, a.silent]


def test_the_golden_file_has_every_view_and_every_question():
    assert list(GOLDEN) == list(VIEWS)
    assert all(list(answers) == list(V.CHART.questions) for answers in GOLDEN.values())


@pytest.mark.parametrize("name", list(VIEWS))
def test_each_question_answers_in_its_own_words(name):
    answers = V.evaluate(VIEWS[name]()).answers
    assert {q: said(a) for q, a in answers.items()} == GOLDEN[name]


# The findings beside the outcome (the losses it does not name, where the host spends them, what else is
# wrong) and the report JSON's verdict keys that no headline shows: the loss named, what was not measured
# and why, the straggler's host, what fixing it buys, what stayed undecided, the sampled lines, a stuck job.
FINDINGS = json.loads((Path(__file__).parent / "verdict_findings.json").read_text())
JSON_KEYS = ("loss", "unknown", "straggler_host", "gain_headline", "gains_combined", "gains_basis", "undecided",
             "where", "stuck")


@pytest.mark.parametrize("name", list(VIEWS))
def test_each_verdicts_findings_and_report_keys_golden(name):
    v = V.evaluate(VIEWS[name]())
    out = json.loads(json.dumps(v.as_json()))            # as the report writes it
    assert {"findings": json.loads(json.dumps(v.findings)), "json": {k: out[k] for k in JSON_KEYS}} == FINDINGS[name]


def test_a_loss_the_outcome_does_not_name_says_where_the_samples_found_the_thread():
    """The unexplained device idle names the top waiting line in steps; the loop's work, the top line
    between steps, whatever its state."""
    idle = V.evaluate(dataclasses.replace(VIEWS["data_loading_main_process"](), where=VIEWS["host_wait_cpu"]().where))
    assert idle.bottleneck == "data_loading"
    assert [f["message"] for f in idle.findings if f["id"] == "device_idle"] == [
        "device idle, no other cause also takes 25% of each step (most waiting in time.sleep(0.04) at train.py:21 in "
        "fetch_from_service)"]
    view = job(Rank(gap=0.03, extra_records=[between(T0, T0 + 3.0, [(60, "busy", 10, 0)])])).view()
    loop = V.evaluate(dataclasses.replace(view, metrics=dataclasses.replace(
        view.metrics, data_wait_frac=0.4, loader_workers=0, data_cpu_frac=0.01)))
    assert (loop.bottleneck, loop.loss) == ("data_loading", "data_wait")
    assert [f["message"] for f in loop.findings if f["id"] == "loop"] == [
        "loop work between steps also takes 30% of each step (most busy in train at train.py:60 in train)"]
