"""The probe's own failures, counted and turned into rate-limited ``warning`` events.

Two ways in: ``FailureReporter.failed(where, exc)`` from code that catches an error
(step hooks, watch hooks, the sender), and ``HealthSource``, a sampler source that reads
the failure counters kept elsewhere (communication tracker errors, NVML call errors,
device-poller clients dropped, zero-code hook errors) and reports their increase.
Either way one ``where`` yields at most one event per ``INTERVAL`` seconds, saying how
many failures it covers, so a hook failing on every step costs one event per 10 s.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

INTERVAL = 10.0     # seconds between two warning events for the same ``where``


class FailureReporter:
    """Counts failures by ``where``; emits ``{"k": "event", "name": "warning", "source": "perfmon", ...}``."""

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        self.emit = emit
        self.counts: dict[str, int] = {}          # where -> failures in all (bounded by the code's call sites)
        self._reported: dict[str, int] = {}       # where -> count covered by an event already
        self._last: dict[str, float] = {}         # where -> time of its last event
        self._lock = threading.Lock()

    def failed(self, where: str, exc: BaseException | None = None, n: int = 1) -> None:
        """Any thread; never raises."""
        try:
            with self._lock:
                self.counts[where] = self.counts.get(where, 0) + n
            self.report(where, exc)
        except Exception:
            pass

    def set_total(self, where: str, total: int) -> None:
        """For counters kept elsewhere: their running total (HealthSource)."""
        with self._lock:
            self.counts[where] = total
        self.report(where, None)

    def report(self, where: str, exc: BaseException | None, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            total = self.counts.get(where, 0)
            new = total - self._reported.get(where, 0)
            if new <= 0 or now - self._last.get(where, -INTERVAL) < INTERVAL:
                return
            self._reported[where] = total
            self._last[where] = now
        detail = f": {exc!r}" if exc is not None else ""
        message = f"perfmon {where} error{detail} ({new} since the last report, {total} in all)"
        self.emit({"k": "event", "t": time.time(), "name": "warning", "source": "perfmon", "where": where,
                   "count": total, "message": message[:300]})

    def flush(self) -> None:
        """Report what the rate limit held back (sampler's last call, at close)."""
        for where in list(self.counts):
            self.report(where, None, now=time.monotonic() + INTERVAL)


class HealthSource:
    """Sampler source: failure counters kept by other parts of the probe -> the reporter."""

    name = "health"

    def __init__(self, probe: Any) -> None:
        self.probe = probe

    def counters(self) -> dict[str, int]:
        out: dict[str, int] = {}
        comm = sys.modules.get("probe.comm")
        state = comm.current() if comm is not None else None
        if state is not None and state.probe is self.probe:
            out["communication tracker"] = int(state.tracker.errors)
        attached = self.probe.attached
        if attached.gpu is not None:
            out["NVML"] = int(attached.gpu.nvml.errors)
        if attached.poller is not None:
            out["device poller (client dropped)"] = int(attached.poller.dropped)
        auto = sys.modules.get("probe.auto")
        zero_code = getattr(auto, "_auto", None) if auto is not None else None
        if zero_code is not None and getattr(zero_code, "probe", None) is self.probe:
            out["zero-code hook"] = int(zero_code.errors)
        return out

    def read(self) -> dict[str, Any]:
        for where, total in self.counters().items():
            if total:
                self.probe.failures.set_total(where, total)
        return {}

    def flush(self) -> None:
        self.read()
        self.probe.failures.flush()
