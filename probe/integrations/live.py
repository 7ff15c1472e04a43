"""perfmon's numbers inside the training process, for a trainer's own logging.

A tap on the probe's sender (``Probe.add_tap``) feeds this rank's records into a ``RunModel``
(the viewer's pure model: no UI, no I/O), and every ``EVERY_SECONDS`` the sender thread derives
the window numbers and the verdict from it. The training thread only reads the latest dict.
"""

from __future__ import annotations

import time
from typing import Any

EVERY_SECONDS = 2.0
PREFIX = "perfmon/"


class LiveNumbers:
    def __init__(self, probe: Any) -> None:
        from perfmon_analysis.runmodel import RunModel
        from perfmon_analysis.verdict import VerdictTracker

        self.model = RunModel()
        self.tracker = VerdictTracker()
        self.latest: dict[str, float] = {}
        self.bottleneck: str | None = None
        self.said: set[str] = set()        # verdict ids logged so far: the others are logged as 0
        self._next = 0.0
        probe.add_tap(self._ingest)

    def _ingest(self, rec: dict[str, Any]) -> None:       # sender thread
        self.model.ingest("self", rec)
        now = time.monotonic()
        if rec["k"] == "step" and now >= self._next:
            self._next = now + EVERY_SECONDS
            view = self.model.view()
            verdict = self.tracker.update(view)
            latest = numbers(view, verdict.bottleneck)
            self.said.add(verdict.bottleneck)
            latest.update({f"{PREFIX}bottleneck/{b}": 0.0 for b in self.said if b != verdict.bottleneck})
            self.latest = latest
            self.bottleneck = verdict.bottleneck

    def metrics(self) -> dict[str, float]:
        """``perfmon/...`` keys with numeric values (known ones only), and the verdict as
        ``perfmon/bottleneck/<id>`` = 1.0 (0.0 for those it was before): scalar loggers
        (TensorBoard, Lightning) take no strings."""
        return dict(self.latest)


def numbers(view: Any, bottleneck: str | None) -> dict[str, float]:
    m = view.metrics
    values = {"step_seconds": m.step_time_median_s, "data_wait_ratio": m.data_wait_frac,
              "comm_exposed_ratio": m.comm_exposed_frac, "device_busy_ratio": m.device_busy, "mfu_ratio": m.mfu,
              "ettr_ratio": m.ettr, "samples_per_second": m.samples_per_s, "tokens_per_second": m.tokens_per_s}
    out = {PREFIX + k: float(v) for k, v in values.items() if v is not None}
    if bottleneck:
        out[f"{PREFIX}bottleneck/{bottleneck}"] = 1.0
    return out
