"""Drawing of the ranks pane's heatmap (``perfmon_analysis.heatmap``): one column per rank, grouped by
node, a row per quantity, a page at a time when the job has more ranks than fit.

The level is a fill character as well as a colour, so the map reads the same under NO_COLOR.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from perfmon_analysis import units
from perfmon_analysis.heatmap import METRICS, HeatMap
from tui.app.widgets import glyphs

FILL = "·░▒▓█"                 # level 0 (cool) .. 4 (hot)
HEAT = ("grey42", "#87af5f", "#d7af00", "#ff8700", "#ff005f")
LABEL_W = 5                   # "step " before each row
BAND_ROWS = 1 + len(METRICS)  # the node names, then a row per quantity


@dataclass(frozen=True)
class Page:
    bands: tuple[tuple[int | None, ...], ...]   # per band: column index per cell (None: gap between nodes)
    number: int
    count: int
    ranks: int                                  # ranks on a full page


def pages(hm: HeatMap, width: int, height: int) -> list[Page]:
    """Cut the columns into bands of ``width - LABEL_W`` cells (a gap between nodes) and the bands
    into pages of as many as ``height`` lines hold beside the headline and the legend."""
    cells = max(4, width - LABEL_W)
    per_page = max(1, (height - 2) // BAND_ROWS)
    bands: list[tuple[int | None, ...]] = []
    band: list[int | None] = []
    for _host, first, count in hm.nodes:
        if band and len(band) + 2 > cells:
            bands.append(tuple(band))
            band = []
        if band:
            band.append(None)
        for col in range(first, first + count):
            if len(band) >= cells:
                bands.append(tuple(band))
                band = []
            band.append(col)
    if band:
        bands.append(tuple(band))
    grouped = [bands[i:i + per_page] for i in range(0, len(bands), per_page)] or [[]]
    full = sum(1 for b in grouped[0] for c in b if c is not None)
    return [Page(tuple(g), n, len(grouped), full) for n, g in enumerate(grouped)]


def draw(hm: HeatMap, selected: int | None, mono: bool, width: int, height: int) -> tuple[list[Text], Page]:
    """The pane's lines, and the page shown: the one holding ``selected`` (else the first)."""
    all_pages = pages(hm, width, height)
    column = hm.ranks.index(selected) if selected in hm.ranks else None
    page = next((p for p in all_pages if column is not None and any(column in b for b in p.bands)), all_pages[0])
    lines = [_headline(hm, width)]
    for band in page.bands:
        lines.append(_node_row(hm, band))
        for label, _, _, _ in METRICS:
            row = Text(f"{label:<{LABEL_W}}", style=glyphs.DIM)
            run, run_style = "", ""          # cells of one style go in one span (1,024 ranks: few spans)
            for col in band:
                lvl = None if col is None else hm.levels[label][col]
                style = "" if mono or lvl is None else HEAT[lvl]
                if col is not None and col == column:
                    style = f"{style} reverse".strip()
                if style != run_style and run:
                    row.append(run, style=run_style)
                    run = ""
                run_style = style
                run += " " if lvl is None else FILL[lvl]
            if run:
                row.append(run, style=run_style)
            lines.append(row)
    lines.append(_legend(hm, page, width))
    return lines[:height], page


def _headline(hm: HeatMap, width: int) -> Text:
    line = Text()
    if hm.slowest_rank is not None and hm.slowest_ratio is not None:
        where = f" on {hm.slowest_rank_host}" if hm.slowest_rank_host and len(hm.nodes) > 1 else ""
        style = glyphs.BAD if hm.slowest_rank_marked else ""
        line.append(f"slowest rank {hm.slowest_rank}{where}: {hm.slowest_by} {units.ratio(hm.slowest_ratio)}x "
                    "the fastest",
                    style=style)
        line.append(" (g)", style=glyphs.DIM)
    if hm.slowest_node is not None and hm.slowest_node_ratio is not None:
        line.append(" · " if line.plain else "")
        line.append(f"slowest node {hm.slowest_node} {units.ratio(hm.slowest_node_ratio)}x",
                    style=glyphs.BAD if hm.slowest_node_marked else "")
    if not line.plain:
        line.append("no step times yet", style=glyphs.DIM)
    line.truncate(width, overflow="ellipsis")
    return line


def _node_row(hm: HeatMap, band: tuple[int | None, ...]) -> Text:
    """Each group's name (its node, or its stage and replica) over its first column, cut to the columns
    its ranks take in this band."""
    groups = hm.groups or hm.hosts
    row = Text(f"{'node' if hm.group_by == 'node' else 'place':<{LABEL_W}}", style=glyphs.DIM)
    i = 0
    while i < len(band):
        col = band[i]
        if col is None:
            row.append(" ")
            i += 1
            continue
        j = i
        while j < len(band) and (other := band[j]) is not None and groups[other] == groups[col]:
            j += 1
        row.append(f"{(groups[col] or '?')[:j - i]:<{j - i}}", style="bold")
        i = j
    return row


def _legend(hm: HeatMap, page: Page, width: int) -> Text:
    line = Text(FILL, style=glyphs.DIM)
    line.append(" cool→hot", style=glyphs.DIM)
    shown = [c for b in page.bands for c in b if c is not None]
    if page.count > 1 and shown:
        line.append(f" · ranks {hm.ranks[shown[0]]}..{hm.ranks[shown[-1]]} of {len(hm.ranks)}, "
                    f"page {page.number + 1}/{page.count} ([ ] pages)", style=glyphs.DIM)
    else:
        line.append(" · step, comp: x fastest rank", style=glyphs.DIM)
    line.truncate(width, overflow="ellipsis")
    return line
