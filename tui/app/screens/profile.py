"""Module profile screen (``m``): asks the selected rank's probe to time each module for the next
few steps (``perfmon profile``'s request, on a worker thread) and shows the newest profile of the
job, with the marked module and the profile's own cost. ``m`` again profiles again."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from tui.app.widgets import glyphs
from tui.errors import UserError
from tui.model.profile import ModuleProfile, profile_lines
from tui.stream.requests import Target, ask

STEPS = 5
DEPTH = 3
TIMEOUT = 120.0


def profile_text(profile: ModuleProfile | None, status: str = "", width: int = 100) -> Group:
    """The screen's body (pure: the snapshot test renders it from a fixture)."""
    parts: list[Text] = []
    if status:
        parts += [Text(status, style=glyphs.ACCENT), Text("")]
    if profile is None:
        parts.append(Text("No module profile yet. It times every module of the watched model for a few steps "
                          "(hooks on those steps only), with FLOPs counted on a meta-device copy.", style=glyphs.DIM))
        return Group(*parts)
    for line in profile_lines(profile.as_json(), width=width, top=None):
        style = f"bold {glyphs.BAD}" if line.startswith(("▶", "Marked")) else ""
        parts.append(Text(line, style=style))
    return Group(*parts)


class ProfileScreen(Screen[None]):
    """Redrawn by the app on every refresh (``show``) while open."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("m", "profile", "profile again"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, profile: ModuleProfile | None, target: Target | str, label: str) -> None:
        super().__init__()
        self.profile = profile
        self.target = target
        self.label = label
        self.status = ""

    def compose(self) -> ComposeResult:
        yield Static(f"Module profile: where the time and FLOPs go, per module   (m: profile {self.label} "
                     f"for {STEPS} steps · Esc: back)", id="profile-title")
        with VerticalScroll():
            yield Static(profile_text(self.profile, self.status), id="profile-body")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.action_profile()

    def show(self, profile: ModuleProfile | None) -> None:
        self.profile = profile
        for body in self.query("#profile-body").results(Static):    # none until the screen is composed
            body.update(profile_text(profile, self.status))

    def action_profile(self) -> None:
        if isinstance(self.target, str):
            self._say(self.target)
            return
        self._say(f"profiling {self.label}: the next {STEPS} steps to depth {DEPTH} ...")
        target = self.target
        self.run_worker(lambda: self._ask(target), thread=True, exclusive=True, group="profile")

    def _ask(self, target: Target) -> None:
        try:
            ask(target, "profile", {"steps": STEPS, "depth": DEPTH}, TIMEOUT, "profile")
            message = f"profile of {self.label} done (it also reached the recording, if any)"
        except UserError as exc:
            message = str(exc)
        self.app.call_from_thread(self._say, message)

    def _say(self, message: str) -> None:
        self.status = message
        self.show(self.profile)
