"""Per-rank window summaries (wire 1.2 ``summary``): a rank's window statistics in one record.

A relay (``perfmon relay``) keeps the full run model of its node's ranks and sends, for each rank
its viewer does not follow in full, the rank's ``RankStats`` and the running totals ETTR needs,
at most twice a second. The viewer's model then holds that rank as a summary instead of its step
records: every number the ranks pane, the heatmap, the straggler rule and the verdict read comes
from it, at a cost that does not grow with the job's step rate. Written and read here, so both
sides agree on the form; a field that is absent or of the wrong type is unknown (None).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tui.model.buffers import TIMELINE_STEPS, RankState, num
from tui.model.readings import RankTrace
from tui.model.stats import RankStats
from tui.model.views import MemoryMetrics

_SKIP = ("trace", "memory", "comm_delta")
_CASTS = {"int": int, "float": float, "bool": bool, "str": str}


def _field_types(cls: type) -> dict[str, tuple[type, bool]]:
    """name -> (type, may be None) for a dataclass of scalar fields (annotations are strings here)."""
    out = {}
    for f in dataclasses.fields(cls):
        parts = [p.strip() for p in str(f.type).split("|")]
        if f.name not in _SKIP and parts[0] in _CASTS:
            out[f.name] = (_CASTS[parts[0]], "None" in parts)
    return out


STATS_FIELDS = _field_types(RankStats)
MEMORY_FIELDS = _field_types(MemoryMetrics)


def summary_record(state: RankState, st: RankStats, t: float, window: tuple[int, float]) -> dict[str, Any]:
    """The ``summary`` record of ``state`` with its window statistics ``st`` (relay side)."""
    last = state.steps[-1] if state.steps else None
    return {
        "k": "summary", "t": t,
        "stats": {name: getattr(st, name) for name in STATS_FIELDS},
        "memory": {name: getattr(st.memory, name) for name in MEMORY_FIELDS},
        "comm": {op: list(v) for op, v in st.comm_delta.items()},
        "steps": (last["step"] + 1) if last is not None else 0,
        "first_start": state.first_start, "last_end": state.last_end, "inside": state.inside,
        "gap_total": state.gap_total, "unseen": state.unseen, "loader_seen": state.loader_seen,
        "data_wait": [round(x, 4) for x in st.trace.data_wait[-TIMELINE_STEPS:]],
        "window": [window[0], window[1]],
    }


@dataclasses.dataclass(frozen=True)
class RankSummary:
    """A rank as its relay summarised it: its statistics and how many steps it has done."""

    stats: RankStats
    steps: int


def read_summary(rec: dict[str, Any]) -> RankSummary:
    """The viewer's reading of a ``summary`` record (wire-checked: ``stats`` is a dict)."""
    stats_in = rec.get("stats") if isinstance(rec.get("stats"), dict) else {}
    values = {name: _typed(stats_in.get(name), kind, optional) for name, (kind, optional) in STATS_FIELDS.items()}
    mem_in = rec.get("memory") if isinstance(rec.get("memory"), dict) else {}
    memory = MemoryMetrics(**{name: v for name, (kind, optional) in MEMORY_FIELDS.items()
                              if (v := _typed(mem_in.get(name), kind, optional)) is not None})
    comm: dict[str, tuple[int, int, float, float | None]] = {}
    for op, row in (rec.get("comm") if isinstance(rec.get("comm"), dict) else {}).items():
        if isinstance(op, str) and isinstance(row, list) and len(row) == 4:
            count, nbytes, secs, bus = (num(x) for x in row)
            if count is not None and nbytes is not None and secs is not None:
                comm[op] = (int(count), int(nbytes), secs, bus)
    waits = rec.get("data_wait") if isinstance(rec.get("data_wait"), list) else []
    trace = RankTrace(steps=(), data_wait=tuple(x for x in map(num, waits) if x is not None), cpu=())
    stats = RankStats(**values, trace=trace, memory=memory, comm_delta=comm)
    steps = rec.get("steps")
    return RankSummary(stats, steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 else 0)


def _typed(value: Any, kind: type, optional: bool) -> Any:
    """``value`` if it is a ``kind`` (an int stands for a float), else None (unknown), or the
    field's zero when it cannot be None (``n``, ``span``, ``warming_up``)."""
    if kind is float:
        v: Any = num(value)
    elif kind is int:
        v = value if isinstance(value, int) and not isinstance(value, bool) else None
    else:
        v = value if isinstance(value, kind) else None
    if v is None and not optional:
        return True if kind is bool else kind()
    return v


def apply_summary(state: RankState, rec: dict[str, Any]) -> RankStats:
    """Hold ``state`` as the relay's summary says: its statistics and running totals replace its
    step buffers (stale once the relay stops sending steps). Steps sent again later (the viewer
    subscribed) start from the relay's buffer; those up to the summary's last step are already
    in the totals and are not counted twice."""
    summary = read_summary(rec)
    state.summary_steps = summary.steps
    state.steps.clear()
    state.nums.clear()
    state.first_start = num(rec.get("first_start"))
    state.last_end = num(rec.get("last_end"))
    state.inside = num(rec.get("inside")) or 0.0
    state.gap_total = num(rec.get("gap_total")) or 0.0
    state.unseen = num(rec.get("unseen")) or 0.0
    state.loader_seen = state.loader_seen or rec.get("loader_seen") is True
    state.totals_through = summary.steps - 1
    return summary.stats
