"""Step timeline pane: the phases of the most recent steps of one rank, one row per step.

Bars share one time scale (the longest step shown), so a slow step stands out
and the colour mix shows where its time went; time lost between steps
(checkpoints, evaluation) is drawn as a dim tail.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from perfmon_analysis import units
from perfmon_analysis.readings import StepBar
from perfmon_analysis.verdict import Verdict
from perfmon_analysis.views import JobView
from tui.app.widgets import glyphs
from tui.app.widgets.pane import Pane, UiState, focus_rank

ORDER = ("data", "forward", "backward", "optimizer")


class TimelinePane(Pane):
    NAME = "timeline"

    def draw(self, view: JobView, verdict: Verdict | None, ui: UiState, width: int,
             height: int) -> list[Text] | RenderableType:
        rank = focus_rank(view, ui, verdict)
        trace = view.traces.get(rank) if rank is not None else None
        steps = trace.steps if trace is not None else ()
        if not steps:
            return Text("no steps yet", style=glyphs.DIM)
        names = _phase_names(steps)
        head = Text.assemble((f"rank {rank} " if len(view.ranks) > 1 else "", "bold"))
        head.append_text(glyphs.legend(names + ["gap"], ui.mono))
        lines = [head]
        shown = steps[-max(1, height - 1):]
        longest = max(s.dur for s in shown) or 1.0
        label_w = max(len(str(s.step)) for s in shown) + 1
        bar_w = max(4, width - label_w - 8)
        for s in shown:
            # phases + gap = dur (wire contract): the gap is drawn as its own segment
            parts = [(n, s.phase(n) or 0.0) for n in names]
            parts.append(("gap", s.gap))
            row = Text.assemble((f"{s.step!s:>{label_w - 1}} ", glyphs.DIM))
            row.append(f"{units.seconds(s.dur):>7} ")
            row.append_text(glyphs.stacked_bar(parts, longest, bar_w, ui.mono))
            lines.append(row)
        return lines[:height]


def _phase_names(steps: tuple[StepBar, ...]) -> list[str]:
    seen: list[str] = [n for n in ORDER if any(s.phase(n) is not None for s in steps)]
    for s in steps:
        for name, _ in s.phases:
            if name not in seen and name != "other":
                seen.append(name)
    return seen + ["other"]
