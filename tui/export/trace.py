"""``perfmon export --trace``: recordings as one Chrome / Perfetto trace, a process per rank.

Operator traces are what break trace viewers; this one is sized for hours of training. Each
rank gets:

* a counter track ``step ms``: the step's parts stacked (``gap`` between steps, ``data`` wait,
  ``forward``, ``backward``, ``optimizer``, ``other``) and the exposed communication ``comm``
  beside them, in milliseconds; a sample per step up to ``MAX_SAMPLES`` steps per rank, beyond
  that the mean of each run of consecutive steps, so a rank's track stays about 0.5 MB however
  long the training ran;
* a ``steps`` thread with a slice per step and its phases nested under it, for the steps of one
  range of step numbers (a ``StepRange``): the most recent ``DETAIL_STEPS`` steps of the run by
  default, so the file stays small however long the run while the end, where a run usually
  failed or slowed, is there to click on; the thread's name and the trace's ``otherData`` say
  which steps have slices;
* a ``pauses`` thread with a slice for every gap between steps of ``PAUSE_S`` or more
  (checkpoints, evaluation) and for every stall, and an instant event per ``event`` record.

Steps are read as the run model reads them (``perfmon_analysis.buffers.StepParser``), so a
step's gap here is the one the TUI shows, a checkpoint's seconds included when the step did not
say. Timestamps are integer microseconds from the earliest record. ``trace_events`` is pure.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmon_analysis.buffers import StepParser
from perfmon_analysis.readings import StepReading, event_reading, num
from tui.stream.sources import LoadedRecording

DETAIL_STEPS = 2000
MAX_SAMPLES = 5000
PAUSE_S = 1.0
PHASES = ("data", "forward", "backward", "optimizer", "other")
STEPS_TID, PAUSES_TID = 1, 2


@dataclass(frozen=True)
class StepRange:
    """Step numbers ``first`` up to ``stop`` (excluded), as ``--steps A:B`` reads; None: open."""

    first: int | None = None
    stop: int | None = None

    def __contains__(self, step: int) -> bool:
        return (self.first is None or step >= self.first) and (self.stop is None or step < self.stop)

    def text(self) -> str:
        return f"{'' if self.first is None else self.first}:{'' if self.stop is None else self.stop}"


def _default_range(steps_of: list[list[StepReading]]) -> StepRange | None:
    """The most recent ``DETAIL_STEPS`` step numbers of the run (None: the run has no steps)."""
    last = max((s.step for steps in steps_of for s in steps), default=None)
    return None if last is None else StepRange(max(0, last + 1 - DETAIL_STEPS), last + 1)


def trace_document(recordings: Iterable[LoadedRecording], chosen: StepRange | None = None) -> dict[str, Any]:
    """The trace as one JSON object (pure): its events, and in ``otherData`` which steps have
    slices (``chosen``, else the most recent ``DETAIL_STEPS``) and how many steps the run has."""
    recordings = list(recordings)
    steps_of = [_steps(rec.records) for rec in recordings]
    shown = chosen if chosen is not None else _default_range(steps_of)
    sliced = sum(1 for steps in steps_of for s in steps if shown is not None and s.step in shown)
    total = sum(len(steps) for steps in steps_of)
    if shown is None:
        which = "no steps in the recordings"
    elif chosen is None:
        which = f"default: the most recent {DETAIL_STEPS}; --steps A:B picks others"
    else:
        which = "--steps"
    meta = {"perfmon_step_slices": shown.text() if shown is not None else None,
            "perfmon_step_slices_chosen_by": which,
            "perfmon_sliced_steps": sliced,
            "perfmon_steps": total,
            "perfmon_counter": "every step of the run"}
    return {"traceEvents": _events(recordings, steps_of, shown), "displayTimeUnit": "ms", "otherData": meta}


def trace_events(recordings: Iterable[LoadedRecording], chosen: StepRange | None = None) -> list[dict[str, Any]]:
    """The trace's events for every rank in ``recordings`` (pure)."""
    return trace_document(recordings, chosen)["traceEvents"]


def _events(recordings: list[LoadedRecording], steps_of: list[list[StepReading]],
            shown: StepRange | None) -> list[dict[str, Any]]:
    times = [r["t"] for rec in recordings for r in rec.records[:1] + rec.records[-1:]]
    starts = [s.start for steps in steps_of for s in steps if s.start]
    origin = min(times + starts, default=0.0)
    events: list[dict[str, Any]] = []
    for pid, (rec, steps) in enumerate(zip(recordings, steps_of)):
        hello = next((r for r in rec.records if r["k"] == "hello"), {})
        rank = hello.get("rank", pid)
        label = f"rank {rank}" + (f" ({hello['host']})" if isinstance(hello.get("host"), str) else "")
        if hello.get("restart"):
            label += f" restart {hello['restart']}"
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": label}})
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": pid}})
        if shown is not None and any(step.step in shown for step in steps):
            events.append({"ph": "M", "pid": pid, "tid": STEPS_TID, "name": "thread_name",
                           "args": {"name": f"steps {shown.text()}"}})
        events.append({"ph": "M", "pid": pid, "tid": PAUSES_TID, "name": "thread_name",
                       "args": {"name": "pauses and events"}})
        for step in steps:
            events.extend(_step_events(step, pid, origin, shown is not None and step.step in shown))
        per_sample = -(-len(steps) // MAX_SAMPLES)
        for i in range(0, len(steps), per_sample):
            events.append(_counter(steps[i:i + per_sample], pid, origin))
        for r in rec.records:
            if r["k"] == "event":
                events.append({"ph": "i", "s": "p", "pid": pid, "tid": PAUSES_TID, "ts": _us(r["t"], origin),
                               "name": str(r.get("name")), "args": _event_args(r)})
            elif r["k"] == "stall" and r.get("n") == 1:
                since = num(r.get("since")) or r["t"]
                events.append({"ph": "B", "pid": pid, "tid": PAUSES_TID, "ts": _us(since, origin), "name": "stall",
                               "args": {"where": r.get("where"), "stack": (r.get("stack") or [])[-3:]}})
            elif r["k"] == "resumed":
                events.append({"ph": "E", "pid": pid, "tid": PAUSES_TID, "ts": _us(r["t"], origin)})
    return events


def _steps(records: list[dict[str, Any]]) -> list[StepReading]:
    """A rank's steps, in order, as the run model parses them (blocking events give a gap)."""
    parser = StepParser()
    steps = []
    for r in records:
        if r["k"] == "event":
            parser.event(event_reading(r))
        elif r["k"] == "step" and (step := parser.step(r)) is not None:
            steps.append(step)
    return steps


def _step_events(step: StepReading, pid: int, origin: float, detail: bool) -> list[dict[str, Any]]:
    begin = _begin(step)        # ``start``: the previous step's end
    out: list[dict[str, Any]] = []
    if step.gap >= PAUSE_S:
        out.append({"ph": "X", "pid": pid, "tid": PAUSES_TID, "ts": _us(begin, origin), "dur": _us(step.gap, 0.0),
                    "name": "between steps"})
    if detail:                   # the gap, then the data wait, then the phases: they add up to ``dur``
        t = begin + step.gap
        out.append({"ph": "X", "pid": pid, "tid": STEPS_TID, "ts": _us(t, origin),
                    "dur": _us(step.dur - step.gap, 0.0), "name": f"step {step.step}"})
        for phase in PHASES:
            seconds = _phase(step, phase)
            if seconds > 0:
                out.append({"ph": "X", "pid": pid, "tid": STEPS_TID, "ts": _us(t, origin), "dur": _us(seconds, 0.0),
                            "name": phase})
                t += seconds
    return out


def _begin(step: StepReading) -> float:
    return step.start if step.start is not None else -step.dur


def _counter(steps: list[StepReading], pid: int, origin: float) -> dict[str, Any]:
    """One ``step ms`` sample: the mean parts of ``steps`` (consecutive), at the first one's start."""
    sums: dict[str, float] = {}
    comm: list[float] = []
    for step in steps:
        for part in ("gap", *PHASES):
            value = step.gap if part == "gap" else _phase(step, part)
            sums[part] = sums.get(part, 0.0) + value
        if step.exposed is not None:
            comm.append(step.exposed)
    args = {k: _ms(v / len(steps)) for k, v in sums.items() if v > 0}
    if len(comm) == len(steps):
        args["comm"] = _ms(sum(comm) / len(comm))
    return {"ph": "C", "pid": pid, "ts": _us(_begin(steps[0]), origin), "name": "step ms", "args": args}


def _ms(seconds: float) -> float | int:
    value = round(seconds * 1e3, 2)
    return int(value) if value == int(value) else value


def write_trace(recordings: Iterable[LoadedRecording], out: str | Path,
                chosen: StepRange | None = None) -> tuple[dict[str, Any], int]:
    """Write the trace (gzip when ``out`` ends in .gz, which Perfetto and chrome://tracing open);
    return (the document, bytes written)."""
    document = trace_document(recordings, chosen)
    data = json.dumps(document, separators=(",", ":")).encode()
    path = Path(out)
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    return document, len(data)


def _phase(step: StepReading, name: str) -> float:
    return max(0.0, step.phase(name) or 0.0)


def _event_args(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in r.items() if k not in ("k", "t", "name") and isinstance(v, (str, int, float, bool))}


def _us(t: float, origin: float) -> int:
    return int(round((t - origin) * 1e6))

