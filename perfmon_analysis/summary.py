"""Per-rank window summaries (wire 1.2 ``summary``): a rank's window statistics in one record.

A relay (``perfmon relay``) keeps the full run model of its node's ranks and sends, for each rank
its viewer does not follow in full, the rank's ``RankStats`` and the running totals ETTR needs,
once a second. The viewer's model then holds that rank as a summary instead of its step
records: every number the ranks pane, the heatmap, the straggler rule and the verdict read comes
from it, at a cost that does not grow with the job's step rate. Written and read here, so both
sides agree on the form: the payload's keys are tables written by hand (``STATS_PAYLOAD``,
``MEMORY_PAYLOAD``) under a version ``v``; a value that is absent or of the wrong type is unknown.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from perfmon_analysis.buffers import RankState
from perfmon_analysis.readings import RankTrace, num
from perfmon_analysis.stats import RankStats
from perfmon_analysis.step_times import StepTimes
from perfmon_analysis.views import MemoryMetrics

SUMMARY_VERSION = 1     # a newer payload may add keys; a key keeps its meaning, so readers read what they know


@dataclasses.dataclass(frozen=True)
class PayloadKey:
    """One key of the summary payload: the value of attribute ``attr``, of type ``kind`` (an int
    stands for a float), read as ``unknown`` when absent or of another type. Written by hand: a
    renamed attribute never renames a key on the wire."""

    key: str
    kind: type
    attr: str
    unknown: Any = None


# ``RankStats`` -> the payload's ``stats``. Unknown is None where the field allows it, else the value
# that decides nothing (a rank still warming up, no steps in its window).
STATS_PAYLOAD: tuple[PayloadKey, ...] = (
    PayloadKey("n", int, "n", 0),
    PayloadKey("span", float, "span", 0.0),
    PayloadKey("warming_up", bool, "warming_up", True),
    PayloadKey("step_median", float, "step_median"),
    PayloadKey("gap_frac", float, "gap_frac"),
    PayloadKey("compute_median", float, "compute_median"),
    PayloadKey("arrive_median", float, "arrive_median"),
    PayloadKey("data_frac", float, "data_frac"),
    PayloadKey("data_cpu_frac", float, "data_cpu_frac"),
    PayloadKey("comm_frac", float, "comm_frac"),
    PayloadKey("exposed_frac", float, "exposed_frac"),
    PayloadKey("comm_estimated", bool, "comm_estimated"),
    PayloadKey("device_busy", float, "device_busy"),
    PayloadKey("busy_source", str, "busy_source"),
    PayloadKey("samples_per_s", float, "samples_per_s"),
    PayloadKey("tokens_per_s", float, "tokens_per_s"),
    PayloadKey("flops_per_s", float, "flops_per_s"),
    PayloadKey("mfu", float, "mfu"),
    PayloadKey("peak_flops", float, "peak_flops"),
    PayloadKey("peak_source", str, "peak_source"),
    PayloadKey("syncs", float, "syncs"),
    PayloadKey("host_lead", float, "host_lead"),
    PayloadKey("loader_cpu", float, "loader_cpu"),
    PayloadKey("loader_workers", int, "loader_workers"),
    PayloadKey("off_cpu_frac", float, "off_cpu_frac"),
    PayloadKey("cpu_contention_frac", float, "cpu_contention_frac"),
    PayloadKey("power_w", float, "power_w"),
    PayloadKey("energy_per_step_j", float, "energy_per_step_j"),
    PayloadKey("loop_frac", float, "loop_frac"),
    PayloadKey("pause_frac", float, "pause_frac"),
    PayloadKey("loop_wait_frac", float, "loop_wait_frac"),
    PayloadKey("busy_why", str, "busy_why"),
    PayloadKey("fill", float, "fill"),
    PayloadKey("gpu_util", float, "gpu_util"),
    PayloadKey("sm_active", float, "sm_active"),
    PayloadKey("tensor_active", float, "tensor_active"),
    PayloadKey("offloaded", float, "offloaded"),
    PayloadKey("device_time", float, "device_time"),
    PayloadKey("lead_steps", float, "lead_steps"),
    PayloadKey("queued_whole", float, "queued_whole"),
)

# ``RankStats`` fields the payload does not carry as scalars, and why.
STATS_NOT_SENT: dict[str, str] = {
    "trace": "the step history comes with the rank's steps, when the viewer follows it in full",
    "memory": "sent as the payload's own ``memory`` table",
    "comm_delta": "sent as the payload's ``comm``",
    "where": "the stack-sample table is the costliest part; the viewer asks for the rank in full to see it",
    "overhead": "the viewer computes it from the rank's samples, which come in full",
}

# ``MemoryMetrics`` -> the payload's ``memory``.
MEMORY_PAYLOAD: tuple[PayloadKey, ...] = (
    PayloadKey("source", str, "source"),
    PayloadKey("rank", int, "rank"),
    PayloadKey("limit_bytes", int, "limit_bytes"),
    PayloadKey("limit_source", str, "limit_source"),
    PayloadKey("peak_bytes", int, "peak_bytes"),
    PayloadKey("peak_frac", float, "peak_frac"),
    PayloadKey("params_bytes", int, "params_bytes"),
    PayloadKey("grads_bytes", int, "grads_bytes"),
    PayloadKey("optimizer_bytes", int, "optimizer_bytes"),
    PayloadKey("activations_bytes", int, "activations_bytes"),
    PayloadKey("cache_bytes", int, "cache_bytes"),
    PayloadKey("other_bytes", int, "other_bytes"),
    PayloadKey("fragmentation_bytes", int, "fragmentation_bytes"),
    PayloadKey("reserved_bytes", int, "reserved_bytes"),
    PayloadKey("allocated_bytes", int, "allocated_bytes"),
    PayloadKey("alloc_retries", int, "alloc_retries"),
    PayloadKey("alloc_retries_rising", bool, "alloc_retries_rising", False),
    PayloadKey("ooms", int, "ooms", 0),
)
MEMORY_NOT_SENT: dict[str, str] = {}


# ``StepTimes`` (the window's and the run's step-time percentiles) -> the payload's ``times``.
TIMES_PAYLOAD: tuple[PayloadKey, ...] = (
    PayloadKey("n", int, "n", 0),
    PayloadKey("p50", float, "p50"),
    PayloadKey("p90", float, "p90"),
    PayloadKey("p99", float, "p99"),
    PayloadKey("max", float, "max"),
    PayloadKey("max_step", int, "max_step"),
)


def summary_record(state: RankState, st: RankStats, t: float, times: tuple[StepTimes, StepTimes] | None = None
                   ) -> dict[str, Any]:
    """The ``summary`` record of ``state`` with its window statistics ``st`` and its step times
    (window, run) (relay side)."""
    last = state.steps[-1] if state.steps else None
    return {
        "k": "summary", "t": t, "v": SUMMARY_VERSION,
        "stats": _known(st, STATS_PAYLOAD),          # unknown (None) values left out: smaller frames
        "memory": _known(st.memory, MEMORY_PAYLOAD),
        **({"times": {"window": _known(times[0], TIMES_PAYLOAD), "run": _known(times[1], TIMES_PAYLOAD)}}
           if times is not None else {}),
        "comm": {op: list(v) for op, v in st.comm_delta.items()},
        "steps": (last.step + 1) if last is not None else 0,
        "first_start": state.first_start, "last_end": state.last_end, "inside": state.inside,
        "loop": state.loop_total, "gaps": state.gap_total, "unseen": state.unseen, "loader_seen": state.loader_seen,
    }


def _known(obj: Any, payload: tuple[PayloadKey, ...]) -> dict[str, Any]:
    return {p.key: v for p in payload if (v := getattr(obj, p.attr)) is not None}


def _read(values: Any, payload: tuple[PayloadKey, ...]) -> dict[str, Any]:
    """Attribute -> value of each key of ``payload`` in ``values``; keys it does not know are ignored."""
    values = values if isinstance(values, dict) else {}
    return {p.attr: _typed(values.get(p.key), p.kind, p.unknown) for p in payload}


@dataclasses.dataclass(frozen=True)
class RankSummary:
    """A rank as its relay summarised it: its statistics and how many steps it has done."""

    stats: RankStats
    steps: int
    times: tuple[StepTimes, StepTimes] | None = None     # the window's and the run's step times


def read_summary(rec: dict[str, Any]) -> RankSummary:
    """The viewer's reading of a ``summary`` record (wire-checked: ``stats`` is a dict) of any payload
    version: the keys it knows, each of the type it expects."""
    values = _read(rec.get("stats"), STATS_PAYLOAD)
    memory = MemoryMetrics(**_read(rec.get("memory"), MEMORY_PAYLOAD))
    comm: dict[str, tuple[int, int, float, float | None]] = {}
    for op, row in (c if isinstance(c := rec.get("comm"), dict) else {}).items():
        if isinstance(op, str) and isinstance(row, list) and len(row) == 4:
            count, nbytes, secs, bus = (num(x) for x in row)
            if count is not None and nbytes is not None and secs is not None:
                comm[op] = (int(count), int(nbytes), secs, bus)
    trace = RankTrace(steps=(), data_wait=(), cpu=())      # a rank's history comes with its steps in full
    stats = RankStats(**values, trace=trace, memory=memory, comm_delta=comm)
    steps = rec.get("steps")
    raw = rec.get("times") if isinstance(rec.get("times"), dict) else None
    times = (StepTimes(**_read(raw.get("window"), TIMES_PAYLOAD)), StepTimes(**_read(raw.get("run"), TIMES_PAYLOAD))) \
        if raw is not None else None
    return RankSummary(stats, steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 else 0,
                       times)


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
    state.steps.clear()
    state.first_start = num(rec.get("first_start"))
    state.last_end = num(rec.get("last_end"))
    state.inside = num(rec.get("inside")) or 0.0
    state.loop_total = num(rec.get("loop")) or 0.0     # an older relay: no loop work between steps told apart
    state.gap_total = num(rec.get("gaps")) or 0.0
    state.unseen = num(rec.get("unseen")) or 0.0
    state.loader_seen = state.loader_seen or rec.get("loader_seen") is True
    state.totals_through = summary.steps - 1
    state.summary_times = summary.times
    return summary.stats
