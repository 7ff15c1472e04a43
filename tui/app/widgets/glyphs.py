"""Drawing helpers shared by the panes: one palette, bars, sparklines and judged numbers.

A judged number is the verdict's answer to one flowchart question, drawn with its
threshold beside it and a text marker (``!`` the problem exit, ``·`` the other) so the
meaning survives ``NO_COLOR``; colours only repeat what the text already says. In monochrome mode stacked bars switch to
distinct fill characters so the categories stay apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from rich.text import Text

from perfmon_analysis.flowchart import Answer, Question
from perfmon_analysis.verdict import CHART, Verdict

# Severity colours (the verdict bar, judged numbers, straggler rows).
OK = "green"
WARN = "yellow"
BAD = "red"
DIM = "grey50"
ACCENT = "cyan"

SEVERITY = {"ok": OK, "info": ACCENT, "warn": WARN, "crit": BAD}

# Categories: memory bar and step timeline use the same colour for the same thing everywhere.
CATEGORY = {
    "params": "#5f87d7", "grads": "#d787d7", "optimizer": "#5fd7d7", "activations": "#d7af5f",
    "cache": "grey62", "other": "grey46", "free": "grey23", "gap": "grey70",
    "data": "#ff5f5f", "forward": "#87d75f", "backward": "#8787ff", "comm": "#af87ff",
}
MONO_FILL = {"params": "█", "grads": "▓", "optimizer": "▒", "activations": "░", "cache": "▞", "other": "▚",
             "free": "·", "data": "▒", "forward": "█", "backward": "▓", "comm": "░"}

SPARK = "▁▂▃▄▅▆▇█"
EIGHTHS = " ▏▎▍▌▋▊▉█"


def category_style(name: str) -> str:
    return CATEGORY.get(name, "grey70")


def sparkline(values: Sequence[float | None], width: int, lo: float = 0.0, hi: float | None = None) -> str:
    """The last ``width`` values as block characters; unknown values are blank."""
    values = list(values)[-width:] if width > 0 else []
    known = [v for v in values if v is not None]
    if not known:
        return " " * len(values)
    top = hi if hi is not None else max(known)
    span = (top - lo) or 1.0
    out = []
    for v in values:
        if v is None:
            out.append(" ")
            continue
        level = (min(max(v, lo), top) - lo) / span
        out.append(SPARK[min(len(SPARK) - 1, int(level * (len(SPARK) - 1) + 0.5))])
    return "".join(out)


def column_chart(values: Sequence[float | None], width: int, height: int, lo: float = 0.0,
                 hi: float = 1.0) -> list[str]:
    """The last ``width`` values as vertical bars ``height`` rows tall (top row first)."""
    values = list(values)[-width:] if width > 0 else []
    span = (hi - lo) or 1.0
    levels = [0.0 if v is None else max(0.0, min(1.0, (v - lo) / span)) * height for v in values]
    rows = []
    for row in range(height):
        below = height - 1 - row
        line = []
        for level in levels:
            fill = level - below
            line.append("█" if fill >= 1 else " " if fill <= 0 else SPARK[min(7, int(fill * 8))])
        rows.append("".join(line))
    return rows


def hbar(frac: float | None, width: int, style: str = ACCENT, back: str = "grey23") -> Text:
    """A horizontal gauge with eighth-cell resolution; unknown draws an empty track."""
    text = Text()
    if width <= 0:
        return text
    if frac is None:
        return Text("·" * width, style=DIM)
    cells = max(0.0, min(1.0, frac)) * width
    full = int(cells)
    part = EIGHTHS[int((cells - full) * 8)] if full < width else ""
    text.append("█" * full, style=style)
    if part.strip():
        text.append(part, style=style)
        full += 1
    text.append("─" * (width - full), style=back)
    return text


def stacked_bar(parts: Iterable[tuple[str, float]], total: float, width: int, mono: bool = False) -> Text:
    """One bar split into named parts (in order) against ``total``; rounding goes to the largest part."""
    parts = [(name, max(0.0, value)) for name, value in parts]
    text = Text()
    if width <= 0 or total <= 0:
        return text
    cells = [int(value / total * width) for _, value in parts]
    leftover = min(width, int(sum(v for _, v in parts) / total * width + 0.5)) - sum(cells)
    if leftover > 0 and parts:
        biggest = max(range(len(parts)), key=lambda i: parts[i][1])
        cells[biggest] += leftover
    used = 0
    for (name, _), n in zip(parts, cells):
        n = min(n, width - used)
        if n <= 0:
            continue
        if mono:
            text.append(MONO_FILL.get(name, "#") * n)
        else:
            text.append("█" * n, style=category_style(name))
        used += n
    if used < width:
        text.append(("·" if mono else "─") * (width - used), style=DIM)
    return text


def threshold_text(question: Question, fmt: Callable[[float | None], str], threshold: float | None = None) -> str:
    """'≥5%', '<70%', '>90%': the question's test as the panes print it."""
    sign = {"<": "<", ">": ">"}.get(question.op, "≥")
    return sign + fmt(question.threshold if threshold is None else threshold)


def answer(verdict: Verdict | None, question_id: str) -> Answer | None:
    """The verdict's answer to one question; None before the first verdict."""
    return verdict.answers.get(question_id) if verdict is not None else None


def says_yes(verdict: Verdict | None, question_id: str) -> bool:
    """Did the verdict take the question's problem exit?"""
    got = answer(verdict, question_id)
    return got is not None and got.answer == "yes"


def judged(verdict: Verdict | None, question_id: str, fmt: Callable[[float | None], str]) -> Text:
    """``38% ! (≥5%)``: the verdict's answer to a flowchart question, as every pane draws it.

    Value, marker and threshold all come from the verdict's ``Answer`` (``!`` for its "yes",
    ``·`` for its "no", none where it could not ask), so a pane never judges a number itself
    and cannot disagree with the verdict; where the answer was not the value against the
    threshold (a larger loss, an OOM) the bracket says what decided instead. Colour is kept
    for questions on the verdict's live path; off the path the marker stays but is dimmed, so
    a number that did not decide anything does not shout.
    """
    question = CHART.questions[question_id]
    got = answer(verdict, question_id)
    text = Text.assemble((fmt(got.value if got is not None else None), "bold"))
    if got is not None and got.answer is not None:
        yes = got.answer == "yes"
        live = verdict is not None and question_id in verdict.path
        if live:
            text.stylize(BAD if yes else OK)
        text.append(" !" if yes else " ·", style=(BAD if yes else DIM) if live else DIM)
    if got is not None and got.decided_by:
        text.append(f" ({got.decided_by})", style=DIM)
    else:
        text.append(f" ({threshold_text(question, fmt, got.threshold if got is not None else None)})", style=DIM)
    return text


def legend(names: Iterable[str], mono: bool = False, labels: dict[str, str] | None = None) -> Text:
    """Colour (or fill-character) key for a stacked bar."""
    text = Text()
    for i, name in enumerate(names):
        if i:
            text.append(" ")
        if mono:
            text.append(MONO_FILL.get(name, "#"))
        else:
            text.append("█", style=category_style(name))
        text.append((labels or {}).get(name, name), style=DIM)
    return text
