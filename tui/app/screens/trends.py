"""Trends screen (``t``): the whole run so far (step time, the step's losses, memory, the verdict's
changes) from the run model's downsampled history, redrawn while on top at most once a second, and
less often where a redraw is costly (a 1,024-rank history takes about 0.2 s to summarize)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from perfmon_analysis.history import History
from tui.app.widgets import glyphs
from tui.app.widgets.trends import TrendsBody, trends

REDRAW_SECONDS = 1.0     # the history changes slowly
REDRAW_COST_SHARE = 0.1  # redraws take at most this share of the event loop's time


class TrendsScreen(Screen[None]):
    """Redrawn by the app's refresh timer while it is on top (``show``)."""

    BINDINGS = [
        Binding("escape,t", "app.pop_screen", "back"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, history: History | None) -> None:
        super().__init__()
        self._history = history
        self._drawn_at: float | None = None
        self._pause = REDRAW_SECONDS

    def compose(self) -> ComposeResult:
        yield Static(Text("The whole run so far, oldest on the left   (t or Esc: back)", style="bold"),
                     id="trends-title")
        with VerticalScroll():
            yield TrendsBody(id="trends-body")
            yield Static(Text("step time: each bar the slowest step under it; data wait, exposed comm, between "
                              "steps: share of the step time, mean of the ranks; memory: the rank closest to its "
                              "limit", style=glyphs.DIM), id="trends-note")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.show(self._history, force=True)

    def show(self, history: History | None, force: bool = False) -> None:
        now = time.monotonic()
        if history is None or (not force and self._drawn_at is not None and now - self._drawn_at < self._pause):
            return
        self._history = history
        bodies = self.query(TrendsBody).results(TrendsBody)
        body = next(bodies, None)
        if body is None:        # pushed, not composed yet: on_mount draws what is kept
            return
        data = trends(history)
        self._drawn_at = time.monotonic()
        self._pause = max(REDRAW_SECONDS, (self._drawn_at - now) / REDRAW_COST_SHARE)
        body.show(data)
