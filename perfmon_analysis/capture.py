"""A ``capture`` record (torch.profiler over a few steps) as the viewer shows it. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmon_analysis.readings import num


@dataclass(frozen=True)
class OpTime:
    name: str
    self_s: float
    calls: int


@dataclass(frozen=True)
class CaptureSummary:
    """The latest capture of one rank: where its trace is and what it says in brief."""

    rank: int
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
    top = tuple(OpTime(str(o.get("name"))[:120], num(o.get("self_s")) or 0.0, _int(o.get("calls")) or 0)
                for o in rec.get("top") or [] if isinstance(o, dict))
    gaps = tuple((num(g.get("seconds")) or 0.0, num(g.get("at_s")) or 0.0)
                 for g in rec.get("gaps") or [] if isinstance(g, dict))
    return CaptureSummary(rank=rank, t=num(rec.get("t")) or 0.0, steps=_int(rec.get("steps")) or 0,
                          first_step=_int(rec.get("first_step")), last_step=_int(rec.get("last_step")),
                          wall_s=num(rec.get("wall_s")), path=rec.get("path") if isinstance(rec.get("path"), str) else None,
                          top=top, device_busy=num(rec.get("device_busy")), gaps=gaps,
                          error=rec.get("error") if isinstance(rec.get("error"), str) else None)


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None
