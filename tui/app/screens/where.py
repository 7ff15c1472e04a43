"""Where screen (``u``): where the step's unexplained time goes, from the training thread's stack
samples inside steps and between them: each user line with its share of the step (the iteration)
± its 95% error bar, waiting (off CPU) or busy (on CPU), in a step or between steps, and the
library call below it; then the other threads seen holding the GIL while it waited. It formats the
verdict's table; nothing is measured here."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from perfmon_analysis import units
from perfmon_analysis.losses import by_id
from perfmon_analysis.verdict import Verdict
from tui.app.widgets import glyphs

_STATE_STYLE = {"waiting": glyphs.WARN, "busy": glyphs.OK}


def where_text(verdict: Verdict | None) -> Group:
    """The screen's body (pure: the tests read it as text)."""
    table = verdict.where if verdict is not None else None
    if verdict is None or table is None:
        return Group(Text("No stack samples from this job: the probe samples the training thread inside steps "
                          "from wire 1.3 on, and between them from 1.5 (an older probe, or no step has run yet).",
                          style=glyphs.DIM))
    losses = by_id(verdict.losses)
    parts: list[Text | Table] = []
    head = Text(f"rank {table.rank}: {table.samples} samples inside steps in the window"
                f"{f' at {units.number(table.hz)}Hz' if table.hz else ''}, "
               f"covering {units.pct(table.span_share)} of the "
                f"step; {table.between_samples} between steps, covering {units.pct(table.between_share)}",
                style="bold")
    parts.append(head)
    for loss in (losses.get("device_idle"), losses.get("loop")):
        if loss is not None:
            parts.append(Text(f"{loss.label}: {units.pct(loss.share) if loss.known else 'not measured'} of the step "
                              f"({loss.source})", style=glyphs.DIM))
    if table.wait_frac is not None:
        parts.append(Text(f"off CPU in {units.pct(table.wait_frac)} of the samples with a state", style=glyphs.DIM))
    parts.append(Text(""))
    lines = verdict.where_lines()
    if not lines:
        parts.append(Text("No stack samples inside steps in the window.", style=glyphs.DIM))
        return Group(*parts)
    grid = Table.grid(padding=(0, 2))
    for _ in range(6):
        grid.add_column()
    grid.add_row(*(Text(h, style="bold") for h in ("share ± 95%", "state", "span", "call", "line", "samples")))
    for x in lines:
        grid.add_row(Text(f"{units.pct(x.share):>4} ± {units.pct(x.err)}"),
                     Text(x.state or units.NA, style=_STATE_STYLE.get(x.state or "", glyphs.DIM)),
                     Text("in step" if x.span == "step" else "between", style=glyphs.DIM),
                     Text(x.what[:60]), Text(f"{x.site} in {x.function}"), Text(str(x.samples), style=glyphs.DIM))
    parts.append(grid)
    if table.holders:
        parts.append(Text(""))
        parts.append(Text("While the training thread waited, another thread held the GIL:", style="bold"))
        for h in table.holders[:5]:
            parts.append(Text(f"  {units.pct(h.share):>4}  thread `{h.thread}` in {h.function} at {h.site} "
                              f"({'in steps' if h.span == 'step' else 'between steps'}, {units.pct(h.of_waiting)} of "
                              "the waiting samples)"))
    parts.append(Text(""))
    parts.append(Text("waiting: the thread's CPU clock advanced under half the wall time since the previous "
                      "sample (I/O, a lock, a sleep, a remote call, the GIL); busy: on CPU (Python or native work). "
                      "Shares are of the step: from one step's start to the next's.", style=glyphs.DIM))
    return Group(*parts)


class WhereScreen(Screen[None]):
    """Redrawn by the app's refresh timer while it is on top (``show``)."""

    BINDINGS = [
        Binding("escape,u", "app.pop_screen", "back"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, verdict: Verdict | None) -> None:
        super().__init__()
        self._verdict = verdict

    def compose(self) -> ComposeResult:
        yield Static(Text("Where the unexplained step time goes: stack samples by source line, in steps and "
                          "between them   (u or Esc: back)", style="bold"), id="where-title")
        with VerticalScroll():
            yield Static(where_text(self._verdict), id="where-body")
        yield Footer(compact=True)

    def show(self, verdict: Verdict | None) -> None:
        if verdict != self._verdict:
            self._verdict = verdict
            for body in self.query("#where-body").results(Static):   # none until the screen is composed
                body.update(where_text(verdict))
