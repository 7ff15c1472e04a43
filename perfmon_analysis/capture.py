"""A ``capture`` record (torch.profiler over a few steps) as the viewer shows it. Pure."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from perfmon_analysis.readings import CaptureRecord, capture_record


@dataclass(frozen=True, kw_only=True)
class CaptureSummary(CaptureRecord):
    """The latest capture of one rank: where its trace is and what it says in brief."""

    rank: int

    def as_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "steps": self.steps, "first_step": self.first_step, "last_step": self.last_step,
                "wall_s": self.wall_s, "path": self.path, "device_busy": self.device_busy, "error": self.error,
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
        for op in self.top[:5]:
            out.append(f"  {op.self_s * 1e3:8.2f} ms  {op.calls:>6}x  {op.name}")
        return [line[:width] for line in out]


def capture_reading(rec: dict[str, Any], rank: int) -> CaptureSummary:
    """The capture ``rec`` of ``rank`` (a ``capture`` record, or the report's ``captures`` entry)."""
    reading = capture_record(rec)
    return CaptureSummary(rank=rank, **{f.name: getattr(reading, f.name) for f in fields(reading)})
