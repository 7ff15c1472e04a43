"""Memory pane: the categories as one stacked bar against the limit, peak, fragmentation, OOMs.

GPU jobs get the allocator breakdown (params, grads, optimizer, activations,
cache, other); CPU jobs get the process RSS against the memory limit the
verdict uses (``PERFMON_MEMORY_LIMIT``, cgroup or machine), with where it came from.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from perfmon_analysis import units
from perfmon_analysis.verdict import Verdict
from perfmon_analysis.views import JobView
from tui.app.widgets import glyphs
from tui.app.widgets.pane import Pane, UiState

CATEGORIES = ("params", "grads", "optimizer", "activations", "cache", "other")
SHORT = {"params": "par", "grads": "grad", "optimizer": "opt", "activations": "act", "cache": "cache",
         "other": "other", "free": "free"}


class MemoryPane(Pane):
    NAME = "memory"

    def draw(self, view: JobView, verdict: Verdict | None, ui: UiState, width: int,
             height: int) -> list[Text] | RenderableType:
        mem = view.metrics.memory
        lines: list[Text] = []
        if mem.source is None:
            lines.append(Text("memory not reported yet", style=glyphs.DIM))
            return lines
        where = "device" if mem.source == "device" else "host RSS"
        head = Text.assemble((f"{where} ", "bold"))
        if mem.rank is not None and len(view.ranks) > 1:
            head.append(f"(fullest: rank {mem.rank}) ", style=glyphs.DIM)
        head.append("peak ")
        head.append_text(glyphs.judged(verdict, "memory", units.pct))
        lines.append(head)
        parts = [(name, float(getattr(mem, f"{name}_bytes") or 0)) for name in CATEGORIES]
        known = sum(v for _, v in parts)
        limit = float(mem.limit_bytes or 0)
        bar_w = max(4, width)
        if known > 0 and limit > 0:
            lines.append(glyphs.stacked_bar(parts, limit, bar_w, ui.mono))
            lines.append(glyphs.legend([n for n, v in parts if v > 0] + ["free"], ui.mono, SHORT))
        elif limit > 0 and mem.peak_bytes is not None:
            style = glyphs.BAD if glyphs.says_yes(verdict, "memory") else glyphs.ACCENT
            lines.append(glyphs.hbar(mem.peak_bytes / limit, bar_w, style=style))
        amounts = Text(f"{units.nbytes(mem.peak_bytes)} of {units.nbytes(mem.limit_bytes)}")
        if mem.limit_source:
            amounts.append(f" limit ({mem.limit_source})", style=glyphs.DIM)
        lines.append(amounts)
        if known > 0:
            cats = Text()
            for name, value in parts:
                if value > 0:
                    cats.append(f"{SHORT[name]} {units.nbytes(value)}  ")
            lines.append(cats)
        tail = Text()
        if mem.fragmentation_bytes is not None:
            tail.append(f"frag {units.nbytes(mem.fragmentation_bytes)}  ")
        if mem.alloc_retries is not None:
            tail.append(f"retries {mem.alloc_retries}", style=glyphs.BAD if mem.alloc_retries_rising else "")
            tail.append("↑  " if mem.alloc_retries_rising else "  ", style=glyphs.BAD)
        tail.append(f"OOMs {mem.ooms}", style=glyphs.BAD if mem.ooms else "")
        lines.append(tail)
        return lines[:height]
