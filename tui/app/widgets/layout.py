"""Which panes fit, in how many columns: a pure function of the terminal size and the user's toggles.

At 80x24 four panes fit in two columns; at 120x36 all six; from 160 columns
three columns. When not everything fits, panes are dropped by priority: the
pane that explains the current bottleneck first, then a fixed order. The
verdict bar and the header are outside this plan and always shown.
"""

from __future__ import annotations

from dataclasses import dataclass

PANE_ORDER = ("device", "memory", "comm", "data", "timeline", "ranks")   # DOM / grid order, keys 1-6
DEFAULT_PRIORITY = ("data", "device", "comm", "memory", "timeline", "ranks")


def pane_key(name: str) -> str:
    """The number key that toggles pane ``name``: its place in ``PANE_ORDER``, from 1."""
    return str(PANE_ORDER.index(name) + 1)


HEATMAP_RANKS = 16           # more ranks than this: the ranks pane is a heatmap across the full width
CHROME_ROWS = 2 + 3 + 1      # header, verdict bar, key line
MIN_PANE_ROWS = 8            # border + 6 lines: below this a pane says too little to be worth it


@dataclass(frozen=True)
class Plan:
    columns: int
    visible: tuple[str, ...]     # in PANE_ORDER
    dropped: tuple[str, ...]     # wanted but no room (the key line says how to see them)
    wide: tuple[str, ...] = ()   # visible panes that span every column (the heatmap of a large job)


def columns_for(width: int) -> int:
    if width >= 160:
        return 3
    if width >= 80:
        return 2
    return 1


def plan(width: int, height: int, lead: str | None = None, hidden: frozenset[str] = frozenset(),
         shown: frozenset[str] = frozenset(), multi_rank: bool = True, many_ranks: bool = False) -> Plan:
    """Panes to show for a terminal of ``width`` x ``height``.

    ``lead`` is the pane holding the verdict's evidence (``Rule.pane``): it is never the one
    dropped. ``hidden``/``shown`` are the user's toggles: hidden panes never show, shown
    ones go first in the priority order. For a single-process job the comm and
    ranks panes rank last (no collectives, one row the header already says).
    """
    cols = columns_for(width)
    rows = max(1, (height - CHROME_ROWS) // MIN_PANE_ROWS)
    priority = list(DEFAULT_PRIORITY)
    if multi_rank:
        priority.remove("ranks")
        priority.insert(3, "ranks")
    else:   # one process: no collectives, one rank row; the timeline says more
        priority.remove("comm")
        priority.insert(priority.index("timeline") + 1, "comm")
    if lead in priority:
        priority.remove(lead)
        priority.insert(0, lead)
    if many_ranks:
        priority.remove("ranks")
        priority.insert(0, "ranks")
    wanted = [p for p in priority if p in shown] + [p for p in priority if p not in shown and p not in hidden]
    capacity = cols * rows
    wide = many_ranks and cols > 1 and "ranks" in wanted[:capacity]
    if wide:   # the heatmap takes a row of its own; the rest fill whole rows
        others = [p for p in wanted if p != "ranks"][:capacity - cols]
        keep = {"ranks", *others[:len(others) - len(others) % cols]}
    else:
        keep = set(wanted[:capacity])
    visible = tuple(p for p in PANE_ORDER if p in keep)
    dropped = tuple(p for p in PANE_ORDER if p in wanted and p not in keep)
    used_cols = min(cols, max(1, len(visible)))
    return Plan(used_cols, visible, dropped, ("ranks",) if wide else ())
