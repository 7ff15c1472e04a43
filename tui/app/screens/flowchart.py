"""Flowchart screen (``f``): the whole diagnosis chart with the live path highlighted,
every threshold with its source, the fixes for the current verdict and the secondary findings."""

from __future__ import annotations

import functools

from rich.console import Group
from rich.text import Text
from rich.tree import Tree
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from perfmon_analysis.verdict import CHART, Verdict, label as outcome_label
from tui.app.widgets import glyphs
from tui.app.widgets.verdictbar import format_value


def chart(verdict: Verdict | None, mono: bool = False) -> Group:
    """The chart as a tree; nodes and exits on the live path are bold and marked ▶."""
    on_path = set(verdict.path) if verdict else set()
    answers = {step.question.id: step for step in verdict.steps()} if verdict else {}
    hot = glyphs.SEVERITY.get(verdict.severity, glyphs.ACCENT) if verdict else glyphs.ACCENT

    def label(question_id: str) -> Text:
        q = CHART.questions[question_id]
        live = question_id in on_path
        text = Text.assemble(("▶ " if live else "  ", f"bold {hot}"))
        text.append(q.text, style="bold" if live else "")
        text.append(f"  [{q.quantity} {glyphs.threshold_text(q, functools.partial(format_value, q))}]",
                    style=glyphs.DIM)
        if question_id in answers:
            said = answers[question_id]
            if said.answer is None:
                text.append(f"  skipped: {said.reason}", style=glyphs.WARN)
            else:
                text.append(f"  now {format_value(q, said.value)} → {said.answer}",
                            style=f"bold {glyphs.BAD if said.answer == 'yes' else glyphs.OK}")
        text.append(f"\n    source: {q.source}", style=glyphs.DIM)
        return text

    def leaf(name: str, exit_label: str, live: bool) -> Text:
        text = Text.assemble((f"{exit_label} ⇒ ", glyphs.DIM))
        text.append(outcome_label(name), style=f"bold reverse {hot}" if live else "bold")
        return text

    def grow(tree: Tree, question_id: str) -> None:
        q = CHART.questions[question_id]
        for exit_label, target in (("yes", q.yes), ("no ", q.no)):
            if target in CHART.outcomes:   # an outcome (the root question shares its name with the memory outcome)
                live = question_id in on_path and verdict is not None and target == verdict.bottleneck
                tree.add(leaf(target, exit_label, live))
            else:
                branch = tree.add(Text.assemble((f"{exit_label} ", glyphs.DIM), label(target)))
                grow(branch, target)

    root = Tree(label(CHART.root), guide_style=glyphs.DIM)
    grow(root, CHART.root)
    parts: list = [root]
    if verdict is not None:
        parts.append(Text(""))
        head = Text.assemble(("now: ", "bold"))
        head.append(f" {outcome_label(verdict.bottleneck)} ", style=f"bold reverse {hot}")
        head.append(f" {verdict.headline}")
        parts.append(head)
        for i, fix in enumerate(verdict.suggestions, 1):
            parts.append(Text(f"  {i}. {fix}"))
        for finding in verdict.findings:
            parts.append(Text(f"  also {finding.get('id')}: {finding.get('message', '')}", style=glyphs.WARN))
    return Group(*parts)


class FlowchartScreen(Screen[None]):
    """Re-drawn by the app's refresh timer while it is on top (``show``)."""

    BINDINGS = [
        Binding("escape,f", "app.pop_screen", "back"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, verdict: Verdict | None, mono: bool = False) -> None:
        super().__init__()
        self._verdict = verdict
        self._mono = mono

    def compose(self) -> ComposeResult:
        yield Static(Text("diagnosis flowchart (docs/verdict.md): the largest measured loss names the "
                          "bottleneck; ▶ marks the live path", style="bold"), id="flow-title")
        with VerticalScroll(id="flow-body"):
            yield Static(chart(self._verdict, self._mono), id="flow-chart")
        yield Footer(compact=True)

    def show(self, verdict: Verdict) -> None:
        if verdict != self._verdict:
            self._verdict = verdict
            for body in self.query("#flow-chart").results(Static):   # none until the screen is composed
                body.update(chart(verdict, self._mono))

