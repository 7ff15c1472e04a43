"""A module profile read from a ``profile`` record: the tree, shares, rates and the marked row.

Pure. The probe sends raw per-step seconds and FLOPs per module (``probe.module_profile``);
here they become what a FLOPs profiler (DeepSpeed's) shows: per row params, FLOPs
and their share of the model's, forward and backward time and their share of the step,
achieved FLOP/s and its fraction of peak; forward and backward FLOP/s of the whole model.

**The marked row** is the module whose slowness costs the most: for each row its own part
(its time and FLOPs minus those of its profiled children, so a container is not blamed for
what its children do) is compared with the fastest own rate among the rows, and the time it
would save at that rate, ``own time × (1 − own rate / best rate)``, decides. Rows without
FLOPs of their own (activations, containers) are not candidates: the mark is about FLOP/s.
A row is marked only when that time is at least ``MARK_MIN_SHARE`` of the step.
"""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from perfmon_analysis import units
from perfmon_analysis.readings import ModuleTimes, profile_record

__all__ = ["MARK_MIN_SHARE", "ModuleProfile", "profile_lines", "profile_reading", "window_cost", "with_overhead"]

DEFAULT_TOP = 25

MARK_MIN_SHARE = 0.02
OVERHEAD_BASELINE_STEPS = 20     # steps before the profile its overhead is measured against


@dataclass(frozen=True)
class ProfileRow:
    """One module. Seconds and FLOPs are per step; None = unknown."""

    name: str                     # dotted path; the root is its class name
    type: str
    depth: int
    params: int
    calls: float                  # forward calls per step
    flops: float | None           # forward + backward
    fwd_s: float | None
    bwd_s: float | None
    time_share: float | None      # (fwd + bwd) / step time
    flop_share: float | None      # of the model's FLOPs
    flops_per_s: float | None
    peak_frac: float | None
    own_waste_s: float | None = None   # what its own part would save at the best rate (the mark)
    marked: bool = False

    @property
    def seconds(self) -> float | None:
        if self.fwd_s is None or self.bwd_s is None:
            return None
        return self.fwd_s + self.bwd_s


@dataclass(frozen=True)
class ModuleProfile:
    """The latest profile of one rank, ready to show."""

    rank: int
    t: float
    steps: int
    first_step: int | None
    last_step: int | None
    depth: int
    step_s: float | None
    timer: str | None
    peak_flops: float | None
    peak_source: str | None
    fwd_flops_per_s: float | None
    bwd_flops_per_s: float | None
    rows: tuple[ProfileRow, ...]          # tree order, siblings by time (largest first)
    flops_note: str | None = None          # why FLOPs are missing
    error: str | None = None               # why the profile failed
    truncated: bool = False
    overhead: float | None = None          # profiled steps' mean time / the steps before, − 1
    baseline_step_s: float | None = None   # median step before the profile
    profiled_step_s: float | None = None   # mean step time of the profiled steps (step records)
    thread_cpu_s: float | None = None      # CPU s of the probe thread that built the result

    @property
    def train_per_step_s(self) -> float | None:
        """The profile's training-thread cost per step: profiled steps' mean - the median before."""
        if self.profiled_step_s is None or self.baseline_step_s is None:
            return None
        return self.profiled_step_s - self.baseline_step_s

    @property
    def marked(self) -> ProfileRow | None:
        return next((r for r in self.rows if r.marked), None)

    def citation(self) -> str | None:
        """'slow: 48% of the step at 18 GFLOP/s (4% of peak)', for the verdict; None without a mark."""
        row = self.marked
        if row is None or row.time_share is None:
            return None
        rate = _flops_rate(row.flops_per_s)
        peak = f" ({row.peak_frac * 100:.0f}% of peak)" if row.peak_frac is not None else ""
        return f"{row.name}: {row.time_share * 100:.0f}% of the step at {rate}{peak}"

    def as_json(self) -> dict[str, Any]:
        """The report's ``profile`` object."""
        return {
            "rank": self.rank, "steps": self.steps, "first_step": self.first_step, "last_step": self.last_step,
            "depth": self.depth, "step_s": _r(self.step_s), "timer": self.timer,
            "fwd_flops_per_s": _r(self.fwd_flops_per_s), "bwd_flops_per_s": _r(self.bwd_flops_per_s),
            "peak_flops": self.peak_flops, "peak_source": self.peak_source, "overhead": _r(self.overhead),
            "baseline_step_s": _r(self.baseline_step_s), "profiled_step_s": _r(self.profiled_step_s),
            "train_per_step_s": _r(self.train_per_step_s), "thread_cpu_s": _r(self.thread_cpu_s),
            "marked": self.marked.name if self.marked else None, "flops_note": self.flops_note,
            "error": self.error, "truncated": self.truncated,
            "modules": [{"name": r.name, "type": r.type, "depth": r.depth, "params": r.params, "calls": _r(r.calls),
                         "flops": r.flops, "fwd_s": _r(r.fwd_s), "bwd_s": _r(r.bwd_s),
                         "time_share": _r(r.time_share), "flop_share": _r(r.flop_share),
                         "flops_per_s": _r(r.flops_per_s), "peak_frac": _r(r.peak_frac), "marked": r.marked}
                        for r in self.rows],
        }


def profile_reading(rec: dict[str, Any], rank: int) -> ModuleProfile:
    """The module profile a ``profile`` record of ``rank`` says, ready to show."""
    prof = profile_record(rec)
    step_s, peak = prof.step_s, prof.peak_flops
    raw = _containers_filled(list(prof.modules))
    root = next((m for m in raw if m.name == ""), None)
    rows = [_row(m, step_s, root.flops if root else None, peak) for m in raw]
    rows = _mark(_tree_order(rows), step_s)
    fwd_rate = bwd_rate = None
    if root is not None:
        if root.fwd_flops is not None and root.fwd_s:
            fwd_rate = root.fwd_flops / root.fwd_s
        if root.flops is not None and root.fwd_flops is not None and root.bwd_s:
            bwd_rate = (root.flops - root.fwd_flops) / root.bwd_s
    return ModuleProfile(
        rank=rank, t=prof.t, steps=prof.steps, first_step=prof.first_step, last_step=prof.last_step,
        depth=prof.depth, step_s=step_s, timer=prof.timer, peak_flops=peak, peak_source=prof.peak_source,
        fwd_flops_per_s=fwd_rate, bwd_flops_per_s=bwd_rate, rows=tuple(rows), flops_note=prof.flops_note,
        error=prof.error, truncated=prof.truncated, thread_cpu_s=prof.thread_cpu_s)


def with_overhead(profile: ModuleProfile, steps: Iterable[tuple[int, float]]) -> ModuleProfile:
    """The profile with its measured cost: the profiled steps' mean time (from the step records)
    against the median of the ``OVERHEAD_BASELINE_STEPS`` steps before it. Unknown when either
    side is not in ``steps`` (step number, seconds)."""
    cost = window_cost(profile.first_step, profile.last_step, steps)
    if cost is None:
        return profile
    overhead, base, mean = cost
    return replace(profile, overhead=overhead, baseline_step_s=base, profiled_step_s=mean)


def window_cost(first: int | None, last: int | None,
                steps: Iterable[tuple[int, float]]) -> tuple[float | None, float, float] | None:
    """(the window's steps' mean time / the median before it - 1, that median, that mean) for steps
    ``first``..``last`` (a profile's or a capture's); None when either side is not in ``steps``."""
    if first is None or last is None:
        return None
    steps = list(steps)
    before = [d for s, d in steps if first - OVERHEAD_BASELINE_STEPS <= s < first]
    inside = [d for s, d in steps if first <= s <= last]
    if not before or len(inside) < last - first + 1:
        return None
    base = statistics.median(before)
    mean = sum(inside) / len(inside)
    return (mean / base - 1.0 if base > 0 else None), base, mean


def _row(m: ModuleTimes, step_s: float | None, root_flops: float | None, peak: float | None) -> ProfileRow:
    seconds = m.fwd_s + m.bwd_s if m.fwd_s is not None and m.bwd_s is not None else None
    rate = m.flops / seconds if m.flops is not None and seconds else None
    return ProfileRow(
        name=m.name or m.type or "model", type=m.type or "?", depth=m.depth, params=m.params, calls=m.calls or 0.0,
        flops=m.flops, fwd_s=m.fwd_s, bwd_s=m.bwd_s,
        time_share=seconds / step_s if seconds is not None and step_s else None,
        flop_share=m.flops / root_flops if m.flops is not None and root_flops else None, flops_per_s=rate,
        peak_frac=rate / peak if rate is not None and peak else None)


def profile_lines(p: dict[str, Any], width: int = 80, top: int | None = DEFAULT_TOP) -> list[str]:
    """The profile as text: a header with forward and backward FLOP/s, then the module tree."""
    if p.get("error"):
        return [f"Profile failed: {p['error']}"]
    peak = p.get("peak_flops")
    head = (f"Module profile of rank {p['rank']}, steps {p.get('first_step')}-{p.get('last_step')} "
            f"({p['steps']} steps, {units.seconds(p.get('step_s'))} each while profiled, timer {p.get('timer')})")
    rates = (f"forward {_flops_rate(p.get('fwd_flops_per_s'))}, backward {_flops_rate(p.get('bwd_flops_per_s'))}"
             + (f" against a {_flops_rate(peak)} peak ({p.get('peak_source')})" if peak else ", no peak known "
                "(PERFMON_PEAK_TFLOPS gives one)"))
    lines = [head, rates]
    if p.get("overhead") is not None:
        lines.append(f"Cost: profiled steps took {units.seconds(p.get('profiled_step_s'))} against "
                     f"{units.seconds(p.get('baseline_step_s'))} before ({p['overhead'] * 100:+.0f}%); "
                     "steps outside the profile run no hook"
                     + (f"; its own thread used {units.seconds(p['thread_cpu_s'])} CPU"
                        if p.get("thread_cpu_s") is not None else ""))
    if p.get("flops_note"):
        lines.append(f"FLOPs: {p['flops_note']}")
    if p.get("marked"):
        row = next(r for r in p["modules"] if r["name"] == p["marked"])
        lines.append(f"Marked ▶ {row['name']}: {units.pct(row['time_share'])} of the step at "
                     f"{_flops_rate(row['flops_per_s'])}" + (f" ({units.pct(row['peak_frac'])} of peak)"
                                                           if row.get("peak_frac") is not None else ""))
    lines.append("")
    lines.append(f"  {'MODULE':<21} {'PARAMS':>6} {'FLOPS':>7} {'%FLOP':>5} {'FWD':>7} {'BWD':>7} {'%STEP':>5} "
                 f"{'FLOP/S':>7} {'%PEAK':>5}")
    rows = _top(p["modules"], top)
    for r in rows:
        name = "  " * r["depth"] + r["name"].rpartition(".")[2] if r["depth"] else r["name"]
        mark = "▶" if r.get("marked") else " "
        lines.append(f"{mark} {name[:21]:<21} {units.count(r['params']):>6} {units.count(r.get('flops')):>7} "
                     f"{units.pct(r.get('flop_share')):>5} {units.seconds(r.get('fwd_s')):>7} "
                     f"{units.seconds(r.get('bwd_s')):>7} {units.pct(r.get('time_share')):>5} "
                     f"{units.count(r.get('flops_per_s')):>7} {units.pct(r.get('peak_frac')):>5}")
    if len(rows) < len(p["modules"]):
        lines.append(f"  ({len(p['modules']) - len(rows)} more modules; --top N shows more, --json all)")
    if p.get("truncated"):
        lines.append("  (the profile was truncated: too many modules or calls to time them all)")
    head_end = lines.index("")
    wrapped = [w for line in lines[:head_end] for w in textwrap.wrap(line, width, subsequent_indent="  ")]
    return wrapped + [line[:width] for line in lines[head_end:]]


def _top(rows: list[dict[str, Any]], k: int | None) -> list[dict[str, Any]]:
    """The ``k`` rows with the most time and their ancestors, in the tree order given."""
    if k is None or k >= len(rows):
        return rows
    timed = sorted(rows, key=lambda r: -((r.get("fwd_s") or 0.0) + (r.get("bwd_s") or 0.0)))[:k]
    names = {r["name"] for r in timed}
    for r in timed:
        parts = r["name"].split(".")
        names.update(".".join(parts[:n]) for n in range(1, len(parts)))
    return [r for r in rows if r["name"] in names or r["depth"] == 0]


def _containers_filled(raw: list[ModuleTimes]) -> list[ModuleTimes]:
    """A container its parent never calls (``nn.ModuleList``, ``ModuleDict``: the parent calls the
    children directly) has no time of its own; it gets the sums of its children's, so the tree
    adds up and the parent's own part is not blamed for them."""
    kids: dict[str, list[ModuleTimes]] = {}
    for m in raw:
        if m.name:
            kids.setdefault(m.name.rpartition(".")[0], []).append(m)
    out = {m.name: m for m in raw}
    ran = {m.name for m in raw if m.calls}     # filled containers join it, deepest first
    for m in sorted(raw, key=lambda m: -m.depth):
        children = [out[c.name] for c in kids.get(m.name, [])]
        if m.name in ran or not any(c.name in ran for c in children):
            continue
        ran.add(m.name)
        out[m.name] = replace(m, fwd_s=_total(c.fwd_s for c in children), bwd_s=_total(c.bwd_s for c in children),
                              flops=_total(c.flops for c in children), fwd_flops=_total(c.fwd_flops for c in children))
    return [out[m.name] for m in raw]


def _total(values: Iterable[float | None]) -> float | None:
    """The sum, unknown when any part is."""
    values = list(values)
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _flops_rate(value: float | None) -> str:
    return units.rate(value, "FLOP")


def _children(rows: list[ProfileRow]) -> dict[str, list[ProfileRow]]:
    """Each row's profiled children, by the parent's name (the root's name is its class name)."""
    root = next((r.name for r in rows if r.depth == 0), None)
    kids: dict[str, list[ProfileRow]] = {}
    for r in rows:
        if r.depth == 0:
            continue
        parent = r.name.rpartition(".")[0] if r.depth > 1 else root
        if parent is not None:
            kids.setdefault(parent, []).append(r)
    return kids


def _tree_order(rows: list[ProfileRow]) -> list[ProfileRow]:
    kids = _children(rows)
    ordered: list[ProfileRow] = []

    def walk(row: ProfileRow) -> None:
        ordered.append(row)
        for child in sorted(kids.get(row.name, []), key=lambda r: -(r.seconds or 0.0)):
            walk(child)

    for root in (r for r in rows if r.depth == 0):
        walk(root)
    seen = {id(r) for r in ordered}
    return ordered + [r for r in rows if id(r) not in seen]   # orphans (a truncated profile) last


def _mark(rows: list[ProfileRow], step_s: float | None) -> list[ProfileRow]:
    kids = _children(rows)
    own: dict[str, tuple[float, float]] = {}
    for r in rows:
        if r.seconds is None or r.flops is None:
            continue
        children = kids.get(r.name, [])
        if any(c.seconds is None or c.flops is None for c in children):
            continue
        t = r.seconds - sum(c.seconds or 0.0 for c in children)
        f = r.flops - sum(c.flops or 0.0 for c in children)
        if t > 0 and f > 0:
            own[r.name] = (t, f)
    if len(own) < 2 or not step_s:
        return rows
    best = max(f / t for t, f in own.values())
    waste = {name: t * (1.0 - (f / t) / best) for name, (t, f) in own.items()}
    worst = max(waste, key=lambda n: waste[n])
    out = []
    for r in rows:
        if r.name in waste:
            r = replace(r, own_waste_s=waste[r.name],
                        marked=r.name == worst and waste[worst] >= MARK_MIN_SHARE * step_s)
        out.append(r)
    return out


def _r(x: Any) -> Any:
    return round(x, 6) if isinstance(x, float) else x


