"""Per-rank window summaries (wire 1.2 ``summary``): a rank's window statistics in one record.

A relay (``perfmon relay``) keeps the full run model of its node's ranks and sends, for each rank
its viewer does not follow in full, the rank's ``RankStats`` and the running totals ETTR needs,
once a second. The viewer's model then holds that rank as a summary instead of its step
records: every number the ranks pane, the heatmap, the straggler rule and the verdict read comes
from it, at a cost that does not grow with the job's step rate. Written and read here, so both
sides agree on the form; a field that is absent or of the wrong type is unknown (None).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from perfmon_analysis.buffers import RankState
from perfmon_analysis.readings import RankTrace, num
from perfmon_analysis.stats import RankStats
from perfmon_analysis.views import MemoryMetrics

_SKIP = ("trace", "memory", "comm_delta")
_CASTS = {"int": int, "float": float, "bool": bool, "str": str}


def _field_types(cls: type) -> dict[str, tuple[type, Any]]:
    """name -> (type, value when unknown) for a dataclass's scalar fields (annotations are strings
    here). Unknown is None where the field allows it, else the field's default, else the value that
    decides nothing (``warming_up`` True, a count 0)."""
    out = {}
    for f in dataclasses.fields(cls):
        parts = [p.strip() for p in str(f.type).split("|")]
        if f.name in _SKIP or parts[0] not in _CASTS:
            continue
        kind = _CASTS[parts[0]]
        if "None" in parts:
            unknown = None
        elif f.default is not dataclasses.MISSING:
            unknown = f.default
        else:
            unknown = True if kind is bool else kind()
        out[f.name] = (kind, unknown)
    return out


STATS_FIELDS = _field_types(RankStats)
MEMORY_FIELDS = _field_types(MemoryMetrics)


def summary_record(state: RankState, st: RankStats, t: float) -> dict[str, Any]:
    """The ``summary`` record of ``state`` with its window statistics ``st`` (relay side)."""
    last = state.readings[-1] if state.readings else None
    return {
        "k": "summary", "t": t,
        "stats": _known(st, STATS_FIELDS),          # unknown (None) fields left out: smaller frames
        "memory": _known(st.memory, MEMORY_FIELDS),
        "comm": {op: list(v) for op, v in st.comm_delta.items()},
        "steps": (last.step + 1) if last is not None else 0,
        "first_start": state.first_start, "last_end": state.last_end, "inside": state.inside,
        "unseen": state.unseen, "loader_seen": state.loader_seen,
    }


def _known(obj: Any, names: dict[str, Any]) -> dict[str, Any]:
    return {name: v for name in names if (v := getattr(obj, name)) is not None}


@dataclasses.dataclass(frozen=True)
class RankSummary:
    """A rank as its relay summarised it: its statistics and how many steps it has done."""

    stats: RankStats
    steps: int


def read_summary(rec: dict[str, Any]) -> RankSummary:
    """The viewer's reading of a ``summary`` record (wire-checked: ``stats`` is a dict)."""
    stats_in = rec.get("stats") if isinstance(rec.get("stats"), dict) else {}
    values = {name: _typed(stats_in.get(name), kind, unknown) for name, (kind, unknown) in STATS_FIELDS.items()}
    mem_in = rec.get("memory") if isinstance(rec.get("memory"), dict) else {}
    memory = MemoryMetrics(**{name: _typed(mem_in.get(name), kind, unknown)
                              for name, (kind, unknown) in MEMORY_FIELDS.items()})
    comm: dict[str, tuple[int, int, float, float | None]] = {}
    for op, row in (rec.get("comm") if isinstance(rec.get("comm"), dict) else {}).items():
        if isinstance(op, str) and isinstance(row, list) and len(row) == 4:
            count, nbytes, secs, bus = (num(x) for x in row)
            if count is not None and nbytes is not None and secs is not None:
                comm[op] = (int(count), int(nbytes), secs, bus)
    trace = RankTrace(steps=(), data_wait=(), cpu=())      # a rank's history comes with its steps in full
    stats = RankStats(**values, trace=trace, memory=memory, comm_delta=comm)
    steps = rec.get("steps")
    return RankSummary(stats, steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 else 0)


def _typed(value: Any, kind: type, unknown: Any) -> Any:
    """``value`` if it is a ``kind`` (an int stands for a float), else ``unknown``."""
    if kind is float:
        v: Any = num(value)
    elif kind is int:
        v = value if isinstance(value, int) and not isinstance(value, bool) else None
    else:
        v = value if isinstance(value, kind) else None
    return unknown if v is None else v


def apply_summary(state: RankState, rec: dict[str, Any]) -> RankStats:
    """Hold ``state`` as the relay's summary says: its statistics and running totals replace its
    step buffers (stale once the relay stops sending steps). Steps sent again later (the viewer
    subscribed) start from the relay's buffer; those up to the summary's last step are already
    in the totals and are not counted twice."""
    summary = read_summary(rec)
    state.summary_steps = summary.steps
    state.steps.clear()
    state.readings.clear()
    state.first_start = num(rec.get("first_start"))
    state.last_end = num(rec.get("last_end"))
    state.inside = num(rec.get("inside")) or 0.0
    state.unseen = num(rec.get("unseen")) or 0.0
    state.loader_seen = state.loader_seen or rec.get("loader_seen") is True
    state.totals_through = summary.steps - 1
    return summary.stats
