"""Base of every pane: holds the latest (view, verdict, ui) and draws it on ``render``.

Panes never collect data: the app hands them a ``JobView`` and a ``Verdict``
on its refresh timer (2-4 Hz) and a pane only formats what it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rich.console import RenderableType
from rich.text import Text
from textual.widget import Widget

from tui.app.widgets.layout import pane_key

if TYPE_CHECKING:
    from perfmon_analysis.verdict import Verdict
    from perfmon_analysis.views import JobView


@dataclass(frozen=True)
class UiState:
    """Viewer choices that change how panes draw (not what they measure)."""

    selected_rank: int | None = None    # None = the pane's own default (usually the worst rank)
    mono: bool = False                  # NO_COLOR: distinguish by characters, not colours
    window_label: str = ""
    feed_state: str = "live"
    feed_flowing: bool = True       # records still arrive (not ended, lost, paused or finished)


class Pane(Widget, can_focus=True):
    """A bordered pane; subclasses implement ``draw``."""

    NAME: ClassVar[str] = ""       # id and title; its toggle key comes from layout.PANE_ORDER
    DEFAULT_CSS = """
    Pane { border: round $panel-lighten-2; padding: 0 1; height: 1fr; overflow: hidden;
           text-wrap: nowrap; text-overflow: ellipsis; }
    Pane:focus { border: round $accent; }
    Pane.-suspect { border: heavy $warning; }
    Pane.-suspect:focus { border: heavy $accent; }
    """

    def __init__(self) -> None:
        super().__init__(id=self.NAME)
        self.border_title = f"{pane_key(self.NAME)} {self.NAME}"
        self._view: JobView | None = None
        self._verdict: Verdict | None = None
        self._ui = UiState()

    def show(self, view: JobView, verdict: Verdict | None, ui: UiState) -> None:
        """Draw the view; the pane holding the verdict's evidence (its rule's ``pane``) is marked."""
        self._view, self._verdict, self._ui = view, verdict, ui
        suspect = verdict is not None and verdict.outcome.pane == self.NAME
        self.set_class(suspect, "-suspect")
        self.border_subtitle = verdict.outcome.label.lower() if suspect and verdict is not None else ""
        self.refresh()

    def render(self) -> RenderableType:
        if self._view is None:
            return Text("waiting for data…", style="grey50")
        out = self.draw(self._view, self._verdict, self._ui, max(1, self.content_size.width),
                        max(1, self.content_size.height))
        if isinstance(out, list):   # lines: one Text, so the CSS no-wrap/ellipsis applies to each line
            out = Text("\n").join(out)
        return out

    def draw(self, view: JobView, verdict: Verdict | None, ui: UiState, width: int,
             height: int) -> list[Text] | RenderableType:
        """Lines (cut with an ellipsis at the pane's width) or any Rich renderable."""
        raise NotImplementedError


def focus_rank(view: JobView, ui: UiState, verdict: Verdict | None = None) -> int | None:
    """The rank a single-rank drawing should show: the selected one, else the straggler, else the first."""
    ranks = [r.rank for r in view.ranks]
    if not ranks:
        return None
    if ui.selected_rank in ranks:
        return ui.selected_rank
    straggler = getattr(verdict, "straggler_rank", None)
    if straggler is None:
        straggler = view.straggler_rank
    return straggler if straggler in ranks else ranks[0]
