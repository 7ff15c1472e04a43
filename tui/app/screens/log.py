"""The job's output (``perfmon run`` sends it to a file): a tail -f view behind the ``l`` key."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Log, Static

TAIL_BYTES = 64 * 1024     # how much of an existing log is shown on open
READ_BYTES = 256 * 1024    # at most this much new output per poll
POLL_SECONDS = 0.5


class LogScreen(Screen[None]):
    """Follows ``path`` while open; reads only what was appended since the last poll."""

    BINDINGS = [
        Binding("escape,l", "app.pop_screen", "back"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._offset = 0
        self._partial = ""

    def compose(self) -> ComposeResult:
        yield Static(f"job output: {self.path}   (l or Esc: back)", id="log-title")
        yield Log(max_lines=5000, id="log-body")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        try:
            size = self.path.stat().st_size
        except OSError:
            size = 0
        self._offset = max(0, size - TAIL_BYTES)
        self._poll()
        self.set_interval(POLL_SECONDS, self._poll)

    def _poll(self) -> None:
        log = self.query_one(Log)
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read(READ_BYTES)
        except OSError as exc:
            if self._offset == 0 and not log.line_count:
                log.write_line(f"(cannot read {self.path}: {exc.strerror or exc})")
            return
        if not data:
            return
        self._offset += len(data)
        text = self._partial + data.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()
        if lines:
            log.write_lines(lines)
