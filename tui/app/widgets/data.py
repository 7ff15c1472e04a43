"""Data pane: how long each step waits for its batch (history), that share of the step,
loader CPU and worker count: the numbers behind data_loading vs data_preprocessing, each
judged as the verdict answered it (which loader CPU to read, too, is the verdict's choice)."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from perfmon_analysis import units
from perfmon_analysis.verdict import Verdict
from perfmon_analysis.views import JobView
from tui.app.widgets import glyphs
from tui.app.widgets.pane import Pane, UiState, focus_rank


class DataPane(Pane):
    NAME = "data"

    def draw(self, view: JobView, verdict: Verdict | None, ui: UiState, width: int,
             height: int) -> list[Text] | RenderableType:
        m = view.metrics
        lines: list[Text] = []
        wait = Text.assemble(("wait ", "bold"))
        wait.append_text(glyphs.judged(verdict, "data_wait", units.pct))
        wait.append(" of step", style=glyphs.DIM)
        rank = worst_data_rank(view) if ui.selected_rank is None else focus_rank(view, ui, verdict)
        if len(view.ranks) > 1:
            wait.append(" (worst rank)", style=glyphs.DIM)
            wait.append(f"  history: rank {rank}", style=glyphs.DIM)
        lines.append(wait)
        trace = view.traces.get(rank) if rank is not None else None
        history = list(trace.data_wait) if trace is not None else []
        if history:
            label = f"r{rank} "
            chart_rows = max(1, min(6, height - 5))
            if chart_rows == 1:
                spark = glyphs.sparkline(history, width - len(label), 0.0, 1.0)
                lines.append(Text.assemble((label, glyphs.DIM), (spark, glyphs.CATEGORY["data"])))
            else:
                rows = glyphs.column_chart(history, width - 5, chart_rows, 0.0, 1.0)
                for i, row in enumerate(rows):
                    axis = "100%" if i == 0 else "0%" if i == chart_rows - 1 else ""
                    lines.append(Text.assemble((f"{axis:>4} ", glyphs.DIM), (row, glyphs.CATEGORY["data"])))
            if trace is not None and trace.steps:
                last = trace.steps[-1]
                lines.append(Text(f"last step waited {units.seconds(last.phase('data'))} of {units.seconds(last.dur)}",
                                  style=glyphs.DIM))
        elif m.data_wait_frac is None:
            lines.append(Text("loader wait not measured: wrap the loader in mon.loader(...)", style=glyphs.DIM))
        cpu = Text.assemble(("loader CPU ", "bold"))
        cpu.append_text(glyphs.judged(verdict, "loader_cpu", units.pct))
        loader = glyphs.answer(verdict, "loader_cpu")
        if loader is not None and loader.measure:
            cpu.append(f" {loader.measure}", style=glyphs.DIM)
        lines.append(cpu)
        lines.append(Text(f"workers {m.loader_workers if m.loader_workers is not None else units.NA}"))
        return lines[:height]


def worst_data_rank(view: JobView) -> int | None:
    """The rank that waits most for data: its history is drawn when no rank is selected."""
    known = [r for r in view.ranks if r.data_wait_frac is not None]
    if not known:
        return view.ranks[0].rank if view.ranks else None
    return max(known, key=lambda r: r.data_wait_frac or 0.0).rank
