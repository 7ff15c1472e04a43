"""Stuck screen (``s``): when the job stopped making progress, each rank's part (culprit,
waiting, silent), how long, what it is doing and its training thread's stack, innermost frame
last; ``d`` asks py-spy for the stacks of silent or culprit ranks on this host, read from outside
(a rank holding the GIL cannot report its own)."""

from __future__ import annotations

import socket

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from perfmon_analysis import units
from perfmon_analysis.stuck import RankStuck, StuckDiagnosis, is_library
from tui.app.widgets import glyphs
from tui.stream import native

FRAMES = 12        # innermost frames shown per rank
_ROLE_STYLE = {"culprit": glyphs.BAD, "unresponsive": glyphs.BAD, "waiting": glyphs.WARN, "other": glyphs.DIM}


def rank_line(r: RankStuck) -> Text:
    """'rank 0 · waiting · 45s · in all_reduce #41 · node-a pid 4000'. The fields are styled apart,
    so each separator is a visible character inside the line: whitespace at the edge of a styled
    run is lost wherever the runs are read one by one (a screenshot's text), which ran the rank
    into its role."""
    sep = (" · ", glyphs.DIM)
    line = Text.assemble((f"rank {r.rank}", "bold"), sep, (r.role, f"bold {_ROLE_STYLE.get(r.role, glyphs.DIM)}"),
                         sep, f"{units.age(r.seconds)} · {r.doing}")
    if r.host or r.pid:
        line.append_text(Text.assemble(sep, (f"{r.host or '?'} pid {r.pid or '?'}", glyphs.DIM)))
    return line


def stuck_text(stuck: StuckDiagnosis | None, native_stacks: dict[int, str] | None = None) -> Group:
    """The screen's body (pure: the snapshot test and the report-like rendering share it)."""
    if stuck is None:
        return Group(Text("Nothing is stuck: every rank made progress within its stall threshold "
                          "(PERFMON_STALL_S, else 10x its median step, at least 15 s).", style=glyphs.OK))
    parts: list[Text] = [Text(f"STUCK: {stuck.headline}", style=f"bold {glyphs.BAD}"), Text("")]
    for r in stuck.ranks:
        parts.append(rank_line(r))
        if r.call and stuck.op:
            parts.append(Text(f"    {stuck.op} #{stuck.seq}: {r.call}"))
        if r.flight:
            parts.append(Text(f"    {r.flight}", style=glyphs.DIM))
        for frame in r.stack[-FRAMES:]:
            parts.append(Text(f"    {frame}", style=glyphs.DIM if is_library(frame) else ""))
        if len(r.stack) > FRAMES:
            parts.append(Text(f"    ({len(r.stack) - FRAMES} outer frames not shown)", style=glyphs.DIM))
        if native_stacks and r.rank in native_stacks:
            parts.append(Text("    read from outside (py-spy dump --nonblocking):", style=glyphs.ACCENT))
            parts.extend(Text(f"      {line}") for line in native_stacks[r.rank].splitlines()[:40])
        parts.append(Text(""))
    return Group(*parts)


class StuckScreen(Screen[None]):
    """Redrawn by the app on every refresh (``show``) while open."""

    BINDINGS = [
        Binding("escape,s", "app.pop_screen", "back"),
        Binding("d", "native", "stacks via py-spy"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, stuck: StuckDiagnosis | None) -> None:
        super().__init__()
        self.stuck = stuck
        self.native_stacks: dict[int, str] = {}

    def compose(self) -> ComposeResult:
        yield Static("Where each rank is, innermost frame last   (s or Esc: back · d: stacks read by py-spy, "
                     "when installed)", id="stuck-title")
        with VerticalScroll():
            yield Static(stuck_text(self.stuck), id="stuck-body")
        yield Footer(compact=True)

    def show(self, stuck: StuckDiagnosis | None) -> None:
        self.stuck = stuck
        for body in self.query("#stuck-body").results(Static):    # none until the screen is composed
            body.update(stuck_text(stuck, self.native_stacks))

    def action_native(self) -> None:
        """py-spy for the ranks that hold the job, if they run on this host (a worker thread: it takes seconds)."""
        if self.stuck is None:
            return
        if not native.available():
            self.notify("py-spy is not installed (pip install py-spy)", severity="warning")
            return
        here = socket.gethostname()
        targets = [(r.rank, r.pid) for r in self.stuck.ranks
                   if r.role in ("culprit", "unresponsive") and r.pid and r.host in (None, here)]
        if not targets:
            self.notify("no culprit rank runs on this host", severity="warning")
            return
        self.notify(f"py-spy dump of {len(targets)} process(es)...")
        self.run_worker(lambda: self._dump(targets), thread=True, exclusive=True, group="pyspy")

    def _dump(self, targets: list[tuple[int, int]]) -> None:
        stacks = {rank: native.dump(pid) for rank, pid in targets}
        self.app.call_from_thread(self._got, stacks)

    def _got(self, stacks: dict[int, str]) -> None:
        self.native_stacks.update(stacks)
        self.show(self.stuck)
