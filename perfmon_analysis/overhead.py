"""perfmon's own cost over the window, from the probe's running totals (``CostReading``).

Two shares a user weighs before leaving the monitor in a job:

* ``step_frac``: seconds the training thread spent in the probe's step calls per step, and in
  its ``step()``/``loader()``/``phase()`` wrappers around them (calls counted, each at the cost a
  call calibrated at start-up), over the rank's median step time: the slowdown it adds to each step;
* ``cpu_frac``: the CPU of the probe's threads plus that training-thread time, over the whole
  process's CPU in the same interval: the cores it takes from the job.

The training thread also waits for the GIL while a probe thread holds it, which no clock on
that thread can tell from its own work; ``train_bound_per_step_s`` bounds it: the training-thread
time plus all the probe threads' CPU per step, as if every bit of it had held the GIL while the
training thread wanted it.

Each part (the step calls, each step hook, each thread, memory, bytes out) is listed with its
value, its share where it has one, and where the number comes from. A part the probe did not
measure has no value and says why; it never reads as 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from perfmon_analysis import units
from perfmon_analysis.readings import CostReading

STEP_BUDGET = 0.01      # over this share of the step, the probe's cost is a finding
CPU_BUDGET = 0.05       # over this share of the process's CPU, likewise,
CPU_FLOOR = 0.05        # when it also takes more than this many cores: a job that idles its CPU (waiting
                        # for its loader) makes a cost of a few thousandths of a core a large share

STEP_CALLS = "step calls"   # the training-thread part outside the step hooks
# the wrappers' parts: the code around the step calls' clock reads, by wrapper
WRAPPER_PARTS = {"step": "step() call", "loader": "loader()", "phase": "phase()"}

_TRAIN_SOURCE = "training-thread clock reads around the probe's step calls"
_HOOK_SOURCE = "clock reads around each step hook"
_WRAPPER_SOURCE = "calls counted x {} a call, calibrated at start-up"
_WRAPPER_WHY = "not reported (a probe that does not calibrate its wrappers)"
_THREAD_SOURCE = "the thread's CPU clock"
_MEMORY_SOURCE = "the probe's queue and buffer sizes"
_IO_SOURCE = "the sender's byte counters"


@dataclass(frozen=True)
class CostPart:
    """One part of the cost. ``kind``: "train" (s per step, share of the step), "thread" (cores,
    share of the process CPU), "memory" (bytes or items), "io" (bytes/s)."""

    name: str
    kind: str
    value: float | None
    unit: str
    share: float | None
    source: str
    why: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"part": self.name, "kind": self.kind, "value": _round(self.value), "unit": self.unit,
                "share": _round(self.share), "source": self.source, "why": self.why}

    @property
    def shown(self) -> str:
        return shown(self.kind, self.unit, self.value)


def shown(kind: str, unit: str, value: float | None) -> str:
    """A part's value as a person reads it."""
    if value is None:
        return units.NA
    if kind == "train":
        return f"{units.seconds(value)}/step"
    if kind == "thread":
        return f"{units.number(value)} cores"
    if kind == "io":
        return units.bandwidth(value)
    return units.nbytes(value) if unit == "bytes" else units.count(value)


@dataclass(frozen=True)
class Overhead:
    """One rank's probe cost over the window (the job's: the rank where it is highest)."""

    rank: int
    seconds: float                 # wall time between the two samples compared
    steps: int                     # steps between them
    step_frac: float | None
    cpu_frac: float | None
    train_per_step_s: float | None
    parts: tuple[CostPart, ...]
    cores: float | None = None     # the probe's CPU seconds per second: its threads and its step calls
    train_bound_per_step_s: float | None = None   # with the probe threads' CPU as GIL waits: at most this

    @property
    def step_over(self) -> bool:
        return self.step_frac is not None and self.step_frac > STEP_BUDGET

    @property
    def cpu_over(self) -> bool:
        return (self.cpu_frac is not None and self.cpu_frac > CPU_BUDGET
                and self.cores is not None and self.cores > CPU_FLOOR)

    @property
    def over_budget(self) -> bool:
        """The probe costs more than its budget: the ``perfmon_cost`` finding's question, which the
        header shows and does not ask again."""
        return self.step_over or self.cpu_over

    def worst(self) -> tuple[CostPart | None, CostPart | None]:
        """(the training-thread part, the thread) that costs the most."""
        train = [p for p in self.parts if p.kind == "train" and p.value is not None]
        threads = [p for p in self.parts if p.kind == "thread" and p.value is not None]
        return (max(train, key=lambda p: p.value or 0.0, default=None),
                max(threads, key=lambda p: p.value or 0.0, default=None))

    def as_json(self) -> dict[str, Any]:
        """The report's ``overhead`` object."""
        return {"rank": self.rank, "window_s": _round(self.seconds), "steps": self.steps,
                "step_frac": _round(self.step_frac), "cpu_frac": _round(self.cpu_frac),
                "train_per_step_s": _round(self.train_per_step_s),
                "train_bound_per_step_s": _round(self.train_bound_per_step_s), "cores": _round(self.cores),
                "step_budget": STEP_BUDGET, "cpu_budget": CPU_BUDGET, "cpu_floor_cores": CPU_FLOOR,
                "parts": [p.as_json() for p in self.parts]}


def overhead(rank: int, costs: Iterable[CostReading], step_median: float | None) -> Overhead | None:
    """The cost between the window's first and last sample that carries one; None with fewer than two."""
    costs = [c for c in costs if c.t is not None]
    if len(costs) < 2:
        return None
    a, b = costs[0], costs[-1]
    wall = (b.t or 0.0) - (a.t or 0.0)
    if wall <= 0:
        return None
    steps = _delta(a.train_steps, b.train_steps)
    wrapper_parts, wrapped = _wrapper_parts(a, b, steps, step_median)
    train = _delta(a.train_s, b.train_s)
    if train is not None:
        train += wrapped
    per_step = train / steps if train is not None and steps else None
    step_frac = per_step / step_median if per_step is not None and step_median else None
    parts: list[CostPart] = []
    hooks_a = dict(a.hooks)
    hook_parts = []
    for name, total in b.hooks:
        spent = total - hooks_a.get(name, 0.0)
        if steps and spent > 0:
            hook_parts.append(_train_part(name, spent / steps, step_median, _HOOK_SOURCE))
    if per_step is not None:
        own = max(0.0, per_step - sum(p.value or 0.0 for p in hook_parts + wrapper_parts))
        parts.append(_train_part(STEP_CALLS, own, step_median, _TRAIN_SOURCE))
    else:
        parts.append(CostPart(STEP_CALLS, "train", None, "s/step", None, _TRAIN_SOURCE,
                              b.unmeasured("train", "no steps between the samples")))
    parts.extend(wrapper_parts)
    parts.extend(sorted(hook_parts, key=lambda p: -(p.value or 0.0)))
    process = _delta(a.process_cpu, b.process_cpu)
    threads_cpu = 0.0
    if b.threads is None:
        parts.append(CostPart("threads", "thread", None, "cores", None, _THREAD_SOURCE,
                              b.unmeasured("threads", "the probe sent no thread CPU times")))
    else:
        before = dict(a.threads or ())
        for name, total in sorted(b.threads, key=lambda x: x[0]):
            spent = max(0.0, total - before.get(name, 0.0))
            threads_cpu += spent
            parts.append(CostPart(name, "thread", spent / wall, "cores",
                                  spent / process if process else None, _THREAD_SOURCE))
    cpu_frac = cores = None
    if b.threads is not None:
        cores = (threads_cpu + (train or 0.0)) / wall
        if process:
            cpu_frac = (threads_cpu + (train or 0.0)) / process
    bound = per_step + threads_cpu / steps if per_step is not None and steps and b.threads is not None else None
    for name, value, unit in (("queue", b.queue_items, "items"), ("viewer queues", b.viewer_bytes, "bytes"),
                              ("backfill", b.backfill_bytes, "bytes")):
        parts.append(CostPart(name, "memory", value, unit, None, _MEMORY_SOURCE,
                              None if value is not None else b.unmeasured(name, "not reported")))
    for name, key, first, last in (("sent", "sent_bytes", a.sent_bytes, b.sent_bytes),
                                   ("recorded", "recorded_bytes", a.recorded_bytes, b.recorded_bytes)):
        moved = _delta(first, last)
        parts.append(CostPart(name, "io", moved / wall if moved is not None else None, "bytes/s", None, _IO_SOURCE,
                              None if moved is not None else b.unmeasured(key, "not reported")))
    return Overhead(rank=rank, seconds=wall, steps=steps or 0, step_frac=step_frac, cpu_frac=cpu_frac,
                    train_per_step_s=per_step, parts=tuple(parts), cores=cores, train_bound_per_step_s=bound)


def finding(view_overhead: Overhead | None) -> dict[str, Any] | None:
    """The ``perfmon_cost`` finding: the probe costs more than its budget, naming the part that
    costs the most (a step hook, the step calls, or a thread); None within budget or unknown."""
    o = view_overhead
    if o is None:
        return None
    train, thread = o.worst()
    if o.step_over and train is not None:
        return {"id": "perfmon_cost", "share": _round(o.step_frac), "part": train.name, "kind": "train",
                "rank": o.rank,
                "message": f"perfmon costs {units.pct(o.step_frac, 1)} of each step on rank {o.rank} "
                           f"(budget {units.pct(STEP_BUDGET)}), most in {train.name} ({train.shown})"}
    if o.cpu_over and thread is not None:
        return {"id": "perfmon_cost", "share": _round(o.cpu_frac), "part": thread.name, "kind": "thread",
                "rank": o.rank,
                "message": f"perfmon uses {units.pct(o.cpu_frac, 1)} of the process's CPU on rank {o.rank} "
                           f"({units.number(o.cores)} cores; budget {units.pct(CPU_BUDGET)}), most in its "
                           f"{thread.name} thread ({thread.shown})"}
    return None


def worst(overheads: Iterable[Overhead | None]) -> Overhead | None:
    """The job's: the rank whose probe costs the largest share of its step (else of its CPU)."""
    known = [o for o in overheads if o is not None]
    return max(known, key=lambda o: (o.step_frac if o.step_frac is not None else -1.0,
                                     o.cpu_frac if o.cpu_frac is not None else -1.0), default=None)


UNKNOWN = "no probe cost in the window (a probe older than wire 1.4, or fewer than two samples)"


def text_lines(o: dict[str, Any] | None) -> list[str]:
    """The report's text section, from its ``overhead`` JSON."""
    if o is None:
        return [f"perfmon cost: {units.NA}: {UNKNOWN}"]
    lines = [f"perfmon cost (rank {o['rank']}, {units.seconds(o['window_s'])}, {o['steps']} steps): "
             f"{units.pct(o['step_frac'], 2)} of the step, {units.pct(o['cpu_frac'], 2)} of the process CPU"]
    if o.get("train_bound_per_step_s") is not None:
        lines.append(f"  training thread {shown('train', 's/step', o['train_per_step_s'])}, at most "
                     f"{shown('train', 's/step', o['train_bound_per_step_s'])} with its GIL waits")
    for p in o["parts"]:
        share = f" ({units.pct(p['share'], 2)})" if p.get("share") is not None else ""
        why = f" ({p['why']})" if p.get("why") else ""
        lines.append(f"  {p['kind']:<6} {p['part']}: {shown(p['kind'], p['unit'], p['value'])}{share}{why}")
    return lines


def _wrapper_parts(a: CostReading, b: CostReading, steps: int | None,
                   step_median: float | None) -> tuple[list[CostPart], float]:
    """The wrappers' parts (s per step) and their seconds between ``a`` and ``b``; one unknown part
    when the probe did not report them."""
    if b.wrappers is None:
        return [CostPart("wrappers", "train", None, "s/step", None, _WRAPPER_SOURCE.format("the cost"),
                         b.unmeasured("wrappers", _WRAPPER_WHY))], 0.0
    before = {name: calls for name, calls, _ in a.wrappers or ()}
    parts, total = [], 0.0
    for name, calls, per_call in b.wrappers:
        made = calls - before.get(name, 0)
        if made <= 0 or not steps:
            continue
        spent = made * per_call
        total += spent
        source = _WRAPPER_SOURCE.format(units.fixed(per_call * 1e6, "µs", digits=2))
        parts.append(_train_part(WRAPPER_PARTS.get(name, f"{name}()"), spent / steps, step_median, source))
    return parts, total


def _train_part(name: str, per_step: float, step_median: float | None, source: str) -> CostPart:
    return CostPart(name, "train", per_step, "s/step", per_step / step_median if step_median else None, source)


def _delta(first: float | int | None, last: float | int | None) -> Any:
    return last - first if first is not None and last is not None and last >= first else None


def _round(x: float | None) -> float | None:
    return round(x, 6) if isinstance(x, float) else x
