"""``stall`` records: what the probe saw of a rank that stopped finishing steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfmon_analysis.readings.base import _dicts, _whole, num, wire_dict


# -- stalls (``probe.stall``) ------------------------------------------------------------------
@dataclass(frozen=True)
class InFlight:
    """A collective this rank called and that has not returned."""

    op: str
    group: str
    seq: int | None
    since: float | None


@dataclass(frozen=True)
class FlightEntry:
    """A collective in a rank's flight recorder that the host has not retired."""

    op: str
    group: str
    seq: int | None
    state: str                  # "scheduled" | "started" | "completed" | "enqueued" (start not seen)
    backend: str | None


@dataclass(frozen=True)
class LoaderWorker:
    pid: int | None
    alive: bool
    cpu: float | None           # share of one core since the probe's previous look; None the first time


@dataclass(frozen=True)
class StallReading:
    """One ``stall`` record, typed. ``seconds`` is how long the stall had lasted at ``t``."""

    t: float
    seconds: float
    threshold: float | None
    step: int | None
    where: str                   # "step" | "between" | "loader"
    stack: tuple[str, ...]       # innermost last, "file:line in function"
    inflight: tuple[InFlight, ...]
    seq: dict[str, int]
    loader_waiting: bool
    awaited_pid: int | None
    workers: tuple[LoaderWorker, ...]
    device_pending: bool | None
    flight_source: str | None
    moving: bool | None = None   # its stack changed since the probe's previous look: busy, not hung
    flight: tuple[FlightEntry, ...] = ()
    flight_sources: tuple[str, ...] = ()
    flight_enqueued: dict[str, int] = field(default_factory=dict)   # group -> last enqueued, per the recorder
    flight_note: str | None = None   # why the recorder is empty

    def lasted(self, now: float) -> float:
        """How long the stall has lasted at ``now`` (the rank's probe clock)."""
        return self.seconds + max(0.0, now - self.t)

    @property
    def awaited_worker(self) -> LoaderWorker | None:
        return next((w for w in self.workers if w.pid is not None and w.pid == self.awaited_pid), None)


def stall_reading(rec: dict[str, Any]) -> StallReading | None:
    """Parse a validated ``stall`` record; None if it lacks its time or duration."""
    t, seconds = num(rec.get("t")), num(rec.get("seconds"))
    if t is None or seconds is None:
        return None
    inflight = tuple(InFlight(str(c.get("op") or "collective"), str(c.get("group") or "world"), _whole(c.get("seq")),
                              num(c.get("since")))
                     for c in _dicts(rec.get("inflight")))
    seq = {str(k): v for k, v in (rec.get("seq") or {}).items() if isinstance(v, int) and not isinstance(v, bool)} \
        if isinstance(rec.get("seq"), dict) else {}
    loader = wire_dict(rec.get("loader"))
    device = wire_dict(rec.get("device"))
    flight = wire_dict(rec.get("flight"))
    return StallReading(
        t=t, seconds=seconds, threshold=num(rec.get("threshold")), step=_whole(rec.get("step")),
        where=str(rec.get("where") or "step"),
        stack=tuple(str(f) for f in rec.get("stack") or () if isinstance(f, str)),
        inflight=inflight, seq=seq, loader_waiting=bool(loader.get("waiting")),
        awaited_pid=_whole(loader.get("awaited_pid")),
        workers=tuple(LoaderWorker(_whole(w.get("pid")), bool(w.get("alive")), num(w.get("cpu")))
                      for w in _dicts(loader.get("workers"))),
        device_pending=device.get("pending") if isinstance(device.get("pending"), bool) else None,
        flight_source=str(flight["source"]) if flight.get("source") else None,
        moving=rec["moving"] if isinstance(rec.get("moving"), bool) else None,
        flight=tuple(FlightEntry(str(e.get("op") or "collective"), str(e.get("group") or "world"), _whole(e.get("seq")),
                                 str(e.get("state") or "enqueued"), str(e["backend"]) if e.get("backend") else None)
                     for e in _dicts(flight.get("entries"))),
        flight_sources=tuple(s for s in flight["sources"] if isinstance(s, str))
        if isinstance(flight.get("sources"), list) else (),
        flight_enqueued={str(g): n for g, st in (flight.get("groups") or {}).items() if isinstance(st, dict)
                         and (n := _whole(st.get("enqueued"))) is not None} if isinstance(flight.get("groups"), dict)
        else {},
        flight_note=str(flight["note"]) if flight.get("note") else None,
    )
