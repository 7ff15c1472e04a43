"""A ``capture`` record (torch.profiler over a few steps) as the viewer shows it. Pure."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from perfmon_analysis import units
from perfmon_analysis.profile import window_cost
from perfmon_analysis.readings import CaptureRecord, capture_record, num

__all__ = ["CaptureSummary", "capture_reading", "with_cost"]


@dataclass(frozen=True, kw_only=True)
class CaptureSummary(CaptureRecord):
    """The latest capture of one rank: where its trace is and what it says in brief."""

    rank: int
    overhead: float | None = None          # captured steps' mean time / the median before - 1
    baseline_step_s: float | None = None
    captured_step_s: float | None = None

    @property
    def train_per_step_s(self) -> float | None:
        """The capture's training-thread cost per step: captured steps' mean - the median before."""
        if self.captured_step_s is None or self.baseline_step_s is None:
            return None
        return self.captured_step_s - self.baseline_step_s

    def as_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "steps": self.steps, "first_step": self.first_step, "last_step": self.last_step,
                "wall_s": self.wall_s, "path": self.path, "device_busy": self.device_busy, "error": self.error,
                "overhead": self.overhead, "baseline_step_s": self.baseline_step_s,
                "captured_step_s": self.captured_step_s, "train_per_step_s": self.train_per_step_s,
                "thread_cpu_s": self.thread_cpu_s,
                "top": [{"name": o.name, "self_s": o.self_s, "calls": o.calls} for o in self.top],
                "gaps": [{"seconds": g, "at_s": at} for g, at in self.gaps]}

    def lines(self, width: int = 80) -> list[str]:
        """A few lines for the report and the TUI."""
        head = f"rank {self.rank}: steps {self.first_step}-{self.last_step}"
        if self.error:
            return [f"{head}: {self.error}"[:width]]
        out = [f"{head} -> {self.path}"]
        if self.device_busy is not None:
            out.append(f"  device busy {self.device_busy * 100:.0f}% of the captured steps"
                       + (f"; longest idle {self.gaps[0][0] * 1e3:.1f} ms" if self.gaps else ""))
        if self.overhead is not None:      # wrapped, not cut: its last figure is the thread's CPU
            out.extend(textwrap.wrap(f"  cost: captured steps took {units.seconds(self.captured_step_s)} against "
                                     f"{units.seconds(self.baseline_step_s)} before ({units.pct(self.overhead)})"
                                     + (f"; its own thread used {units.seconds(self.thread_cpu_s)} CPU"
                                        if self.thread_cpu_s is not None else ""), width, subsequent_indent="    "))
        for op in self.top[:5]:
            out.append(f"  {op.self_s * 1e3:8.2f} ms  {op.calls:>6}x  {op.name}")
        return [line[:width] for line in out]


def capture_reading(rec: dict[str, Any], rank: int) -> CaptureSummary:
    """The capture ``rec`` of ``rank`` (a ``capture`` record, or the report's ``captures`` entry)."""
    reading = capture_record(rec)
    return CaptureSummary(rank=rank, **{f.name: getattr(reading, f.name) for f in fields(reading)},
                          overhead=num(rec.get("overhead")), baseline_step_s=num(rec.get("baseline_step_s")),
                          captured_step_s=num(rec.get("captured_step_s")))


def with_cost(capture: CaptureSummary, steps: Iterable[tuple[int, float]]) -> CaptureSummary:
    """The capture with its measured cost: its steps' mean time against the median before it."""
    cost = window_cost(capture.first_step, capture.last_step, steps)
    if cost is None:
        return capture
    overhead, base, mean = cost
    return replace(capture, overhead=overhead, baseline_step_s=base, captured_step_s=mean)
