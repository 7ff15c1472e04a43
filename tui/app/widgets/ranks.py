"""Ranks pane: one row per rank (step time, compute, data wait, comm wait; where the pane is wide, the
window's p99 and longest step, CPU; state),
the straggler marked ◀, a stuck job's culprit ✖ and waiting or silent ranks, and the selected
rank highlighted; with a layout beyond data parallel, each rank's place ("pp1 dp0 tp1") and the rows
in stage and replica order. A job of more than ``HEATMAP_RANKS`` ranks is drawn as a heatmap instead
(``tui.app.widgets.heatmap``): a column per rank, grouped by node (or by stage and replica), paged
with ``[`` and ``]``."""

from __future__ import annotations

from rich.text import Text

from perfmon_analysis import units
from perfmon_analysis.heatmap import heatmap
from perfmon_analysis.verdict import Verdict
from perfmon_analysis.views import JobView, RankView
from tui.app.widgets import glyphs, heatmap as heat
from tui.app.widgets.layout import HEATMAP_RANKS
from tui.app.widgets.pane import Pane, UiState


class RanksPane(Pane):
    NAME = "ranks"
    page_ranks = 0      # ranks on a page of the heatmap as last drawn (``[``/``]`` move by it); 0: no heatmap

    def draw(self, view: JobView, verdict: Verdict | None, ui: UiState, width: int, height: int) -> list[Text]:
        if not view.ranks:
            return [Text("no ranks yet", style=glyphs.DIM)]
        if len(view.ranks) > HEATMAP_RANKS and view.stuck is None:
            lines, page = heat.draw(heatmap(view), ui.selected_rank, ui.mono, width, height)
            self.page_ranks = page.ranks
            return lines
        self.page_ranks = 0
        stuck = view.stuck
        roles = {r.rank: (r.role, r.seconds) for r in stuck.ranks} if stuck is not None else {}
        straggler = None if stuck is not None else getattr(verdict, "straggler_rank", None)
        if straggler is None and stuck is None and getattr(verdict, "bottleneck", None) not in UNBLAMED:
            straggler = view.straggler_rank
        columns: tuple[tuple[str, int], ...] = (NARROW if width < 46 else WIDEST if width >= 80
                                                else WIDE if width >= 60 else NORMAL)
        if len({r.host for r in view.ranks if r.host}) > 1:       # a job across nodes: say which
            node_w = min(NODE_W, max(len(r.host or "") for r in view.ranks))
            columns = ((("node", node_w),) + columns[1:]) if columns is NARROW else (("node", node_w),) + columns
        lay = view.layout
        placed = lay.beyond_dp       # a layout beyond data parallel: each rank's place, rows by stage and replica
        if placed:
            place_w = min(PLACE_W, max(len(lay.label(r.rank)) for r in view.ranks) or 1)
            columns = (("place", place_w),) + columns
        rank_w = max(4, max(len(str(r.rank)) for r in view.ranks))
        head = Text(f"{'rank':<{rank_w}}", style=glyphs.DIM)
        for name, w in columns:
            head.append(f" {name:>{w}}", style=glyphs.DIM)
        head.append(" state", style=glyphs.DIM)
        lines = [head]
        keep = {straggler, ui.selected_rank, *(stuck.culprit_ranks if stuck is not None else ())}
        shown = _rows_that_fit(view.ranks, max(1, height - 1), keep)
        if placed:
            shown.sort(key=lambda r: (lay.stage(r.rank) or 0, lay.replica(r.rank) or 0, r.rank))
        for r in shown:
            row = Text(f"{r.rank:<{rank_w}}")
            for name, w in columns:
                row.append(f" {lay.label(r.rank)[:w] if name == 'place' else _cell(r, name):>{w}}")
            row.append(" ")
            row.append_text(_state(r, straggler, short=columns is NARROW, role=roles.get(r.rank)))
            if r.rank == straggler or roles.get(r.rank, ("",))[0] in ("culprit", "unresponsive"):
                row.stylize(f"bold {glyphs.BAD}")
            if r.rank == ui.selected_rank:
                row.stylize("reverse")
            lines.append(row)
        hidden = len(view.ranks) - len(shown)
        if hidden:
            lines.append(Text(f"+{hidden} more ranks (r selects one)", style=glyphs.DIM))
        return lines


NARROW = (("step", 6), ("comp", 6), ("data", 4), ("comm", 4))
NORMAL = (("steps", 6), ("step", 6), ("compute", 7), ("data", 4), ("comm", 4))
WIDE = NORMAL + (("p99", 6), ("max", 6), ("cpu", 4))     # p99, max: the window's slow steps (step_times)
WIDEST = WIDE + (("pid", 7),)
NODE_W = 10
UNBLAMED = ("rotating_imbalance", "slow_stage")     # verdicts that name no rank: none is marked
PLACE_W = 14


def _cell(r: RankView, name: str) -> str:
    if name == "node":
        return (r.host or "?")[:NODE_W]
    if name == "steps":
        return str(r.steps)
    if name == "step":
        return units.seconds(r.step_time_median_s)
    if name in ("comp", "compute"):
        return units.seconds(r.compute_s)
    if name == "data":
        return units.pct(r.data_wait_frac)
    if name == "comm":
        return units.pct(r.comm_exposed_frac)
    if name in ("p99", "max"):
        return units.seconds(getattr(r.step_times, name) if r.step_times is not None else None)
    if name == "cpu":
        return units.number(r.cpu, 2)
    return str(r.pid or "?")


_ROLES = {"culprit": ("✖ holds the job", "✖", glyphs.BAD), "unresponsive": ("✖ silent", "✖", glyphs.BAD),
          "waiting": ("waits", "…", glyphs.WARN)}


def _state(r: RankView, straggler: int | None, short: bool = False,
           role: tuple[str, float | None] | None = None) -> Text:
    if role is not None and role[0] in _ROLES:
        long, brief, style = _ROLES[role[0]]
        return Text(brief if short else f"{long} {units.age(role[1])}", style=style)
    if r.rank == straggler:
        return Text("◀" if short else "◀ straggler", style=glyphs.BAD)
    if r.ended:
        return Text("exited", style=glyphs.DIM)
    if r.warming_up:
        return Text("warming up", style=glyphs.DIM)
    if r.generation:
        return Text(f"restart {r.generation}", style=glyphs.WARN)
    if r.stall is not None:      # the probe's stall rule (docs/verdict.md §2, 0): no step progress past its threshold
        return Text(f"stalled {units.age(r.stalled_s)}", style=glyphs.WARN)
    return Text("ok", style=glyphs.OK)


def _rows_that_fit(ranks: list[RankView], rows: int, keep: set[int | None]) -> list[RankView]:
    """All ranks if they fit, else the first ones plus the straggler and the selected rank,
    leaving one row for the '+N more' line."""
    if len(ranks) <= rows:
        return list(ranks)
    room = max(1, rows - 1)
    must = [r for r in ranks if r.rank in keep]
    rest = [r for r in ranks if r.rank not in keep][: max(0, room - len(must))]
    return sorted(must + rest, key=lambda r: r.rank)[:room]
