"""Module profile screen (``m``): asks the selected rank's probe to time each module for the next
few steps (``perfmon profile``'s request) and shows the newest profile of the job, with the
marked module and the profile's own cost. ``m`` again profiles again."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding

from perfmon_analysis.profile import ModuleProfile, profile_lines
from perfmon_analysis.views import JobView
from tui.app.screens.asking import AskScreen
from tui.app.widgets import glyphs


def profile_text(profile: ModuleProfile | None, width: int = 100) -> list[Text]:
    """The screen's body (pure)."""
    if profile is None:
        return [Text("No module profile yet. It times every module of the watched model for a few steps "
                     "(hooks on those steps only), with FLOPs counted on a meta-device copy.", style=glyphs.DIM)]
    return [Text(line, style=f"bold {glyphs.BAD}" if line.startswith(("▶", "Marked")) else "")
            for line in profile_lines(profile.as_json(), width=width, top=None)]


class ProfileScreen(AskScreen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("m", "ask", "profile again"),
        Binding("q", "app.quit", "quit"),
    ]
    op = "profile"
    params = {"steps": 5, "depth": 3}
    heading = "Module profile: where the time and FLOPs go, per module   (m: profile {label} for 5 steps · Esc: back)"
    doing = "profiling"

    def body(self, view: JobView | None) -> list[Text]:
        return profile_text(view.profile if view is not None else None)
