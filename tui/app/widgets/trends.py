"""The trends screen's body: the whole run so far, one row per series on a shared time axis.

Drawn with Textual's own ``Sparkline``: each series is one row whose bars summarize the time
slices under them by their max (step time) or mean (shares, memory), so a one-step spike still
shows; a row per loss reads at 80x24 where a stacked plot would not, and no plotting dependency
is added. The verdict's changes are a strip on the same axis, a letter per verdict (the legend
spells them out), so the strip reads without colour. Everything comes from the run model's
history (``perfmon_analysis.history``), never from a second reader.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Sparkline, Static

from perfmon_analysis import units
from perfmon_analysis.history import STEP_FIELDS, History, VerdictChange, memory_used
from perfmon_analysis.verdict import label as outcome_label
from tui.app.widgets import glyphs

COLUMNS = 160        # time slices taken from the history; each sparkline sums them up to its width
LABEL_WIDTH = 14
NUMBERS_WIDTH = 26


@dataclass(frozen=True)
class TrendRow:
    """One series: its label, values per time slice (None: no value), how its bars summarize the
    slices, and the numbers shown beside it."""

    key: str
    label: str
    values: tuple[float | None, ...]
    summary: str            # "max" or "mean"
    numbers: str


@dataclass(frozen=True)
class Trends:
    """What the screen shows (pure: the tests read it)."""

    start: float | None
    end: float | None
    rows: tuple[TrendRow, ...]
    verdicts: tuple[VerdictChange, ...]
    steps: int


def trends(history: History, columns: int = COLUMNS) -> Trends:
    """The rows of the screen from ``history``: step time (slowest step of each slice), the step's
    losses as shares of the step, memory of the rank closest to its limit."""
    span = history.span()
    points = history.trend(columns)
    steps = max((h.steps.points for h in history.ranks.values()), default=0)
    if span is None or not points:
        return Trends(None, None, (), tuple(history.verdicts), steps)
    i = {f: STEP_FIELDS.index(f) for f in STEP_FIELDS}

    def share(field: str) -> tuple[float | None, ...]:
        out = []
        for p in points:
            part, dur = p.mean[i[field]], p.mean[i["step"]]
            out.append(part / dur if part is not None and dur else None)
        return tuple(out)

    slowest = tuple(p.hi for p in points)
    mean_step = [p.mean[i["step"]] for p in points]
    rows = [TrendRow("step", "step time", slowest, "max",
                     f"{units.seconds(_first(mean_step))} → {units.seconds(_first(mean_step[::-1]))}, "
                     f"max {units.seconds(max(slowest))}")]
    for key, label in (("data", "data wait"), ("comm", "exposed comm"), ("gap", "between steps")):
        values = share(key)
        known = [v for v in values if v is not None]
        rows.append(TrendRow(key, label, values, "mean",
                             f"now {units.pct(_first(values[::-1]))}, max {units.pct(max(known))}" if known
                             else "not measured"))
    memory = _memory_row(history)
    if memory is not None:
        rows.append(memory)
    return Trends(span[0], span[1], tuple(rows), tuple(history.verdicts), steps)


def _first(values: Sequence[float | None]) -> float | None:
    return next((v for v in values if v is not None), None)


def _memory_row(history: History) -> TrendRow | None:
    """Memory of the rank that came closest to its limit (or used the most, without a limit)."""
    h = history.closest_to_memory_limit()
    if h is None or h.memory_peak is None:
        return None
    used = tuple(memory_used(b.mean) for b in h.memory.buckets())
    numbers = f"peak {units.nbytes(h.memory_peak)}"
    if h.memory_limit:
        numbers += f", {units.pct(h.memory_peak / h.memory_limit)} of limit"
    return TrendRow("memory", f"memory r{h.rank}", used, "mean", numbers)


def verdict_letters(changes: Sequence[VerdictChange]) -> dict[str, str]:
    """A distinct letter per verdict, in order of first appearance (``data_loading`` → ``D``)."""
    out: dict[str, str] = {}
    for c in changes:
        if c.bottleneck in out:
            continue
        name = c.bottleneck.replace("_", "")
        letter = next((ch.upper() for ch in name if ch.upper() not in out.values()), "?")
        out[c.bottleneck] = letter
    return out


def verdict_strip(data: Trends, width: int) -> Text:
    """``width`` cells over the run's time axis, each the letter of the verdict in force there."""
    text = Text()
    if data.start is None or data.end is None or width < 1 or not data.verdicts:
        return Text("no verdict yet", style=glyphs.DIM)
    letters = verdict_letters(data.verdicts)
    span = (data.end - data.start) or 1.0
    for cell in range(width):
        t = data.start + span * (cell + 0.5) / width
        now = next((c for c in reversed(data.verdicts) if c.t <= t), None)
        if now is None:
            text.append("·", style=glyphs.DIM)
        else:
            text.append(letters[now.bottleneck], style=glyphs.SEVERITY.get(now.severity, glyphs.DIM))
    return text


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


_SUMMARY: dict[str, Callable[[Sequence[float]], float]] = {"max": max, "mean": _mean}


class VerdictStrip(Widget):
    """The verdict's changes on the sparklines' time axis (drawn at the widget's own width)."""

    DEFAULT_CSS = "VerdictStrip { height: 1; width: 1fr; }"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.data: Trends | None = None

    def render(self) -> Text:
        return verdict_strip(self.data, self.size.width) if self.data is not None else Text("")


class TrendsBody(Vertical):
    """A row per series (label, sparkline, numbers), the verdict strip and its legend, the time axis."""

    DEFAULT_CSS = f"""
    TrendsBody {{ height: auto; }}
    TrendsBody Horizontal {{ height: 2; }}
    TrendsBody .trend-label {{ width: {LABEL_WIDTH}; }}
    TrendsBody .trend-numbers {{ width: {NUMBERS_WIDTH}; padding-left: 1; }}
    TrendsBody Sparkline {{ width: 1fr; height: 1; }}
    TrendsBody #trend-verdict-row {{ height: 1; }}
    TrendsBody #trend-legend {{ height: auto; }}
    """

    KEYS = ("step", "data", "comm", "gap", "memory")

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._pending: Trends | None = None    # shown before the rows were mounted

    def on_mount(self) -> None:
        if self._pending is not None:
            self.show(self._pending)

    def compose(self) -> ComposeResult:
        for key in self.KEYS:
            with Horizontal(id=f"trend-{key}"):
                yield Static("", classes="trend-label", id=f"trend-{key}-label")
                yield Sparkline([], id=f"trend-{key}-spark")
                yield Static("", classes="trend-numbers", id=f"trend-{key}-numbers")
        with Horizontal(id="trend-verdict-row"):
            yield Static("verdict", classes="trend-label")
            yield VerdictStrip(id="trend-verdict")
            yield Static("", classes="trend-numbers", id="trend-axis-end")
        yield Static("", id="trend-legend")

    def show(self, data: Trends) -> None:
        if not self.is_mounted:
            self._pending = data
            return
        self._pending = None
        rows = {r.key: r for r in data.rows}
        for key in self.KEYS:
            row = rows.get(key)
            box = self.query_one(f"#trend-{key}", Horizontal)
            box.display = row is not None
            if row is None:
                continue
            self.query_one(f"#trend-{key}-label", Static).update(Text(row.label, style="bold"))
            spark = self.query_one(f"#trend-{key}-spark", Sparkline)
            known = [v for v in row.values if v is not None]
            spark.summary_function = _SUMMARY[row.summary]
            # an unknown slice draws as the lowest bar; the numbers say what is measured
            spark.data = [v if v is not None else min(known) for v in row.values] if known else []
            self.query_one(f"#trend-{key}-numbers", Static).update(Text(row.numbers, style=glyphs.DIM))
        strip = self.query_one("#trend-verdict", VerdictStrip)
        strip.data = data
        strip.refresh()
        elapsed = (data.end - data.start) if data.start is not None and data.end is not None else None
        self.query_one("#trend-axis-end", Static).update(
            Text(f"{units.count(data.steps)} steps, {units.age(elapsed)}", style=glyphs.DIM))
        self.query_one("#trend-legend", Static).update(_legend(data))


def _legend(data: Trends) -> Text:
    """Each verdict's letter, and the changes in order with the time since the start."""
    text = Text()
    letters = verdict_letters(data.verdicts)
    for name, letter in letters.items():
        text.append(f"{letter} ", style="bold")
        text.append(f"{outcome_label(name)}   ")
    if data.start is not None and data.verdicts:
        text.append("\nchanges: ", style=glyphs.DIM)
        text.append(", ".join(f"+{units.age(c.t - data.start)} {letters[c.bottleneck]} {c.severity}"
                              for c in list(data.verdicts)[-6:]), style=glyphs.DIM)
    return text
