"""Capture screen (``c``): asks the selected rank's probe to run torch.profiler over the next few
steps and shows each rank's latest capture: where its trace is (open it in Perfetto or HTA), the
operators with the most self time and, on GPU, the device's busy share and longest idle gaps."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding

from perfmon_analysis.views import JobView
from tui.app.screens.asking import AskScreen
from tui.app.widgets import glyphs


class CaptureScreen(AskScreen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("c", "ask", "capture again"),
        Binding("q", "app.quit", "quit"),
    ]
    op = "capture"
    params = {"steps": 3}
    heading = "torch.profiler capture   (c: capture {label} for 3 steps · Esc: back)"
    doing = "capturing"

    def body(self, view: JobView | None) -> list[Text]:
        captures = view.captures if view is not None else ()
        if not captures:
            return [Text("No capture yet. A capture runs torch.profiler over a few steps of the running job, "
                         "writes its trace beside the recording and sums up its top operators.", style=glyphs.DIM)]
        lines: list[Text] = []
        for capture in captures:
            lines += [Text(line, style=f"bold {glyphs.BAD}" if capture.error else "") for line in capture.lines(120)]
            lines.append(Text(""))
        return lines
