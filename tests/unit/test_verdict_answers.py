"""Every question's answer, as the verdict asked it, for each view of tests/unit/test_verdict_explain.py:
yes/no/unasked, the value judged, the reason, what the value measures, what decided it, where an
unasked question sends the walk, and whether it applies or is silent. The panes and the flowchart
screen show these words beside each number, so a reason that names the wrong quantity or a decision
that drops what decided it fails here.

``verdict_answers.json`` holds them, one line per question, as [answer, value (4 places), threshold,
reason, measure, decided_by, otherwise, applies, silent]: written from the code and read line by line; a
change of wording changes that file with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfmon_analysis import verdict as V
from perfmon_analysis.flowchart import Answer
from tests.unit.test_verdict_explain import VIEWS

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
