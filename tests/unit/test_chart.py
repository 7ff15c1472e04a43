"""The chart is made of objects: a new question is one new class put into an existing exit, a new
outcome one new class; the chart refuses exits that lead nowhere, loops and unreachable questions."""

from __future__ import annotations

import pytest

from perfmon_analysis import verdict as V
from perfmon_analysis.flowchart import Answer, Chart, Explained, Losses, Outcome, Question
from perfmon_analysis.views import JobView
from tests.unit.verdict_synth import Rank, job


class ShortSteps(Question):
    """Test-only: are the steps under 5 ms (a loop too small to keep a device busy)?"""

    id = "short_steps"
    text = "Are the steps shorter than 5 ms?"
    quantity = "step_time_median_s"
    threshold = 0.005
    source = "test-only question"
    yes, no, unmeasured = "tiny_steps", "mfu", "mfu"
    op = "<"
    unit = "count"
    short = "short"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        step = view.metrics.step_time_median_s
        if step is None:
            return self.unasked("no step timed")
        return self.judged(step, self.fires(step))


class TinySteps(Outcome):
    id = "tiny_steps"
    label = "TINY STEPS"
    pane = "timeline"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: dict[str, Answer]) -> Explained:
        return f"Tiny steps: {answers['short_steps'].value * 1000:.1f} ms each", ["a larger batch"], {}


def _with_tiny_steps() -> Chart:
    outcomes = [*V.CHART.outcomes.values(), TinySteps()]
    chart = Chart(V.CHART.questions.values(), outcomes, V.CHART.root, ("stuck", "warming_up"))
    return chart.with_question(ShortSteps(), after="fill", exit="no")


def test_a_new_question_and_outcome_are_two_objects_the_walk_asks_and_reaches():
    chart = _with_tiny_steps()
    fast = V.evaluate(job(Rank(dur=0.002, cpu=0.002)).view(), chart)
    assert fast.path == ["memory", "device_busy", "fill", "short_steps"] and fast.bottleneck == "tiny_steps"
    assert fast.headline == "Tiny steps: 2.0 ms each" and fast.suggestions == ["a larger batch"]
    assert fast.answers["short_steps"].answer == "yes" and fast.evidence["step_time_median_s"] == 0.002
    slow = V.evaluate(job(Rank(dur=0.1, cpu=0.1)).view(), chart)
    assert slow.path[-2:] == ["short_steps", "mfu"] and slow.bottleneck == "healthy"
    # the shipped chart is untouched: the new question lives only in the chart that has it
    assert "short_steps" not in V.evaluate(job(Rank(dur=0.002, cpu=0.002)).view()).path


def test_a_chart_refuses_an_exit_that_leads_nowhere_a_loop_and_an_unreachable_question():
    questions = list(V.CHART.questions.values())
    with pytest.raises(ValueError, match="its yes exit 'tiny_steps' leads nowhere"):
        Chart([*questions, ShortSteps()], V.CHART.outcomes.values(), "memory").with_question(
            ShortSteps(), after="device_busy")
    looped = [q.rewired(no="device_busy") if q.id == "mfu" else q for q in questions]
    with pytest.raises(ValueError, match="the chart loops: memory > device_busy > fill > mfu > device_busy"):
        Chart(looped, V.CHART.outcomes.values(), "memory")
    outcomes = [*V.CHART.outcomes.values(), TinySteps()]
    with pytest.raises(ValueError, match=r"questions no walk reaches: \['short_steps'\]"):
        Chart([*questions, ShortSteps()], outcomes, "memory")
    with pytest.raises(ValueError, match="not an exit"):
        ShortSteps().rewired(maybe="mfu")
