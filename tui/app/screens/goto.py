"""``#``: select a rank by its number, any rank of the job: through a relay tree the ranks pane
holds only the groups' worst ranks, and a rank typed here is asked for in full (docs/tree.md)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class GotoRankScreen(ModalScreen[int | None]):
    """One line: a rank number; Enter selects it, Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, world_size: int) -> None:
        super().__init__()
        self.world_size = world_size

    def compose(self) -> ComposeResult:
        with Vertical(id="goto"):
            yield Static(f"rank (0-{max(0, self.world_size - 1)}), Enter to select it, Esc to cancel", id="goto-title")
            yield Input(placeholder="rank", type="integer", id="goto-rank")
            yield Static("", id="goto-problem")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text.isdigit() or int(text) >= max(1, self.world_size):
            self.query_one("#goto-problem", Static).update(f"no rank {text or '?'} in a job of {self.world_size}")
            return
        self.dismiss(int(text))

    def action_cancel(self) -> None:
        self.dismiss(None)
