"""Verdict bar: the bottleneck, its headline, the top fix, and the flowchart path that led there.

Always visible (docked at the bottom). The path shows each question's measured
value and answer so the verdict can be checked against the panes at a glance.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from tui.model.verdict import NODES, Verdict, label as outcome_label
from tui.app.widgets import glyphs, units

SHORT_NODE = {"memory": "mem", "device_busy": "busy", "data_wait": "data", "loader_cpu": "loader",
              "comm_exposed": "comm", "straggler": "balance", "syncs": "syncs", "mfu": "MFU"}


def format_value(node_id: str, value: Any) -> str:
    node = NODES[node_id]
    if not isinstance(value, (int, float)):
        return "?"
    if node.unit == "frac":
        return units.pct(value)
    return units.number(value, 2)


def path_steps(verdict: Verdict) -> list[tuple[str, str, str | None]]:
    """(node id, value text, "yes"/"no"/None for skipped) for each question on the path."""
    skipped = verdict.evidence.get("skipped", {}) if isinstance(verdict.evidence, dict) else {}
    out = []
    for i, node_id in enumerate(verdict.path):
        node = NODES.get(node_id)
        if node is None:
            continue
        nxt = verdict.path[i + 1] if i + 1 < len(verdict.path) else verdict.bottleneck
        if node_id in skipped:
            out.append((node_id, "n/a", None))
            continue
        answer = "yes" if nxt == node.yes else "no"
        out.append((node_id, format_value(node_id, verdict.evidence.get(node.quantity)), answer))
    return out


class VerdictBar(Widget):
    DEFAULT_CSS = ("VerdictBar { height: 3; padding: 0 1; background: $panel;"
                   " text-wrap: nowrap; text-overflow: ellipsis; }")

    def __init__(self) -> None:
        super().__init__(id="verdict")
        self._verdict: Verdict | None = None
        self._mono = False

    def show(self, verdict: Verdict, mono: bool) -> None:
        self._verdict, self._mono = verdict, mono
        self.refresh()

    @property
    def verdict(self) -> Verdict | None:
        return self._verdict

    def render(self) -> Text:
        v = self._verdict
        if v is None:
            return Text("verdict: waiting for the first steps…", style=glyphs.DIM)
        colour = glyphs.SEVERITY.get(v.severity, glyphs.ACCENT)
        label = outcome_label(v.bottleneck)
        line1 = Text()
        line1.append(f" {label} ", style=f"bold reverse {colour}")
        line1.append(" ")
        line1.append(_without_label(v.headline, label))
        if v.pending:
            line1.append(f"  (checking: {outcome_label(v.pending)})", style=glyphs.DIM)
        line2 = Text.assemble(("fix: ", "bold"))
        if v.suggestions:
            line2.append(v.suggestions[0])
            if len(v.suggestions) > 1:
                line2.append(f"  (+{len(v.suggestions) - 1} more: f)", style=glyphs.DIM)
        else:
            line2.append("nothing to fix" if v.bottleneck == "healthy" else "—", style=glyphs.DIM)
        line3 = Text.assemble(("path: ", glyphs.DIM))
        for i, (node_id, value, answer) in enumerate(path_steps(v)):
            if i:
                line3.append(" › ", style=glyphs.DIM)
            line3.append(f"{SHORT_NODE.get(node_id, node_id)} {value} ")
            if answer is None:
                line3.append("skip", style=glyphs.DIM)
            else:
                line3.append(answer, style=f"bold {glyphs.BAD if answer == 'yes' else glyphs.OK}")
        if v.path:
            line3.append(f" ⇒ {v.bottleneck}", style=f"bold {colour}")
        findings = [f.get("id") for f in v.findings if f.get("id")]
        if findings:
            line3.append("   also: " + ", ".join(findings), style=glyphs.WARN)
        text = Text("\n").join([line1, line2, line3])
        text.no_wrap = True
        text.overflow = "ellipsis"
        return text


def _without_label(headline: str, label: str) -> str:
    """'Load imbalance: rank 3 ...' after a LOAD IMBALANCE badge reads better as 'rank 3 ...'."""
    prefix, sep, rest = headline.partition(": ")
    if sep and prefix.lower().startswith(label.split()[0].lower()):
        return rest[:1].upper() + rest[1:]
    return headline
