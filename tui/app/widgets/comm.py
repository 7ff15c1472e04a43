"""Comm/compute pane: how much of the step goes to collectives, how much of that is exposed,
the busiest collectives with their bus bandwidth, and how long each rank waits."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from perfmon_analysis import units
from perfmon_analysis.verdict import Verdict
from perfmon_analysis.views import JobView
from tui.app.widgets import glyphs
from tui.app.widgets.pane import Pane, UiState


class CommPane(Pane):
    NAME = "comm"

    def draw(self, view: JobView, verdict: Verdict | None, ui: UiState, width: int,
             height: int) -> list[Text] | RenderableType:
        m = view.metrics
        lines: list[Text] = []
        if view.world_size <= 1 and not view.comm_ops:
            lines.append(Text("one process: no collectives", style=glyphs.DIM))
            lines.append(Text(f"compute {units.pct(m.device_busy)} of the step", style=glyphs.DIM))
            return lines
        share = Text.assemble(("comm ", "bold"))
        share.append(f"{units.pct(m.comm_frac)} of step  ")
        share.append("exposed ", style="bold")
        share.append_text(glyphs.judged(verdict, "comm_exposed", units.pct))
        if m.comm_estimated:
            share.append(" est.", style=glyphs.DIM)
        lines.append(share)
        ratio = Text.assemble(("balance ", "bold"))
        ratio.append_text(glyphs.judged(verdict, "straggler", lambda v: units.number(v, 2)))
        ratio.append(" fastest/slowest compute", style=glyphs.DIM)
        lines.append(ratio)
        rows_left = height - len(lines)
        ops = view.comm_ops[: max(0, min(4, rows_left - 2 - min(len(view.ranks), 4)))]
        if ops:
            op_w = max(8, min(22, width - 32))
            header = Text.assemble((f"{'collective':<{op_w}} {'calls':>6} {'time':>7} {'busbw':>9}", glyphs.DIM))
            lines.append(header)
            for row in ops:
                lines.append(Text(f"{row.op[:op_w]:<{op_w}} {row.count:>6} {units.seconds(row.seconds):>7} "
                                  f"{units.bandwidth(row.busbw):>9}"))
        elif m.comm_frac is None:
            lines.append(Text("collectives not measured (mon.watch(model=ddp_model))", style=glyphs.DIM))
        rows_left = height - len(lines)
        if rows_left >= 2 and len(view.ranks) > 1:
            lines.append(Text("wait per rank (exposed comm share of step)", style=glyphs.DIM))
            bar_w = max(4, width - 16)
            for r in view.ranks[: rows_left - 1]:
                line = Text(f"r{r.rank:<3}{units.pct(r.comm_exposed_frac):>5} ")
                line.append_text(glyphs.hbar(r.comm_exposed_frac, bar_w, style=glyphs.CATEGORY["comm"]))
                if r.rank == view.straggler_rank:
                    line.append(" ◀", style=glyphs.BAD)
                lines.append(line)
        return lines[:height]
