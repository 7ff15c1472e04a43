"""Help screen (``?``/``h``): the keys, what each pane shows, and how the verdict is reached."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: list[tuple[str, str]] = [
    ("q", "quit"),
    ("? h F1", "this help (Esc closes)"),
    ("f", "flowchart: the questions behind the verdict, live path highlighted"),
    ("1-6", "show/hide a pane (device, memory, comm, data, timeline, ranks)"),
    ("0", "show every pane that fits again (undo toggles)"),
    ("Tab / ← →", "move the focus between panes"),
    ("r / R", "select the next / previous rank (its row and timeline are highlighted); a: all ranks"),
    ("[ / ]", "a job of more than 16 ranks: the previous / next page of the ranks heatmap; g: the slowest rank"),
    ("#", "select a rank by its number (through a relay tree: any rank of the job, sent in full on demand)"),
    ("w", "change the window the verdict is computed over (steps)"),
    ("p  space", "pause: live freezes the display (data keeps coming); replay stops the clock"),
    ("+ / -", "replay speed"),
    ("end", "replay: jump to the end"),
    ("l", "job output (when started by `perfmon run`)"),
    ("s", "stuck job: each rank's part, what it waits for and its stack (d there: py-spy reads a silent rank's stack)"),
    ("u", "where the step's unexplained time goes: the training thread's in-step stack samples by source line, "
          "waiting (off CPU) or busy, each share with its 95% error bar"),
    ("t", "the whole run so far: step time, data wait, exposed comm, time between steps, memory and the "
          "verdict's changes over time"),
    ("m", "module profile: time each module of the selected rank for 5 steps (params, FLOPs, FLOP/s; m again)"),
    ("c", "torch.profiler capture of the selected rank's next 3 steps: trace path and top operators (c again)"),
    ("F8", "save an SVG screenshot in the current directory"),
]

PANES: list[tuple[str, str]] = [
    ("header", "job, ranks, step, median step time, throughput, MFU, ETTR, perfmon's own cost (share of the step "
               "and of the CPU), uptime, stream state, drops"),
    ("device", "per-GPU utilisation history, SM/tensor activity, power, clocks, throttling; CPU use for CPU jobs"),
    ("memory", "params, grads, optimizer, activations, cache, other against the limit; peak, fragmentation, OOMs"),
    ("comm", "communication share of the step, exposed share, collectives with bus bandwidth, wait per rank"),
    ("data", "loader wait per step, its share of the step, loader CPU, workers"),
    ("timeline", "phases of the most recent steps (data, forward, backward, optimizer, comm, other)"),
    ("ranks", "one row per rank: step time, data wait, comm wait; the straggler is marked ◀. Over 16 ranks, a "
              "heatmap: a column per rank by node, rows step time and compute (x the fastest rank), data wait "
              "and exposed comm (share of the step), ·░▒▓█ cool to hot, the slowest rank and node named"),
    ("verdict", "the bottleneck, the evidence, the top fix, and the flowchart path that led there"),
]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,h,f1", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold")
        keys.add_column()
        for key, what in KEYS:
            keys.add_row(key, what)
        panes = Table.grid(padding=(0, 2))
        panes.add_column(style="bold")
        panes.add_column()
        for name, what in PANES:
            panes.add_row(name, what)
        notes = Text.from_markup(
            "A judged number shows the verdict's answer to its question: [bold]![/] a problem, [bold]·[/] not, and "
            "in brackets the threshold, or what decided when it was more than the threshold (a larger loss). "
            "n/a means the probe does not measure it here (for example GPU numbers on a CPU job). "
            "The verdict changes only when the new answer holds for two refreshes in a row.")
        with VerticalScroll(id="help-body"):
            yield Static(Text("perfmon: keys", style="bold"))
            yield Static(keys)
            yield Static(Text("\npanes", style="bold"))
            yield Static(panes)
            yield Static(Text("\n") + notes)
