"""``capture`` and ``profile`` records: a torch.profiler capture and a per-module profile answered on request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmon_analysis.readings.base import _dicts, _nonneg, _pos, _text, _whole, num


# -- torch.profiler captures ------------------------------------------------------------------
@dataclass(frozen=True)
class OpTime:
    name: str
    self_s: float
    calls: int


@dataclass(frozen=True)
class CaptureRecord:
    """A ``capture`` record: where the rank's trace is and what it says in brief."""

    t: float
    steps: int
    first_step: int | None
    last_step: int | None
    wall_s: float | None
    path: str | None               # on the rank's host
    top: tuple[OpTime, ...]        # by self time (device time on GPU)
    device_busy: float | None      # GPU only: kernel time over the captured wall time
    gaps: tuple[tuple[float, float], ...]   # GPU only: (idle seconds, at seconds from the first kernel)
    error: str | None = None
    thread_cpu_s: float | None = None      # CPU s of the thread that wrote it (wire 1.4 ``cost``)


def capture_record(rec: dict[str, Any]) -> CaptureRecord:
    top = tuple(OpTime(str(o.get("name"))[:120], num(o.get("self_s")) or 0.0, _whole(o.get("calls")) or 0)
                for o in _dicts(rec.get("top")))
    gaps = tuple((num(g.get("seconds")) or 0.0, num(g.get("at_s")) or 0.0) for g in _dicts(rec.get("gaps")))
    return CaptureRecord(t=num(rec.get("t")) or 0.0, steps=_whole(rec.get("steps")) or 0,
                         first_step=_whole(rec.get("first_step")), last_step=_whole(rec.get("last_step")),
                         wall_s=num(rec.get("wall_s")), path=_text(rec.get("path")), top=top,
                         device_busy=num(rec.get("device_busy")), gaps=gaps, error=_text(rec.get("error")),
                         thread_cpu_s=window_cpu(rec))


def window_cpu(rec: dict[str, Any]) -> float | None:
    """A profile's or capture's own thread CPU s: the record's ``cost`` (wire 1.4), or the report's
    entry for it, which has it at the top (read back by the text and HTML reports)."""
    cost = rec.get("cost")
    return _nonneg(cost.get("thread_cpu_s") if isinstance(cost, dict) else rec.get("thread_cpu_s"))


# -- module profiles (``probe.module_profile``) ---------------------------------------------
@dataclass(frozen=True)
class ModuleTimes:
    """One module of a ``profile`` record, per step; None = not measured (never negative)."""

    name: str                   # dotted path; "" is the model itself
    type: str | None
    depth: int
    params: int
    calls: float | None
    flops: float | None         # forward + backward
    fwd_flops: float | None
    fwd_s: float | None
    bwd_s: float | None


@dataclass(frozen=True)
class ProfileRecord:
    """A ``profile`` record: the modules' raw per-step seconds and FLOPs and how they were taken."""

    t: float
    steps: int
    first_step: int | None
    last_step: int | None
    depth: int
    step_s: float | None
    timer: str | None
    peak_flops: float | None
    peak_source: str | None
    modules: tuple[ModuleTimes, ...]
    flops_note: str | None
    error: str | None
    truncated: bool
    thread_cpu_s: float | None = None    # CPU s of the thread that built it (wire 1.4 ``cost``)


def profile_record(rec: dict[str, Any]) -> ProfileRecord:
    """A ``profile`` record (validated by the wire; odd values become unknown)."""
    modules = tuple(ModuleTimes(
        name=m["name"], type=_text(m.get("type")), depth=_whole(m.get("depth")) or 0,
        params=_whole(m.get("params")) or 0,
        calls=_nonneg(m.get("calls")), flops=_nonneg(m.get("flops")), fwd_flops=_nonneg(m.get("fwd_flops")),
        fwd_s=_nonneg(m.get("fwd_s")), bwd_s=_nonneg(m.get("bwd_s")))
        for m in _dicts(rec.get("modules")) if isinstance(m.get("name"), str))
    return ProfileRecord(
        t=num(rec.get("t")) or 0.0, steps=_whole(rec.get("steps")) or 0, first_step=_whole(rec.get("first_step")),
        last_step=_whole(rec.get("last_step")), depth=_whole(rec.get("depth")) or 0, step_s=_pos(rec.get("step_s")),
        timer=_text(rec.get("timer")), peak_flops=_pos(rec.get("peak_flops")),
        peak_source=_text(rec.get("peak_source")),
        modules=modules, flops_note=_text(rec.get("flops_note")), error=_text(rec.get("error")),
        truncated=rec.get("truncated") is True, thread_cpu_s=window_cpu(rec))
