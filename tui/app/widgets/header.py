"""Header: what is being watched and how it is going (job, ranks, step, step time,
throughput, MFU, ETTR, uptime), plus the stream state, drop count and perfmon's own cost."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from perfmon_analysis import units
from perfmon_analysis.views import JobView
from tui.app.widgets import glyphs
from tui.app.widgets.pane import UiState


class HeaderBar(Widget):
    DEFAULT_CSS = ("HeaderBar { height: 2; background: $panel; padding: 0 1;"
                   " text-wrap: nowrap; text-overflow: ellipsis; }")

    def __init__(self) -> None:
        super().__init__(id="header")
        self._view: JobView | None = None
        self._ui = UiState()
        self._description = ""

    def show(self, view: JobView, ui: UiState, description: str) -> None:
        self._view, self._ui, self._description = view, ui, description
        self.refresh()

    def render(self) -> Text:
        view, ui = self._view, self._ui
        line1 = Text.assemble(("perfmon ", f"bold {glyphs.ACCENT}"))
        if view is None or not view.ranks:
            line1.append(self._description or "connecting…")
            line1.append(f"  ·  {ui.feed_state}", style=glyphs.DIM)
            return line1
        line1.append(view.job or units.NA, style="bold")
        hosts = sorted({r.host for r in view.ranks if r.host})
        sep = (" · ", glyphs.DIM)
        line1.append(*sep)
        job = next((g for g in view.groups if g.key == ("job", "")), None)
        seen = job.ranks if job is not None else len(view.ranks)      # through a relay tree: every rank counted
        line1.append(f"{seen}/{view.world_size} rank{'s' * (view.world_size != 1)}")
        if job is not None:
            line1.append(f" ({sum(g.key[0] == 'group' for g in view.groups)} groups, {len(view.ranks)} shown)",
                         style=glyphs.DIM)
        if hosts:
            line1.append(f"@{hosts[0]}" + (f"+{len(hosts) - 1}" if len(hosts) > 1 else ""), style=glyphs.DIM)
        line1.append(f" {view.device_type.upper()}")
        line1.append(*sep)
        line1.append(ui.feed_state, style=f"bold {glyphs.OK if ui.feed_flowing else glyphs.WARN}")
        if view.started is not None:
            line1.append(*sep)
            line1.append(f"up {units.age(view.now - view.started)}")
        line1.append(*sep)
        line1.append("drops ")
        line1.append(str(view.drops_total), style=f"bold {glyphs.BAD}" if view.drops_total else "")
        m = view.metrics
        line2 = Text()
        for label, value in (("step", str(m.steps)), ("step time", units.seconds(m.step_time_median_s)),
                             ("samples", units.rate(m.samples_per_s)), ("tokens", units.rate(m.tokens_per_s)),
                             ("MFU", units.pct(m.mfu)), ("ETTR", units.pct(m.ettr))):
            line2.append(f"{label} ", style=glyphs.DIM)
            line2.append(value, style="bold")
            line2.append("  ")
        cost = view.overhead
        if cost is not None:    # sent by wire 1.4 probes: an older probe's cost is not shown, not 0
            style = f"bold {glyphs.WARN}" if cost.over_budget else "bold"
            line2.append("perfmon cost ", style=glyphs.DIM)
            line2.append(units.pct(cost.step_frac, 2), style=style)
            line2.append(" of step, ", style=glyphs.DIM)
            line2.append(units.pct(cost.cpu_frac, 2), style=style)
            line2.append(" of CPU  ", style=glyphs.DIM)
        line2.append(f"window {int(view.window.get('steps', 0))} steps/{units.seconds(view.window.get('seconds'))}",
                     style=glyphs.DIM)
        if ui.window_label:
            line2.append(f" ({ui.window_label})", style=glyphs.DIM)
        return Text("\n").join([line1, line2])
