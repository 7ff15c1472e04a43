"""perfmon's numbers inside the training process, for a trainer's own logging.

A tap on the probe's sender (``Probe.add_tap``) feeds this rank's records into an ``Analysis``
(the analysis core: no UI, no I/O), and every ``EVERY_SECONDS`` the sender thread takes the
window's numbers and the verdict from it. The keys and values are the metric table's callback
metrics (``perfmon_analysis.metrics``), the same numbers the report and the Prometheus export
show. The training thread only reads the latest dict.
"""

from __future__ import annotations

import time
from typing import Any

EVERY_SECONDS = 2.0


class LiveNumbers:
    def __init__(self, probe: Any) -> None:
        from perfmon_analysis.analysis import Analysis
        from perfmon_analysis.metrics import bottleneck_callback

        self.analysis = Analysis()
        self._flag = bottleneck_callback
        self.latest: dict[str, float] = {}
        self.bottleneck: str | None = None
        self.said: set[str] = set()        # verdict ids logged so far: the others are logged as 0
        self._next = 0.0
        probe.add_tap(self._ingest)

    def _ingest(self, rec: dict[str, Any]) -> None:       # sender thread
        self.analysis.ingest("self", rec)
        now = time.monotonic()
        if rec["k"] == "step" and now >= self._next:
            self._next = now + EVERY_SECONDS
            snapshot = self.analysis.snapshot(steady=True)
            bottleneck = snapshot.verdict.bottleneck
            latest = self.analysis.callback_numbers(snapshot)
            latest[self._flag(bottleneck)] = 1.0
            self.said.add(bottleneck)
            latest.update({self._flag(b): 0.0 for b in self.said if b != bottleneck})
            self.latest = latest
            self.bottleneck = bottleneck

    def metrics(self) -> dict[str, float]:
        """``perfmon/...`` keys with numeric values (known ones only), and the verdict as
        ``perfmon/bottleneck/<id>`` = 1.0 (0.0 for those it was before): scalar loggers
        (TensorBoard, Lightning) take no strings."""
        return dict(self.latest)
