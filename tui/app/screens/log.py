"""Behind the ``l`` key: the probe's own warnings (``warning`` events: counted internal failures,
parts switched off) and, under ``perfmon run``, the job's output file as a tail -f view."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Log, Static

from perfmon_analysis import units

TAIL_BYTES = 64 * 1024     # how much of an existing log is shown on open
READ_BYTES = 256 * 1024    # at most this much new output per poll
POLL_SECONDS = 0.5


class LogScreen(Screen[None]):
    """Follows ``path`` (if any) while open, reading only what was appended since the last poll, and
    lists the ``warning`` events ``warnings()`` returns (the view's recent events), newest last."""

    BINDINGS = [
        Binding("escape,l", "app.pop_screen", "back"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, path: Path | None, warnings: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        super().__init__()
        self.path = path
        self.warnings = warnings
        self._offset = 0
        self._partial = ""
        self._shown: set[tuple[Any, Any, Any]] = set()

    def compose(self) -> ComposeResult:
        title = f"job output: {self.path}" if self.path is not None else "perfmon warnings"
        yield Static(f"{title}   (l or Esc: back)", id="log-title")
        yield Log(max_lines=200, id="log-warnings", auto_scroll=True)
        if self.path is not None:
            yield Log(max_lines=5000, id="log-body")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        if self.path is not None:
            self.query_one("#log-warnings", Log).styles.height = 6
        self._poll_warnings()
        self.set_interval(POLL_SECONDS, self._poll_warnings)
        if self.path is None:
            return
        try:
            size = self.path.stat().st_size
        except OSError:
            size = 0
        self._offset = max(0, size - TAIL_BYTES)
        self._poll()
        self.set_interval(POLL_SECONDS, self._poll)

    def _poll_warnings(self) -> None:
        log = self.query_one("#log-warnings", Log)
        events = self.warnings() if self.warnings is not None else []
        lines = []
        for e in events:
            if e.get("name") != "warning":
                continue
            key = (e.get("rank"), e.get("t"), e.get("message"))
            if key in self._shown:
                continue
            if len(self._shown) > 10_000:     # bounded: the view holds at most a few hundred events
                self._shown.clear()
            self._shown.add(key)
            stamp = time.strftime("%H:%M:%S", time.localtime(e.get("t") or 0))
            lines.append(f"{stamp} rank {e.get('rank', units.NA)} warning: {e.get('message') or ''}")
        if lines:
            log.write_lines(lines)
        elif not log.line_count:
            log.write_line("no warnings from the probe")

    def _poll(self) -> None:
        if self.path is None:
            return
        log = self.query_one("#log-body", Log)
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
