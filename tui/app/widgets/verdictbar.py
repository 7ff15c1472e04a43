"""Verdict bar: the bottleneck, its headline, what fixing it buys, the top fix, and the flowchart
path that led there.

Always visible (docked at the bottom). The path shows each question's measured
value and answer so the verdict can be checked against the panes at a glance.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from perfmon_analysis import units
from perfmon_analysis.flowchart import Question
from perfmon_analysis.verdict import Verdict, label as outcome_label
from tui.app.widgets import glyphs

COMPACT_BELOW = 100      # columns: a narrower bar says the gain in short, leaving room for the fix


def format_value(question: Question, value: float | None) -> str:
    if value is None:
        return units.NA
    return units.pct(value) if question.unit == "frac" else units.number(value, 2)


class VerdictBar(Widget):
    DEFAULT_CSS = ("VerdictBar { height: 3; padding: 0 1; background: $panel;"
                   " text-wrap: nowrap; text-overflow: ellipsis; }")

    def __init__(self) -> None:
        super().__init__(id="verdict")
        self._verdict: Verdict | None = None
        self._mono = False
        self.price: float | None = None     # per device-hour: the gain's money, when given

    def show(self, verdict: Verdict, mono: bool) -> None:
        self._verdict, self._mono = verdict, mono
        self.refresh()

    @property
    def verdict(self) -> Verdict | None:
        return self._verdict

    def render(self) -> Text:
        verdict = self._verdict
        if verdict is None:
            return Text("verdict: waiting for the first steps…", style=glyphs.DIM)
        colour = glyphs.SEVERITY.get(verdict.severity, glyphs.ACCENT)
        label = outcome_label(verdict.bottleneck)
        line1 = Text()
        line1.append(f" {label} ", style=f"bold reverse {colour}")
        line1.append(" ")
        line1.append(_without_label(verdict.headline, label))
        if verdict.pending:
            line1.append(f"  (checking: {outcome_label(verdict.pending)})", style=glyphs.DIM)
        line2 = Text()
        gain = verdict.gain_headline(self.price, compact=self.size.width < COMPACT_BELOW)
        if gain is not None:      # first: a narrow bar cuts the fix's tail, never the figure
            line2.append(gain, style=f"bold {glyphs.ACCENT}")
            line2.append(" · ", style=glyphs.DIM)
        line2.append("fix: ", style="bold")
        if verdict.suggestions:
            line2.append(verdict.suggestions[0])
            if len(verdict.suggestions) > 1:
                line2.append(f"  (+{len(verdict.suggestions) - 1} more: f)", style=glyphs.DIM)
        else:
            line2.append("nothing to fix" if verdict.bottleneck == "healthy" else "—", style=glyphs.DIM)
        line3 = Text()
        if verdict.where is not None and verdict.path:       # first: a long path cuts its own tail, never the key
            line3.append("u: where  ", style=f"bold {glyphs.ACCENT}")
        line3.append("path: ", style=glyphs.DIM)
        for i, step in enumerate(verdict.steps()):
            if i:
                line3.append(" › ", style=glyphs.DIM)
            line3.append(f"{step.question.short or step.question.id} {format_value(step.question, step.value)} ")
            if step.answer is None:
                line3.append("skip", style=glyphs.DIM)
            else:
                line3.append(step.answer, style=f"bold {glyphs.BAD if step.answer == 'yes' else glyphs.OK}")
        if verdict.path:
            line3.append(f" ⇒ {verdict.bottleneck}", style=f"bold {colour}")
        elif verdict.bottleneck == "stuck":
            line3.append("press s: each rank's part and stack", style=f"bold {colour}")
        findings = verdict.finding_ids
        if findings:
            line3.append("   also: " + ", ".join(findings), style=glyphs.WARN)
        text = Text("\n").join([line1, line2, line3])
        text.no_wrap = True
        text.overflow = "ellipsis"
        return text


def _without_label(headline: str, label: str) -> str:
    """'Load imbalance: rank 3 ...' after a LOAD IMBALANCE badge reads better as 'rank 3 ...'."""
    prefix, sep, rest = headline.partition(": ")
    if sep and prefix.lower().startswith(label.split()[0].lower()):
        return rest[:1].upper() + rest[1:]
    return headline
