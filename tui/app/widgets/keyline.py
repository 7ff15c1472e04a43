"""Key line: the keys that matter most, plus panes that did not fit and how to bring them back."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tui.app.widgets import glyphs
from tui.app.widgets.layout import pane_key

KEYS = (("q", "quit"), ("?", "help"), ("f", "flowchart"), ("t", "trends"), ("p", "pause"), ("1-6", "panes"),
        ("r", "rank"), ("w", "window"), ("F8", "svg"))


class KeyLine(Widget):
    DEFAULT_CSS = "KeyLine { height: 1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, extra: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(id="keys")
        self._dropped: tuple[str, ...] = ()
        self._extra = extra

    def show(self, dropped: tuple[str, ...]) -> None:
        if dropped != self._dropped:
            self._dropped = dropped
            self.refresh()

    def render(self) -> Text:
        text = Text()
        if self._dropped:
            text.append("no room: ", style=glyphs.WARN)
            text.append(" ".join(f"{pane_key(p)} {p}" for p in self._dropped), style=glyphs.WARN)
            text.append("  │ ", style=glyphs.DIM)
        for key, what in KEYS + self._extra:
            text.append(key, style=f"bold {glyphs.ACCENT}")
            text.append(f" {what}  ", style=glyphs.DIM)
        text.no_wrap = True
        text.overflow = "ellipsis"
        return text
